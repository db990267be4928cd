"""ReplayBuffer + ReplayDataLoader: train on what a producer makes, replayed by learned importance.

The producer is a noisy data stream (each call: 32 fresh points of a 1-D regression task whose right half is
much harder to fit than its left half), standing in for a generator model, an environment or an augmentation
pipeline. The loader adds each produced batch to a fixed-size `ReplayBuffer` and yields sampled mini-batches;
the training loop feeds each example's loss back, and the strategy turns it into the example's new weight.
`--alpha 0` replays uniformly (P(i) = w_i^alpha / sum_j w_j^alpha), for comparison.

    python examples/replay_loader.py                        # loss_diff, producer inline
    python examples/replay_loader.py --workers 1            # the producer runs in a background thread
    python examples/replay_loader.py --alpha 0              # uniform replay, the same loop otherwise

Prints the test error before and after training and what the buffer saw (weights, visits, waits).
"""
import argparse
import time

import numpy as np
import torch

from replayloader import ReplayBuffer, ReplayDataLoader
from replayloader.strategies import by_name, strategy_names


def target(x: np.ndarray) -> np.ndarray:
    """Smooth on the left, wiggly on the right: the right half needs far more updates to fit."""
    return np.sin(2 * x) + np.where(x > 0, 0.5 * np.sin(12 * x), 0.0)


def stream(item: int, size: int = 32) -> dict:
    """The producer: new noisy examples each call, seeded by the item so any worker makes the same ones."""
    rng = np.random.default_rng(item)
    x = rng.uniform(-3, 3, size=(size, 1))
    y = target(x) + rng.normal(0, 0.05, size=x.shape)
    return {"x": torch.tensor(x, dtype=torch.float32), "y": torch.tensor(y, dtype=torch.float32)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="loss_diff", choices=strategy_names())
    parser.add_argument("--steps", type=int, default=600, help="producer calls (32 examples each)")
    parser.add_argument("--alpha", type=float, default=1.0, help="priority exponent (0: uniform replay)")
    parser.add_argument("--capacity", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--replay-ratio", type=float, default=2.0, help="sampled batches per produced batch")
    parser.add_argument("--workers", type=int, default=0, help="background producer threads (0: inline)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    model = torch.nn.Sequential(torch.nn.Linear(1, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    x_test = torch.linspace(-3, 3, 512)[:, None]
    y_test = torch.tensor(target(x_test.numpy()), dtype=torch.float32)

    def test_error() -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(x_test), y_test))

    before = test_error()
    buffer = ReplayBuffer(args.capacity, alpha=args.alpha, strategy=by_name(args.strategy), seed=args.seed)
    loader = ReplayDataLoader(stream, buffer, batch_size=args.batch_size, replay_ratio=args.replay_ratio,
                              source=range(args.steps), min_size=args.batch_size, workers=args.workers)
    started, updates, right_half = time.perf_counter(), 0, []
    for batch in loader:  # batch.data, .ids, .probabilities, .weights, .ages, .fresh
        per_example = ((model(batch.data["x"]) - batch.data["y"]) ** 2).squeeze(1)
        loss = per_example.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loader.feedback(batch, loss=per_example.detach())  # the strategy turns losses into weights
        updates += 1
        right_half.append(float((batch.data["x"] > 0).float().mean()))
        if updates % 300 == 0:
            print(f"update {updates}: batch loss {loss.item():.4f}, test mse {test_error():.4f}", flush=True)
    seconds = time.perf_counter() - started

    after = test_error()
    stats, timing = buffer.stats(), loader.stats()
    share = float(np.mean(right_half[len(right_half) // 2:]))
    print(f"strategy {args.strategy}, alpha {args.alpha}, workers={args.workers}: {updates} updates on "
          f"{args.steps * 32} produced examples in {seconds:.1f} s")
    print(f"test mse {before:.4f} -> {after:.4f}; share of the hard right half in the last half of the batches "
          f"{share:.2f} (in the stream: 0.50; eviction and sampling both move it)")
    print(f"buffer: {len(buffer)} of {args.capacity} examples, weight std {stats['weight_std']:.4f}, "
          f"mean visits {stats['mean_visits']:.2f}, evicted {stats['evicted']}; learner waited "
          f"{timing['learner_wait_s']:.2f} s for data")
    return {"strategy": args.strategy, "alpha": args.alpha, "updates": updates, "test_mse_before": before,
            "test_mse": after, "right_half_share": share, "buffer_size": len(buffer), "seconds": seconds}


if __name__ == "__main__":
    main()
