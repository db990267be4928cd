"""Soak: 10^6 buffer steps (add, sample, feedback), then a long loader run with background workers; memory must
stay flat (RSS growth < 1% after warm-up).

    OMP_NUM_THREADS=1 nice -n 10 python -m checks.soak --steps 1000000 --loader-steps 100000 > results/soak/soak.md

Prints a markdown report: the command, date, machine, RSS along the run and the verdict. Linux only (RSS is
read from /proc/self/statm).
"""
import argparse
import datetime
import os
import platform
import time

import numpy as np

from replayloader import ReplayBuffer, ReplayDataLoader  # noqa: E402
from replayloader.strategies import by_name  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def soak_buffer(steps: int, capacity: int, k: int, rows: list) -> None:
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(capacity, alpha=0.7, beta=0.5, strategy=by_name("loss_diff"), seed=0)
    batches = [{"input_ids": rng.integers(0, 30000, (k, 128))} for _ in range(8)]
    losses = rng.random((8, k))
    marks = set(np.linspace(0, steps, 11, dtype=int)[1:] - 1)
    start = time.perf_counter()
    for step in range(steps):
        buf.add(batches[step % 8])
        sample = buf.sample(k)
        buf.feedback(sample.ids, loss=losses[step % 8])
        if step in marks:
            rows.append(("buffer", step + 1, time.perf_counter() - start, rss_mb(), buf.counters["stale_feedback"]))


def soak_loader(steps: int, capacity: int, k: int, rows: list) -> None:
    rng = np.random.default_rng(1)
    batches = [{"input_ids": rng.integers(0, 30000, (k, 128))} for _ in range(8)]
    counter = iter(range(10**18))

    def producer():
        return batches[next(counter) % 8], None

    buf = ReplayBuffer(capacity, strategy=by_name("loss_diff"), seed=0)
    loader = ReplayDataLoader(producer, buf, batch_size=k, steps=steps, workers=2)
    marks = set(np.linspace(0, steps, 11, dtype=int)[1:] - 1)
    losses = rng.random(k)
    start = time.perf_counter()
    for i, batch in enumerate(loader):
        loader.feedback(batch, loss=losses)
        if i in marks:
            rows.append(("loader, 2 thread workers", i + 1, time.perf_counter() - start, rss_mb(),
                         buf.counters["stale_feedback"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10**6)
    parser.add_argument("--loader-steps", type=int, default=10**5)
    parser.add_argument("--capacity", type=int, default=10**4)
    parser.add_argument("--k", type=int, default=32)
    args = parser.parse_args()
    rows: list = []
    soak_buffer(args.steps, args.capacity, args.k, rows)
    soak_loader(args.loader_steps, args.capacity, args.k, rows)
    print("# Soak: flat memory over long runs\n")
    print(f"Command: `OMP_NUM_THREADS=1 nice -n 10 python -m checks.soak --steps {args.steps} --loader-steps "
          f"{args.loader_steps} --capacity {args.capacity} --k {args.k}`  ")
    print(f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  ")
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, no GPU, "
          f"Python {platform.python_version()}, numpy {np.__version__}\n")
    print(f"Each buffer step: add {args.k} examples of 128 int64 tokens, sample {args.k}, feed back {args.k} "
          f"losses (loss_diff, evict lowest, capacity {args.capacity}). The loader run does the same through "
          "`ReplayDataLoader(workers=2)` with feedback on every batch.\n")
    print("| phase | steps done | seconds | RSS (MiB) | stale feedback so far |")
    print("|---|---:|---:|---:|---:|")
    for phase, step, seconds, rss, stale in rows:
        print(f"| {phase} | {step:,} | {seconds:.0f} | {rss:.1f} | {stale:,} |")
    print()
    for phase in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == phase]
        first, last = mine[0][3], mine[-1][3]  # the first mark (10% done) is past warm-up and allocation
        growth = (last - first) / first * 100
        verdict = "flat" if growth < 1.0 else "GROWS"
        print(f"- {phase}: RSS {first:.1f} MiB at 10% of the run, {last:.1f} MiB at the end: "
              f"{growth:+.2f}% ({verdict}; the target is < 1%)")


if __name__ == "__main__":
    main()
