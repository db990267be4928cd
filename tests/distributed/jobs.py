"""What every rank runs in the distributed tests: ``python jobs.py OUT JOB [JOB...]`` under a launcher.

Each job returns a JSON-able dict; rank r writes ``OUT/report-r.json`` with one entry per job.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

HF_EXAMPLES = 80
HF_BATCH = 8  # the global batch: 4 per rank on 2 ranks


# ----------------------------------------------------------------------------- Hugging Face Trainer
class IndexedTexts(torch.utils.data.Dataset):
    """Tiny token sequences whose dataset index travels with the batch, so a rank can check which examples it got."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 50, (n, 8), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(8, dtype=torch.long), "labels": self.labels[i],
                "index": torch.tensor(i)}


def hf_trainer(out: Path) -> dict:
    """`PrioritizedTrainer` for 2 epochs (the warm-up pass, then a prioritized one). Per step: the dataset indices
    of the batch the rank trained on, and the indices its feedback was given for; at the end the weights."""
    from transformers import BertConfig, BertForSequenceClassification, TrainingArguments

    from replayloader import PrioritizedSampler
    from replayloader.hf_trainer import PrioritizedTrainer

    seen: list[list[int]] = []
    fed: list[list[int]] = []

    class ObservedTrainer(PrioritizedTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            inputs = dict(inputs)
            seen.append(inputs.pop("index").tolist())
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, num_labels=2)
    model = BertForSequenceClassification(config)
    args = TrainingArguments(output_dir=str(out / "hf"), num_train_epochs=2, learning_rate=1e-3, use_cpu=True,
                             report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             ddp_backend="gloo", seed=0)
    sampler = PrioritizedSampler(HF_EXAMPLES, batch_size=HF_BATCH, beta=0.5, uniform_fraction=0.1, seed=0)
    trainer = ObservedTrainer(model=model, args=args, train_dataset=IndexedTexts(HF_EXAMPLES), sampler=sampler)
    update = trainer.batch_sampler.update

    def observed_update(batch, **feedback):
        fed.append(np.asarray(batch.indices).tolist())
        return update(batch, **feedback)

    trainer.batch_sampler.update = observed_update
    trainer.train()
    return {"seen": seen, "fed": fed, "weights": sampler.weights.tolist(), "visits": sampler.visits.tolist()}


JOBS = {"hf_trainer": hf_trainer}


def main() -> None:
    out, names = Path(sys.argv[1]), sys.argv[2:]
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", 0))
    report = {name: JOBS[name](out) for name in names}
    (out / f"report-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
