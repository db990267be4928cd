"""Draw + feedback time of `PromptSampler` per generation batch, by pool size and batch size.

    python -m bench.bench_prompts                    # N = 2e4, 1e5, 1e6 prompts; batches of 16, 64, 256 prompts
    python -m bench.bench_prompts --sizes 1000000 --batches 256 --repeats 50
    python -m bench.bench_prompts --sizes 1000000 --warmup 1600   # the steady state of staleness (see below)

Prints the median milliseconds (thread CPU time, which does not count other jobs' turns on a shared machine) of
one `next_batch()` + its `feedback(...)` (8 completions a prompt, 0/1 rewards at pass rate 0.5), with difficulty
labels, staleness (``stale_after=50``) and retests on, as docs/prompts.md's example, and the machine's load.
Issue 41's goal: <= 1 ms for a generation batch at 10^6 prompts.

Why ``--warmup``: with staleness a record halves every 50 policy steps, 30 times, so a feedback call also
rewrites the leaves of every record measured 50, 100, ..., 1500 steps ago: about 30 batches' worth once the run
is 1500 steps old, against none in its first 50 steps. The default (3 warm-up calls) times a young run; 1600
times the steady state.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

import numpy as np

from replayloader.prompts import PromptSampler


def time_batches(n: int, batch: int, repeats: int, *, warmup: int = 3) -> float:
    """Median seconds of one draw + feedback after ``warmup`` untimed ones (compilation, warm trees, and the
    records' age: see the module doc)."""
    sampler = PromptSampler(n, batch, group_size=8, labels=np.arange(n) % 5, stale_after=50, retest_every=4, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(warmup):
        b = sampler.next_batch()
        sampler.feedback(b.indices, rewards=(rng.random((batch, 8)) < 0.5).astype(float))
    times = []
    for _ in range(repeats):
        rewards = (rng.random((batch, 8)) < 0.5).astype(float)
        start = time.thread_time()
        b = sampler.next_batch()
        sampler.feedback(b.indices, rewards=rewards)
        times.append(time.thread_time() - start)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", type=int, default=[20_000, 100_000, 1_000_000])
    ap.add_argument("--batches", nargs="+", type=int, default=[16, 64, 256])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="untimed draw + feedback calls first (1600: the steady "
                                                           "state of staleness)")
    args = ap.parse_args(argv)
    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(f"load average: {os.getloadavg()}")
    print("| prompts | batch | ms per draw + feedback (median, thread CPU time) |\n|---|---|---|")
    for n in args.sizes:
        for batch in args.batches:
            ms = 1e3 * time_batches(n, batch, args.repeats, warmup=args.warmup)
            print(f"| {n:,} | {batch} | {ms:.2f} |", flush=True)


if __name__ == "__main__":
    main()
