"""Prioritized vs uniform sampling on scikit-learn's digits with a small torch MLP, at equal steps.

Every run trains the same MLP (64-64-10, Adam) for the same number of steps; only the source of the batch
indices differs: `uniform` takes shuffled passes (what DataLoader(shuffle=True) does), the others take them from
a `PrioritizedSampler` fed back each step with the batch's per-example losses (or the K&F gradient bound), and
scale the loss by its importance weights. `replacement` is a control: the same sampler at alpha = 0 (uniform
draws with replacement after the warm-up pass), which separates the effect of prioritizing from that of
drawing with replacement. Test accuracy is recorded along the way. ``--label-noise`` flips a
share of the training labels, a case where loss-driven sampling is known to chase the noise.

The sampler's cost per step (drawing the batch plus the feedback call) is timed separately from the rest of
the step.

    python -m experiments.prioritized_digits --seeds 0 1 2 3 4 --steps 1500 --out results/prioritized_digits/prioritized_digits.md
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
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from replayloader import LinearSchedule, PrioritizedSampler  # noqa: E402
from replayloader.strategies import GradBound, LossDifference, LossValue  # noqa: E402

VARIANTS = {  # name -> (update rule, alpha override); `replacement` is a control: the sampler at alpha 0
    "replacement": (LossValue, 0.0),
    "loss": (LossValue, None),
    "loss_diff": (LossDifference, None),
    "grad_bound": (GradBound, None),
}


def load_data(label_noise: float, seed: int = 0):
    """The fixed split (a third for test), standardized; ``label_noise`` of the training labels re-drawn."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=1 / 3, random_state=seed, stratify=y)
    scaler = StandardScaler().fit(x_train)
    y_train = y_train.copy()
    if label_noise:
        rng = np.random.default_rng(seed)
        flip = rng.random(len(y_train)) < label_noise
        y_train[flip] = rng.integers(0, 10, flip.sum())
    as_x = lambda a: torch.tensor(scaler.transform(a), dtype=torch.float32)  # noqa: E731
    return as_x(x_train), torch.tensor(y_train), as_x(x_test), torch.tensor(y_test)


def make_sampler(variant: str, n: int, args, seed: int) -> PrioritizedSampler:
    update, alpha = VARIANTS[variant]
    return PrioritizedSampler(n, args.batch_size, alpha=args.alpha if alpha is None else alpha,
                              beta=LinearSchedule(args.beta, 1.0, args.steps), update=update(),
                              uniform_fraction=args.uniform_fraction, seed=seed)


def run(variant: str, seed: int, data, args) -> dict:
    """Train one MLP; returns test accuracy at each evaluation step and the sampler's share of the step time."""
    x_train, y_train, x_test, y_test = data
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    n = len(x_train)
    sampler = None if variant == "uniform" else make_sampler(variant, n, args, seed)
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    curve, sampler_seconds, step_seconds = {}, 0.0, 0.0
    for step in range(1, args.steps + 1):
        started = time.perf_counter()
        if sampler is None:
            if len(order) < args.batch_size:  # a new shuffled pass (the last, shorter batch of a pass is kept)
                order += torch.randperm(n, generator=generator).tolist()
            indices, order = order[: args.batch_size], order[args.batch_size:]
            weights = None
        else:
            t0 = time.perf_counter()
            batch = sampler.next_batch()
            sampler_seconds += time.perf_counter() - t0
            indices, weights = torch.from_numpy(batch.indices), torch.from_numpy(batch.weights).float()
        logits = model(x_train[indices])
        per_example = F.cross_entropy(logits, y_train[indices], reduction="none")
        loss = per_example.mean() if weights is None else (per_example * weights).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if sampler is not None:
            t0 = time.perf_counter()
            if variant == "grad_bound":
                sampler.feedback(batch, logits=logits.detach(), targets=y_train[indices])
            else:
                sampler.feedback(batch, loss=per_example.detach())
            sampler_seconds += time.perf_counter() - t0
        step_seconds += time.perf_counter() - started
        if step % args.eval_every == 0:
            with torch.no_grad():
                curve[step] = float((model(x_test).argmax(1) == y_test).float().mean())
    return {"curve": curve, "sampler_seconds": sampler_seconds, "step_seconds": step_seconds}


def mean_std(values) -> str:
    return f"{100 * np.mean(values):.2f} ± {100 * np.std(values, ddof=1 if len(values) > 1 else 0):.2f}"


def report(results: dict, args, command: str, data) -> str:
    steps = sorted(next(iter(results.values()))[0]["curve"])
    shown = [s for s in steps if s in args.table_steps] or steps
    lines = [f"# Prioritized vs uniform sampling: digits MLP{' with label noise' if args.label_noise else ''}", "",
             f"Command: `{command}`  ",
             f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  ",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores (shared), no GPU, torch threads "
             f"{torch.get_num_threads()}, {platform.python_version()}  ",
             f"Data: scikit-learn digits, {len(data[0])} train / {len(data[2])} test (fixed stratified split), "
             f"label noise {args.label_noise:.0%} on train  ",
             f"Model: MLP 64-{args.hidden}-10, Adam lr {args.lr}, batch {args.batch_size}; sampler: alpha "
             f"{args.alpha}, beta {args.beta}→1 linearly over the run, uniform_fraction {args.uniform_fraction}, "
             f"one shuffled warm-up pass; seeds {args.seeds}", "",
             "Test accuracy (%) at equal steps, mean ± std over seeds:", "",
             "| variant | " + " | ".join(f"step {s}" for s in shown) + " |",
             "|---|" + "---|" * len(shown)]
    for variant, runs in results.items():
        cells = [mean_std([r["curve"][s] for r in runs]) for s in shown]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    lines += ["", "Sampler cost per step (next_batch + update), mean over runs:", "",
              "| variant | sampler µs/step | whole step µs | share |", "|---|---|---|---|"]
    for variant, runs in results.items():
        if variant == "uniform":
            whole = np.mean([r["step_seconds"] for r in runs]) / args.steps * 1e6
            lines.append(f"| uniform | – | {whole:.0f} | – |")
            continue
        sampler_us = np.mean([r["sampler_seconds"] for r in runs]) / args.steps * 1e6
        whole = np.mean([r["step_seconds"] for r in runs]) / args.steps * 1e6
        lines.append(f"| {variant} | {sampler_us:.1f} | {whole:.0f} | {100 * sampler_us / whole:.1f}% |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["uniform", *VARIANTS],
                        choices=["uniform", *VARIANTS])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--table-steps", type=int, nargs="+", default=[50, 100, 200, 400, 800, 1500])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--beta", type=float, default=0.4)
    parser.add_argument("--uniform-fraction", type=float, default=0.1)
    parser.add_argument("--label-noise", type=float, default=0.0)
    parser.add_argument("--out", default=None, help="markdown file to write (default: print only)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = load_data(args.label_noise)
    results = {v: [run(v, seed, data, args) for seed in args.seeds] for v in args.variants}
    command = "python -m experiments.prioritized_digits " + shlex.join(sys.argv[1:] if argv is None else argv)
    text = report(results, args, command, data)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
