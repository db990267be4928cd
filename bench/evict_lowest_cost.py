"""What evict-lowest costs inside a whole-buffer step, beside FIFO: why the paper's semantics stay above 0.5x cpprb.

    python -m bench.evict_lowest_cost                     # N = 1e6, K = 128, 3000 steps
    python -m bench.evict_lowest_cost --n 100000 --k 1024

A FIFO buffer (cpprb's and TorchRL's semantics) writes each new batch into one run of consecutive rows and picks
no victims. Evict-lowest (TMR's memory) must (1) find the K lowest keys among N, and (2) write the new rows where
those K victims were: K scattered rows. This bench runs the whole-buffer step of `bench.bench_sumtree` (add K
rows of 128 int64 tokens, sample K with their data, feedback K new priorities) on one `ReplayBuffer` with
`Strategy(MeanWeight(), SetWeight(), EvictLowest())` and one with `Strategy(MaxWeight(), SetWeight(), FIFO())`,
timing each phase (median µs of thread CPU time), and beside it:

* the selection of the K lowest alone (`kernels.tree.select_lowest`), called right after a step, so its cache is
  as the step leaves it ("cold"), and again at once ("warm");
* writing K rows of 128 int64 tokens to K random rows of an N-row array vs to K consecutive rows.

One thread; the buffers start full with priorities uniform in [0.01, 1] (fixed seeds).
"""
from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from replayloader import ReplayBuffer  # noqa: E402
from replayloader.kernels.tree import select_lowest  # noqa: E402
from replayloader.strategies import FIFO, EvictLowest, MaxWeight, MeanWeight, SetWeight, Strategy  # noqa: E402

TOKENS = 128
CHUNK = 65_536


def full_buffer(n: int, strategy: Strategy, rng: np.random.Generator) -> ReplayBuffer:
    buffer = ReplayBuffer(n, alpha=1.0, beta=0.4, strategy=strategy, seed=0)
    ids = [buffer.add({"tokens": rng.integers(0, 1000, (min(n, s + CHUNK) - s, TOKENS))}) for s in range(0, n, CHUNK)]
    buffer.feedback(np.concatenate(ids), weight=rng.uniform(0.01, 1.0, n))
    return buffer


def median_us(samples: list[int]) -> float:
    return float(np.median(samples)) / 1e3


def phases(buffer: ReplayBuffer, k: int, steps: int, rng: np.random.Generator, with_select: bool) -> dict[str, float]:
    """Median µs of add, sample, feedback within whole-buffer steps; with_select: also the selection of the k
    lowest, cold (as a step leaves the cache) and warm (called again at once)."""
    batches = [{"tokens": rng.integers(0, 1000, (k, TOKENS))} for _ in range(16)]
    priorities = [rng.uniform(0.01, 1.0, k) for _ in range(16)]
    times: dict[str, list[int]] = {"add": [], "sample": [], "feedback": [], "select cold": [], "select warm": []}
    tree = buffer.tree
    clock = time.thread_time_ns
    for r in range(steps + 100):
        if with_select:
            t0 = clock()
            select_lowest(tree.nodes, tree.layout, k)
            t1 = clock()
            select_lowest(tree.nodes, tree.layout, k)
            t2 = clock()
            if r >= 100:
                times["select cold"].append(t1 - t0)
                times["select warm"].append(t2 - t1)
            for _ in range(2):  # leave the cache as a step does before the add below
                s = buffer.sample(k)
                buffer.feedback(s.ids, weight=priorities[r % 16])
        t0 = clock()
        buffer.add(batches[r % 16])
        t1 = clock()
        s = buffer.sample(k)
        t2 = clock()
        buffer.feedback(s.ids, weight=priorities[r % 16])
        t3 = clock()
        if r >= 100:
            times["add"].append(t1 - t0)
            times["sample"].append(t2 - t1)
            times["feedback"].append(t3 - t2)
    return {name: median_us(x) for name, x in times.items() if x}


def row_writes(n: int, k: int, steps: int, rng: np.random.Generator) -> tuple[float, float]:
    """Median µs of writing k token rows to k random rows, and to k consecutive rows, of an n-row array."""
    rows = np.zeros((n, TOKENS), np.int64)
    rows[:] = 1  # touch every page first
    new = rng.integers(0, 1000, (k, TOKENS))
    scattered, consecutive = [], []
    for _ in range(steps):
        where = rng.choice(n, k, replace=False)
        start = int(rng.integers(0, n - k))
        t0 = time.thread_time_ns()
        rows[where] = new
        t1 = time.thread_time_ns()
        rows[start:start + k] = new
        t2 = time.thread_time_ns()
        scattered.append(t1 - t0)
        consecutive.append(t2 - t1)
    return median_us(scattered), median_us(consecutive)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3000)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(f"load average: {os.getloadavg()}")
    evict = phases(full_buffer(args.n, Strategy(MeanWeight(), SetWeight(), EvictLowest()), rng), args.k, args.steps,
                   rng, with_select=True)
    fifo = phases(full_buffer(args.n, Strategy(MaxWeight(), SetWeight(), FIFO()), rng), args.k, args.steps, rng,
                  with_select=False)
    scattered, consecutive = row_writes(args.n, args.k, args.steps, rng)
    print(f"\nN = {args.n:,}, K = {args.k}; median µs per call (thread CPU time)\n")
    print("| phase | mean init, evict lowest | max init, FIFO |\n|---|---|---|")
    for name in ("add", "sample", "feedback"):
        print(f"| {name} | {evict[name]:.1f} | {fifo[name]:.1f} |")
    print(f"| step (sum of medians) | {sum(evict[x] for x in ('add', 'sample', 'feedback')):.1f} | "
          f"{sum(fifo[x] for x in ('add', 'sample', 'feedback')):.1f} |")
    print(f"\nselect the K lowest: {evict['select cold']:.1f} µs as a step leaves the cache, "
          f"{evict['select warm']:.1f} µs called again at once")
    print(f"write K rows of {TOKENS} int64: {scattered:.1f} µs to K random rows, {consecutive:.1f} µs to K "
          f"consecutive rows")


if __name__ == "__main__":
    main()
