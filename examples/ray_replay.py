"""RemoteBuffer + RayReplayLoader: producers as Ray actors feed a buffer actor; the learner samples it.

    python examples/ray_replay.py                       # a local Ray cluster of 2 CPUs, 2 producer actors
    python examples/ray_replay.py --address auto        # a running cluster (`ray start --head` first)

The shape of Ape-X: two producer actors (here, noisy data streams of a 1-D regression task whose right half is
harder to fit than its left half; in RL, environment actors) each return a batch of new examples per call; the
`ReplayBuffer` lives in a Ray actor (`RemoteBuffer`, the buffer's own arguments); the learner iterates a
`RayReplayLoader` exactly like a `ReplayDataLoader` and feeds each example's loss back. A `RateLimiter` holds
learner and producers to ``--samples-per-insert`` sampled examples per inserted one: whichever side runs ahead
waits. Pass ``--no-init`` when this process has already called ``ray.init``.

Prints the test error before and after training and what the buffer and the limiter saw.
"""
import argparse
import time

import numpy as np
import ray
import torch

from replayloader.loader import RateLimiter
from replayloader.ray import RayReplayLoader, RemoteBuffer
from replayloader.strategies import by_name


@ray.remote(num_cpus=0)
class Stream:
    """A producer actor: each call returns 32 new noisy examples, seeded by the item (so a restart repeats it)."""

    def produce(self, item: int) -> dict:
        rng = np.random.default_rng(item)
        x = rng.uniform(-3, 3, size=(32, 1)).astype(np.float32)
        y = np.sin(2 * x) + np.where(x > 0, 0.5 * np.sin(12 * x), 0.0) + rng.normal(0, 0.05, size=x.shape)
        return {"x": x, "y": y.astype(np.float32)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="producer calls, 32 examples each")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--samples-per-insert", type=float, default=2.0)
    parser.add_argument("--strategy", default="loss_diff")
    parser.add_argument("--address", default=None, help="a running Ray cluster ('auto'); default: a local one")
    parser.add_argument("--no-init", action="store_true", help="Ray is already initialised in this process")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.no_init:
        ray.init(address=args.address, num_cpus=None if args.address else 2, include_dashboard=False)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    model = torch.nn.Sequential(torch.nn.Linear(1, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    x_test = np.linspace(-3, 3, 512, dtype=np.float32)[:, None]
    y_test = torch.from_numpy(np.sin(2 * x_test) + np.where(x_test > 0, 0.5 * np.sin(12 * x_test), 0.0))
    x_test = torch.from_numpy(x_test)

    def test_error() -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(x_test), y_test))

    before = test_error()
    buffer = RemoteBuffer(2048, alpha=1.0, strategy=by_name(args.strategy), seed=args.seed)  # in a Ray actor
    limiter = RateLimiter(samples_per_insert=args.samples_per_insert, min_size=args.batch_size,
                          error_buffer=4 * args.batch_size, timeout=60)
    loader = RayReplayLoader([Stream.remote() for _ in range(2)], buffer, batch_size=args.batch_size,
                             source=range(args.calls), rate_limiter=limiter, restart=lambda i: Stream.remote())
    started, updates = time.perf_counter(), 0
    for batch in loader:  # a ReplayBatch, as from ReplayDataLoader; its arrays are read-only: copy before writing
        x, y = torch.tensor(batch.data["x"]), torch.tensor(batch.data["y"])
        per_example = ((model(x) - y) ** 2).squeeze(1)
        loss = per_example.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loader.feedback(batch, loss=per_example.detach().numpy())  # one actor call
        updates += 1
    seconds = time.perf_counter() - started

    after, stats, pace = test_error(), loader.stats(), limiter.stats()
    size = len(buffer)
    print(f"2 producer actors, {args.calls} calls: {updates} updates in {seconds:.1f} s; test mse {before:.4f} -> "
          f"{after:.4f}")
    print(f"buffer actor: {size} examples, {stats['inserted']} inserted, weight std "
          f"{buffer.stats()['weight_std']:.4f}; limiter: {pace['samples_per_insert']:.2f} samples per insert, "
          f"{stats['producer_restarts']} producer restarts")
    if not args.no_init:
        ray.shutdown()
    return {"updates": updates, "inserted": stats["inserted"], "buffer_size": size, "test_mse_before": before,
            "test_mse": after, "seconds": seconds}


if __name__ == "__main__":
    main()
