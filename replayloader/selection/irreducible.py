"""Irreducible losses for `ReducibleLoss` (RHO-LOSS), computed once and saved beside the run.

RHO-LOSS needs, for every training example, the loss of a model that never trained on it: a small model is
trained on a held-out split, then scores every training example. That costs one training run of the small model
plus one forward pass over the training set, paid once. `irreducible_losses` runs both through callables you
pass (so any framework fits), times them, and writes the array with its cost to one ``.npz`` (atomically: a
kill leaves the old file or the new one); a later call with the same path loads it instead of recomputing.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..state.atomic import atomic_write
from .._arrays import to_numpy


@dataclass
class IrreducibleLosses:
    """One loss per training example, and what computing them cost (seconds of training and of scoring,
    measured with ``time.process_time`` (CPU time of this process) and ``time.perf_counter`` (wall))."""

    losses: np.ndarray
    train_cpu_s: float
    score_cpu_s: float
    train_wall_s: float
    score_wall_s: float

    def save(self, path: str | Path) -> None:
        def write(f):
            np.savez(f, losses=self.losses, train_cpu_s=self.train_cpu_s, score_cpu_s=self.score_cpu_s,
                     train_wall_s=self.train_wall_s, score_wall_s=self.score_wall_s)
        atomic_write(path, write)

    @classmethod
    def load(cls, path: str | Path) -> IrreducibleLosses:
        with np.load(path) as f:
            return cls(np.array(f["losses"], np.float64), *(float(f[k]) for k in
                       ("train_cpu_s", "score_cpu_s", "train_wall_s", "score_wall_s")))


def irreducible_losses(path: str | Path, num_examples: int, train: Callable[[], Any],
                       score: Callable[[Any], Any]) -> IrreducibleLosses:
    """Load ``path`` if it holds ``num_examples`` losses; else ``model = train()`` (fit the small model on the
    held-out split), ``losses = score(model)`` (per-example loss of every training example, dataset order, shape
    (num_examples,)), check them (finite), save them to ``path`` with their cost, and return them."""
    path = Path(path)
    if path.exists():
        found = IrreducibleLosses.load(path)
        if found.losses.shape != (num_examples,):
            raise ValueError(f"{path} holds {found.losses.shape[0]} irreducible losses, expected num_examples = "
                             f"{num_examples}; delete it to recompute")
        return found
    cpu, wall = time.process_time(), time.perf_counter()
    model = train()
    cpu_train, wall_train = time.process_time(), time.perf_counter()
    losses = np.array(to_numpy(score(model), "losses"), np.float64)
    cpu_score, wall_score = time.process_time(), time.perf_counter()
    if losses.shape != (num_examples,):
        raise ValueError(f"score(model) must return one loss per training example, shape ({num_examples},), got "
                         f"{losses.shape}")
    bad = np.flatnonzero(~np.isfinite(losses))
    if len(bad):
        raise ValueError(f"score(model) returned a non-finite loss: losses[{bad[0]}] = {losses[bad[0]]}")
    result = IrreducibleLosses(losses, cpu_train - cpu, cpu_score - cpu_train, wall_train - wall,
                               wall_score - wall_train)
    result.save(path)
    return result
