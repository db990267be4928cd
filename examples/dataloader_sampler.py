"""PrioritizedSampler inside a torch DataLoader: a fixed dataset, batches drawn by learned importance.

scikit-learn's bundled digits (8x8 images, 10 classes) train a small MLP. The DataLoader's batches come from a
`PrioritizedBatchSampler` around a `PrioritizedSampler`: the first epoch is a shuffled pass, after which each
example is drawn with probability ~ its latest loss (mixed with 10% uniform draws). The loss is weighted by the
importance weights (P_min / P_i)^beta, beta annealed to 1, and each batch's per-example losses go back to the
sampler through the batch sampler.

    python examples/dataloader_sampler.py                      # the DataLoader in this process
    python examples/dataloader_sampler.py --num-workers 2      # 2 spawned worker processes fetch the examples
    python examples/dataloader_sampler.py --alpha 0            # the same loop with uniform draws

Prints the test accuracy after each epoch and the sampler's statistics.
"""
import argparse
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from replayloader import LinearSchedule, PrioritizedSampler
from replayloader.torch import PrioritizedBatchSampler


def digits(seed: int):
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)  # pixel values 0..16
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    return (TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train)),
            torch.from_numpy(x_test), torch.from_numpy(y_test))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--alpha", type=float, default=1.0, help="priority exponent (0: uniform draws)")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train, x_test, y_test = digits(args.seed)

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    steps_per_epoch = -(-len(train) // args.batch_size)
    sampler = PrioritizedSampler(len(train), batch_size=args.batch_size, alpha=args.alpha,
                                 beta=LinearSchedule(0.4, 1.0, steps=args.epochs * steps_per_epoch),
                                 uniform_fraction=0.1, seed=args.seed)
    batches = PrioritizedBatchSampler(sampler)
    workers = {} if args.num_workers == 0 else {  # spawned workers import this file again: see the guard below
        "num_workers": args.num_workers, "multiprocessing_context": "spawn", "persistent_workers": True}
    loader = DataLoader(train, batch_sampler=batches, **workers)

    started, accuracy = time.perf_counter(), []
    for epoch in range(args.epochs):
        for xb, yb in loader:
            info = batches.next_batch_info()  # this batch's indices, importance weights and epoch
            per_example = F.cross_entropy(model(xb), yb, reduction="none")
            loss = (per_example * batches.importance_weights(info, per_example)).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            batches.feedback(info, loss=per_example.detach())  # feedback: these indices' new weights
        with torch.no_grad():
            accuracy.append(float((model(x_test).argmax(1) == y_test).float().mean()))
        print(f"epoch {epoch}: test accuracy {accuracy[-1]:.3f}, beta {sampler.current_beta():.2f}", flush=True)
    seconds = time.perf_counter() - started

    stats = sampler.stats()
    weights = sampler.weights
    print(f"alpha {args.alpha}, num_workers={args.num_workers}: {args.epochs} epochs of {len(loader)} batches in "
          f"{seconds:.1f} s; final test accuracy {accuracy[-1]:.3f}")
    print(f"sampler: {stats['drawn']} draws ({stats['uniform_draws']} uniform), {stats['updated']} updates, "
          f"never visited {stats['frac_never_visited']:.3f}; weights min {weights.min():.2e} "
          f"median {np.median(weights):.2e} max {weights.max():.2e}")
    return {"accuracy": accuracy, "drawn": int(stats["drawn"]), "epoch": sampler.epoch, "seconds": seconds}


if __name__ == "__main__":  # needed with --num-workers: spawned workers import this file without running it
    main()
