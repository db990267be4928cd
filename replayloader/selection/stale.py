"""The stale reducible-loss tree, assembled: a `PrioritizedSampler` whose weights are RHO-LOSS scores measured
when each row was last trained (`replayloader.strategies.ReducibleLossUpdate`), and its periodic refresh.

Cost: a step trains n_b rows drawn by the tree and feeds their training losses back (``loss=``): no scoring
forward at all, so a step costs what a uniform step costs (plus O(n_b log N) host work). What it gives up:
a weight is as old as the row's last visit. `stale_rows` names the rows whose weights are oldest, so the loop can
re-score a slice of them every r steps (one no-grad forward over that slice: ``slice / (r * n_b)`` forward rows
per trained row) and feed the losses back; rows the model has since learnt (or forgotten) then get their
current reducible loss.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import _checks as checks
from ..sampler.prioritized import PrioritizedSampler
from ..strategies.reducible import ReducibleLossPrior, ReducibleLossUpdate, checked_irreducible


def stale_reducible_sampler(irreducible: Any, *, batch_size: int, initial_loss: float, floor: float = 0.01,
                            alpha: float = 1.0, seed: int | None = None, **options: Any) -> PrioritizedSampler:
    """A `PrioritizedSampler` over ``len(irreducible)`` rows, weight = stale reducible loss: `ReducibleLossUpdate`
    for feedback, `ReducibleLossPrior` (``initial_loss``) for rows not trained yet, and no warm-up pass
    (``warmup_epochs=0``: the prior drives the draws from the first step; see `replayloader.strategies.reducible`
    for why). ``options``: any other `PrioritizedSampler` keyword (``beta``, ``uniform_fraction``, ...)."""
    irreducible = checked_irreducible(irreducible)
    for taken in ("update", "init", "features", "warmup_epochs"):
        if taken in options:
            raise TypeError(f"stale_reducible_sampler sets {taken}= itself; build the PrioritizedSampler yourself to "
                            f"choose it")
    update = ReducibleLossUpdate(irreducible, floor=floor, seed=0 if seed is None else checks.integer("seed", seed, 0))
    return PrioritizedSampler(len(irreducible), batch_size, alpha=alpha, update=update,
                              init=ReducibleLossPrior(initial_loss=initial_loss, floor=floor),
                              features=irreducible[:, None], warmup_epochs=0, seed=seed, **options)


def _prioritized(sampler: Any) -> PrioritizedSampler:
    """The `PrioritizedSampler` inside a batch sampler or a DDP sampler (``.sampler`` until one is found)."""
    found = sampler
    for _ in range(4):
        if isinstance(found, PrioritizedSampler):
            return found
        found = getattr(found, "sampler", None)
    raise TypeError(f"sampler must be a PrioritizedSampler (or a batch / distributed sampler around one), got "
                    f"{type(sampler).__name__}")


def stale_rows(sampler: Any, count: int) -> np.ndarray:
    """The ``count`` rows whose reducible-loss weight is oldest, to re-score and feed back::

        rows = stale_rows(sampler, 256)
        with torch.no_grad():
            losses = per_example_loss(model(x[rows]), y[rows])
        sampler.feedback(rows, loss=losses)   # plain indices: always fresh

    Only rows the sampler has handed out at least once qualify (it refuses feedback for the others; until then
    they keep their prior weight). Never-fed rows come first, then by the feedback call that last set their weight.
    ``sampler``: a `PrioritizedSampler` whose update is a `ReducibleLossUpdate` (or a batch / DDP sampler around
    one: under DDP every rank gets the same rows, so each can score its share and feed it back, a collective).
    A refresh feedback counts as a visit in the sampler's ``visits``."""
    inner = _prioritized(sampler)
    if hasattr(sampler, "settle"):
        sampler.settle()  # a DDP sampler's feedback still in flight is applied first (every rank alike)
    update = inner.update_rule
    if not isinstance(update, ReducibleLossUpdate):
        raise TypeError(f"stale_rows needs a sampler whose update is a ReducibleLossUpdate, got "
                        f"{type(update).__name__}")
    return update.stalest(count, among=inner.last_drawn_epoch >= 0)
