"""What a score-then-select step costs against a uniform step, measured: CPU seconds of a small MLP's training step.

Why: the cost model of docs/selection.md counts forward-row units (a forward over one row = 1, a backward = 2), so
a step that scores n_B = 320 candidates to train n_b = 32 of them costs (n_B + 3 n_b) / (3 n_b) = 4.33 uniform
steps. That counts rows only: real steps also pay per-step work that does not grow with rows (Python, the
optimizer, the sampler and the selector), and a row's cost depends on the batch (a no-grad forward keeps no
activations; a forward over n_B rows uses the hardware better per row than one over n_b), so a measured ratio
differs from the model. This script measures the ratio the README and docs/selection.md quote.

A uniform step: draw n_b rows (`PrioritizedSampler`, ``alpha=0``), gather them, forward + backward + SGD step.
A selection step: draw n_B candidates, gather them, one no-grad forward over all n_B (the scoring pass),
`ScoreThenSelect.choose` (RHO-LOSS's `ReducibleLoss` + `TopK`, the scores refreshing the sampler's tree), cut the
n_b chosen rows out, then the same training step over them with their importance weights.

Timing: ``time.process_time`` (this process's CPU seconds, so load from other processes on the machine does not
count), one torch thread by default, blocks of ``--steps`` steps of each kind interleaved (the order alternating
between repeats) so drift hits both alike; it prints the median over repeats of each kind's CPU ms per step and
the median of the per-repeat ratios, with their interquartile range, beside the forward-row model's value.

    python -m bench.selection_step_cost                       # n_B = 320, n_b = 32, 64 -> 256 -> 256 -> 2 MLP
    python -m bench.selection_step_cost --hidden 1024 --repeats 21
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch.nn import functional as F

from replayloader import PrioritizedSampler
from replayloader.selection import ReducibleLoss, ScoreThenSelect, Selector, TopK, step_cost_ratio


def mlp(inputs: int, hidden: int, classes: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, classes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", type=int, default=320, help="n_B, candidates scored per selection step")
    parser.add_argument("--chosen", type=int, default=32, help="n_b, rows trained per step (both kinds)")
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--classes", type=int, default=2)
    parser.add_argument("--examples", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=31, help="timed blocks of each kind, interleaved")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(args.examples, args.inputs)), dtype=torch.float32)
    y = torch.as_tensor(rng.integers(0, args.classes, args.examples))
    irreducible = rng.random(args.examples) * 0.5  # stands in for a fitted IL model's losses

    model = mlp(args.inputs, args.hidden, args.classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    uniform = PrioritizedSampler(args.examples, args.chosen, alpha=0.0, warmup_epochs=0, seed=0)
    select = ScoreThenSelect(PrioritizedSampler(args.examples, args.pool, alpha=0.0, warmup_epochs=0, seed=1),
                             Selector(TopK(args.chosen), ReducibleLoss(irreducible), seed=0))

    def train(xs: torch.Tensor, ys: torch.Tensor, weights: torch.Tensor | None) -> None:
        losses = F.cross_entropy(model(xs), ys, reduction="none")
        loss = losses.mean() if weights is None else (losses * weights).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def uniform_step() -> None:
        rows = torch.as_tensor(uniform.next_batch().indices)
        train(x[rows], y[rows], None)

    def selection_step() -> None:
        candidates = select.next_candidates()
        rows = torch.as_tensor(candidates.indices)
        xb, yb = x[rows], y[rows]
        with torch.no_grad():  # the scoring pass over n_B
            scores = F.cross_entropy(model(xb), yb, reduction="none")
        chosen = select.choose(candidates, scores)
        positions = torch.as_tensor(chosen.positions)
        train(xb[positions], yb[positions], torch.as_tensor(chosen.weights, dtype=torch.float32))

    def block(step) -> float:
        start = time.process_time()
        for _ in range(args.steps):
            step()
        return (time.process_time() - start) / args.steps

    for _ in range(3):  # warm-up: first calls, allocator, numba kernels
        block(uniform_step), block(selection_step)
    uniform_s, select_s = [], []
    for repeat in range(args.repeats):
        if repeat % 2:
            select_s.append(block(selection_step)), uniform_s.append(block(uniform_step))
        else:
            uniform_s.append(block(uniform_step)), select_s.append(block(selection_step))
    uniform_s, select_s = np.array(uniform_s), np.array(select_s)
    ratios = select_s / uniform_s
    q1, q3 = np.percentile(ratios, [25, 75])
    print(f"MLP {args.inputs} -> {args.hidden} -> {args.hidden} -> {args.classes}, n_B = {args.pool}, "
          f"n_b = {args.chosen}, {args.threads} torch thread(s), {args.repeats} interleaved blocks of {args.steps} "
          f"steps, CPU time (time.process_time)")
    print(f"uniform step   {np.median(uniform_s) * 1e3:.3f} CPU ms (median)")
    print(f"selection step {np.median(select_s) * 1e3:.3f} CPU ms (median)")
    print(f"selection / uniform: {np.median(ratios):.2f}x (median of per-block ratios; IQR {q1:.2f}-{q3:.2f}); "
          f"forward-row model {step_cost_ratio(args.pool, args.chosen):.2f}x")


if __name__ == "__main__":
    main()
