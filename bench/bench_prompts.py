"""Draw + feedback time of `PromptSampler` per generation batch, by pool size and batch size.

    python -m bench.bench_prompts                    # N = 2e4, 1e5, 1e6 prompts; batches of 16, 64, 256 prompts
    python -m bench.bench_prompts --sizes 1000000 --batches 256 --repeats 50

Prints the median milliseconds of one `next_batch()` + its `feedback(...)` (8 completions a prompt, 0/1
rewards at pass rate 0.5), with difficulty labels, staleness and retests on, as docs/prompts.md's example, and
the machine's load. Issue 41's goal: <= 1 ms for a generation batch at 10^6 prompts.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

import numpy as np

from replayloader.prompts import PromptSampler


def time_batches(n: int, batch: int, repeats: int) -> float:
    sampler = PromptSampler(n, batch, group_size=8, labels=np.arange(n) % 5, stale_after=50, retest_every=4, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(3):  # compile and warm the trees
        b = sampler.next_batch()
        sampler.feedback(b.indices, rewards=(rng.random((batch, 8)) < 0.5).astype(float))
    times = []
    for _ in range(repeats):
        rewards = (rng.random((batch, 8)) < 0.5).astype(float)
        start = time.perf_counter()
        b = sampler.next_batch()
        sampler.feedback(b.indices, rewards=rewards)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", type=int, default=[20_000, 100_000, 1_000_000])
    ap.add_argument("--batches", nargs="+", type=int, default=[16, 64, 256])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(f"load average: {os.getloadavg()}")
    print("| prompts | batch | ms per draw + feedback (median) |\n|---|---|---|")
    for n in args.sizes:
        for batch in args.batches:
            print(f"| {n:,} | {batch} | {1e3 * time_batches(n, batch, args.repeats):.2f} |", flush=True)


if __name__ == "__main__":
    main()
