"""PrioritizedTrainer: a Hugging Face Trainer whose training batches come from a PrioritizedSampler.

A tiny BERT (2 layers, hidden 64), randomly initialised from a `BertConfig` (nothing is downloaded), learns a
synthetic tokenizer-free task: a sequence of 16 token ids is labelled 1 when it holds more "positive" ids
(2..33) than "negative" ones (34..65), and ``--label-noise`` of the training labels are flipped. The Trainer
is the stock one but for two hooks: its train DataLoader draws batches from the sampler, and `compute_loss`
feeds each example's loss back and returns the importance-weighted mean. Evaluation is unchanged.

    python examples/hf_trainer.py                 # 100 steps, a few seconds of training
    python examples/hf_trainer.py --alpha 0       # the same Trainer with uniform draws

Prints the evaluation accuracy before and after training, and where the sampler's weight went (flipped
training labels keep a high loss, so a loss-prioritized sampler draws them more often: the price of this rule).
"""
import argparse
import tempfile
import time

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification, TrainingArguments

from replayloader import PrioritizedSampler
from replayloader.torch import PrioritizedTrainer

VOCAB, LENGTH, CLS = 66, 16, 1  # ids 0 (padding) and 1 ([CLS]) are special


def make_examples(n: int, rng: np.random.Generator, label_noise: float = 0.0):
    """A list of dicts of tensors (any map-style dataset of dicts works), and which labels were flipped."""
    ids = rng.integers(2, VOCAB, size=(n, LENGTH))
    ids[:, 0] = CLS
    labels = ((ids[:, 1:] < 34).sum(1) > (ids[:, 1:] >= 34).sum(1)).astype(np.int64)
    flipped = rng.random(n) < label_noise
    labels[flipped] = 1 - labels[flipped]
    return [{"input_ids": torch.tensor(row), "attention_mask": torch.ones(LENGTH, dtype=torch.long),
             "labels": torch.tensor(label)} for row, label in zip(ids, labels)], flipped


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--train-size", type=int, default=512)
    parser.add_argument("--alpha", type=float, default=1.0, help="priority exponent (0: uniform draws)")
    parser.add_argument("--label-noise", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    train, flipped = make_examples(args.train_size, rng, args.label_noise)
    test, _ = make_examples(512, rng)

    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=LENGTH, num_labels=2)
    model = BertForSequenceClassification(config)  # random weights: no download
    sampler = PrioritizedSampler(len(train), batch_size=args.batch_size, alpha=args.alpha, beta=0.5,
                                 uniform_fraction=0.1, seed=args.seed)
    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(output_dir=output_dir, max_steps=args.steps, learning_rate=args.lr,
                                          warmup_steps=args.steps // 10, logging_steps=max(args.steps // 3, 1),
                                          save_strategy="no", report_to="none", use_cpu=True,
                                          disable_tqdm=True, seed=args.seed)
        trainer = PrioritizedTrainer(model=model, args=training_args, train_dataset=train, sampler=sampler)

        def accuracy() -> float:
            predicted = trainer.predict(test)
            return float((predicted.predictions.argmax(-1) == predicted.label_ids).mean())

        before = accuracy()
        started = time.perf_counter()
        trainer.train()  # batch size: the sampler's (the per-device batch size is not used)
        seconds = time.perf_counter() - started
        after = accuracy()

    weights = sampler.weights
    flipped_share = float(weights[flipped].sum() / weights.sum())
    print(f"alpha {args.alpha}: {trainer.state.global_step} steps of {args.batch_size} in {seconds:.1f} s; "
          f"test accuracy {before:.3f} -> {after:.3f}")
    print(f"sampler: epoch {sampler.epoch}, {sampler.stats()['drawn']} draws; the {flipped.mean():.0%} flipped "
          f"training labels hold {flipped_share:.0%} of the weight")
    return {"accuracy_before": before, "accuracy": after, "steps": trainer.state.global_step,
            "flipped_weight_share": flipped_share, "seconds": seconds}


if __name__ == "__main__":
    main()
