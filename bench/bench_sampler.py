"""Cost of PrioritizedSampler per training step: draw a batch (next_batch) + feed its losses back (update).

Per-step cost is what a training loop pays on top of its own step, so it is compared there with a measured
step time (results/prioritized_glue/, results/prioritized_digits/). Each cell is the best of several repeats of `--steps` steps (the machine is
shared: the minimum is the least disturbed figure); the loss fed back is a torch tensor, as in a real loop.

    python -m bench.bench_sampler --out results/bench_sampler/bench_sampler.md
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from replayloader import LinearSchedule, PrioritizedSampler  # noqa: E402
from replayloader.strategies import GradBound, LossDifference, LossValue  # noqa: E402

RULES = {"loss": LossValue, "loss_diff": LossDifference, "grad_bound": GradBound}


def time_steps(sampler: PrioritizedSampler, rule: str, batch_size: int, steps: int, repeats: int) -> float:
    """Best-of-repeats microseconds per next_batch + update."""
    loss = torch.rand(batch_size) + 0.1
    logits, targets = torch.randn(batch_size, 10), torch.randint(0, 10, (batch_size,))
    best = np.inf
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(steps):
            batch = sampler.next_batch()
            if rule == "grad_bound":
                sampler.feedback(batch, logits=logits, targets=targets)
            else:
                sampler.feedback(batch, loss=loss)
        best = min(best, (time.perf_counter() - started) / steps)
    return best * 1e6


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 67_349, 1_000_000])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for n in args.sizes:
        for k in args.batch_sizes:
            for rule in args.rules:
                sampler = PrioritizedSampler(n, k, beta=LinearSchedule(0.4, 1.0, 10_000), uniform_fraction=0.1,
                                             update=RULES[rule](), warmup_epochs=0, seed=0)
                time_steps(sampler, rule, k, 20, 1)  # first calls (compilation cache load) are not measured
                rows.append((n, k, rule, time_steps(sampler, rule, k, args.steps, args.repeats)))
                print(f"N={n} K={k} {rule}: {rows[-1][3]:.1f} µs/step", flush=True)
    command = "python -m bench.bench_sampler " + shlex.join(sys.argv[1:] if argv is None else argv)
    lines = ["# PrioritizedSampler: cost per training step (next_batch + update)", "",
             f"Command: `{command}`  ",
             f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  ",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores (shared with other jobs), no GPU, one thread, "
             f"Python {platform.python_version()}, torch {torch.__version__}  ",
             f"Each cell: best of {args.repeats} repeats of {args.steps} steps; alpha 1, beta annealed, "
             "uniform_fraction 0.1, feedback as a torch tensor.", "",
             "| N | batch | update rule | µs per step |", "|---|---|---|---|"]
    lines += [f"| {n:,} | {k} | {rule} | {us:.1f} |" for n, k, rule, us in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
