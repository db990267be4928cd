"""What every rank runs in the mixing DDP test: ``python tests/mixing/jobs.py OUT JOB [JOB...]`` under torchrun.

Each job returns a JSON-able dict; rank r writes ``OUT/report-r.json`` with one entry per job.
"""
from __future__ import annotations

import datetime
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from replayloader.distributed import load_shared_state, save_shared_state, shutdown, state_digest
from replayloader.torch.mixing import MixtureBatchSampler


def ensure_group() -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))


def error_of(action) -> str | None:
    try:
        action()
    except Exception as exc:  # reported, compared by the test
        return f"{type(exc).__name__}: {exc}"
    return None


def mixture(out: Path) -> dict:
    """The scenario uninterrupted (checkpoint at SAVE_AT), resumed from that checkpoint, bad feedback, and a
    sampler built differently on one rank."""
    from tests.mixing import scenario as sc

    ensure_group()
    batches = MixtureBatchSampler(sc.make())

    def save(count: int) -> None:
        if count == sc.SAVE_AT:
            save_shared_state(batches.state_dict(), out / "two_ranks.npz")

    report = {"uninterrupted": sc.train(batches, sc.TOTAL, on_step=save),
              "probabilities": batches.mixture.probabilities().tolist(),
              "digest": state_digest(batches.mixture.state_dict())}
    resumed = MixtureBatchSampler(sc.make())
    resumed.load_state_dict(load_shared_state(out / "two_ranks.npz"))
    report["resumed"] = sc.train(resumed, sc.TOTAL - sc.SAVE_AT)

    bad = MixtureBatchSampler(sc.make())
    whole = bad.mixture.next_batch()
    mine = whole.share(dist.get_rank(), 2)
    before = state_digest(bad.mixture.state_dict())
    losses = sc.loss_of(mine.indices, 0)
    if dist.get_rank() == 1:
        losses[2] = np.nan
    report["bad_feedback"] = error_of(lambda: bad.feedback(mine.indices, loss=losses))
    report["bad_unchanged"] = state_digest(bad.mixture.state_dict()) == before
    report["mismatch"] = error_of(lambda: MixtureBatchSampler(sc.make(seed=3 + dist.get_rank())))
    return report


def docs(out: Path) -> dict:
    """The DDP block of docs/mixing.md, as written, in ``out``."""
    from tests.docs_blocks import block

    namespace: dict = {"__name__": "__main__"}
    here = os.getcwd()
    os.chdir(out)
    ensure_group()  # the block's `session` leaves a group it did not start as it found it
    try:
        exec(compile(block("docs/mixing.md", "## Several GPUs (DDP)"), "docs mixing DDP example", "exec"), namespace)
    finally:
        os.chdir(here)
    return {"probabilities": namespace["sampler"].probabilities().tolist(),
            "feedback_calls": namespace["sampler"].stats()["feedback_calls"],
            "parameters": torch.cat([p.detach().reshape(-1) for p in namespace["model"].parameters()]).tolist()}


def hf(out: Path) -> dict:
    """MixingTrainer on 2 ranks: 6 steps of a global batch of 8, a checkpoint at step 4."""
    from transformers import BertConfig, BertForSequenceClassification, TrainingArguments

    from replayloader.mixing import ODM, MixtureSampler
    from replayloader.torch.mixing_trainer import MixingTrainer

    ensure_group()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 20, (48, 8), generator=g)
    labels = torch.randint(0, 2, (48,), generator=g)
    train = [{"input_ids": ids[i], "attention_mask": torch.ones(8, dtype=torch.long), "labels": labels[i]}
             for i in range(48)]
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=32,
                                                     max_position_embeddings=16, num_labels=2))
    args = TrainingArguments(output_dir=str(out / "hf"), max_steps=6, save_steps=4, learning_rate=1e-2,
                             use_cpu=True, report_to=[], logging_strategy="no", disable_tqdm=True, ddp_backend="gloo",
                             seed=0)
    sampler = MixtureSampler.from_labels(np.repeat([0, 1, 2], 16), batch_size=8, rule=ODM(), seed=0)
    seen: list = []

    class Observed(MixingTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if model.training:
                seen.append(inputs["index"].tolist())
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    Observed(model=model, args=args, train_dataset=train, sampler=sampler).train()
    return {"seen": seen, "probabilities": sampler.probabilities().tolist(),
            "digest": state_digest(sampler.state_dict()), "feedback_calls": sampler.stats()["feedback_calls"]}


JOBS = {"mixture": mixture, "docs": docs, "hf": hf}


def main() -> None:
    out, names = Path(sys.argv[1]), sys.argv[2:]
    torch.set_num_threads(1)
    if "hf" in names and importlib.util.find_spec("transformers") is None:
        names.remove("hf")
    report = {name: JOBS[name](out) for name in names}
    (out / f"report-{dist.get_rank()}.json").write_text(json.dumps(report))
    shutdown()  # barrier, destroy, gloo's workers parked: no abort at exit


if __name__ == "__main__":
    main()
