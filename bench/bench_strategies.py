"""Per-step buffer time of every TMR variant, fed as pretraining feeds it (paper scale: N=1000, K=128).

One step = add K examples of 128 tokens, sample K, update the K sampled ids with that variant's feedback. By
default each variant gets exactly its own keyword; `--extra-loss` also passes ``loss=`` beside ``grad_norm=`` /
``grad_bound=``, as the pretraining loop did before the redesign (which sent those variants down a slower path).
Uses the public API only, so the same script times any checkout: `PYTHONPATH=<checkout> python -m
bench.bench_strategies`. Prints median µs per step.
"""
from __future__ import annotations

import argparse
import gc
import os
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from replayloader import ReplayBuffer, strategies  # noqa: E402

FEEDBACK = {"loss_diff": "loss", "grad_norm": "grad_norm", "grad_bound": "grad_bound", "loss": "loss",
            "lsr": "loss", "linucb": "loss"}


def step_time(name: str, n: int, k: int, reps: int, extra_loss: bool) -> float:
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(n, strategy=strategies.by_name(name), seed=0)
    tokens = [{"input_ids": rng.integers(0, 4096, (k, 128), dtype=np.int64)} for _ in range(16)]
    signals = [rng.uniform(0.01, 1.0, k) for _ in range(16)]
    key = FEEDBACK[name]
    while len(buf) < n:
        buf.add(tokens[0])
    times = []
    gc.disable()
    for r in range(reps + 5):
        start = time.perf_counter()
        buf.add(tokens[r % 16])
        s = buf.sample(k)
        feedback = {key: signals[r % 16]}
        if extra_loss and key != "loss":
            feedback["loss"] = signals[(r + 1) % 16]
        buf.feedback(s.ids, **feedback)
        if r >= 5:
            times.append(time.perf_counter() - start)
    gc.enable()
    return float(np.median(times)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--variants", nargs="+", default=list(FEEDBACK), choices=list(FEEDBACK))
    ap.add_argument("--extra-loss", action="store_true", help="also pass loss= (the old pretraining loop did)")
    args = ap.parse_args()
    print(f"| variant | µs per buffer step (N={args.n}, K={args.k}{', loss= passed too' if args.extra_loss else ''}) |")
    print("|---|---|")
    for name in args.variants:
        print(f"| tmr-{name} | {step_time(name, args.n, args.k, args.reps, args.extra_loss):.1f} |")


if __name__ == "__main__":
    main()
