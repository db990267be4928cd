"""A group of `PrioritizedSampler`s stepped together: one draw and one feedback call for all of them.

Why: `MixtureSampler` with ``within="prioritized"`` keeps one sampler of single draws per source and, every batch,
draws from each source as many indices as slots picked it and feeds each source its examples' losses. Called
sampler by sampler, that is two Python calls per source per batch, each a few microseconds of checks and small
numpy steps around its kernels: with a handful of sources they cost more than the rest of the mixture's step
(issue 41). Here each is one compiled pass over the group, calling the samplers' own kernels
(`kernels.sampler.prioritized_draws`, `resolve_feedback`, `apply_feedback`) and the update's (`floored_values`),
so every rule is still written once; the Python left per sampler is its counters.

The compiled pass covers the common case, and the rest goes sampler by sampler, with the same result (tests/
mixing/test_reference.py checks both against a step-by-step reference): the draws when no sampler of the group is
in its warm-up pass or ends an epoch in this call (an epoch's end rescores unmeasured examples), the feedback
when every update is `LossValue` (weight = the loss) and no initializer watches feedback (`observes` /
`refreshes`).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from ..kernels.sampler import apply_feedback, group_single_draws, resolve_feedback
from ..strategies import LossValue
from ..strategies.updates import floored_values
from .prioritized import PrioritizedSampler


@njit(cache=True, nogil=True)
def _loss_feedback(counts, local, losses, last_drawn, seen, trees, layouts, weights, visits, measured, alphas, floors,
                   value_floors, updated):
    """`PrioritizedSampler.feedback(local, loss=losses)` for each sampler's group of checked entries (grouped
    by sampler, ascending; no epoch given, so all fresh), with `LossValue`'s rule; ``updated[k]``: the weights
    sampler k changed. Returns -1 - k when sampler k refuses an index (nothing after it changed), else 0."""
    positions = np.empty(local.shape[0], np.int64)
    start = 0
    for k in range(counts.shape[0]):
        c = counts[k]
        if c == 0:
            continue
        mine = local[start:start + c]
        bad, _, kept, _ = resolve_feedback(mine, last_drawn[k], -1, seen[k], positions)
        if bad >= 0:
            return -1 - k
        distinct = np.empty(kept, np.int64)
        values = np.empty(kept, np.float64)
        for q in range(kept):
            distinct[q] = mine[positions[q]]
            values[q] = losses[start + positions[q]]
        changed, new_weights = floored_values(values, value_floors[k])
        updated[k] = apply_feedback(trees[k], layouts[k], weights[k], visits[k], measured[k], alphas[k], floors[k],
                                    distinct, changed, new_weights, positions)
        start += c
    return 0


class SamplerGroup:
    """Samplers of single draws (batch_size 1) stepped together, in ascending order: `draw_singles` and
    `feedback_losses` do what each sampler's `_single_draws` and `feedback(indices, loss=...)` would, in turn.

    Each sampler's arrays (its tree's nodes, generator, weights, marks) and options are gathered once here: a
    sampler's `load_state_dict` writes into the arrays it has (the tree is cleared and refilled in place), so
    they stay its state. Its epoch (an int) is read at every call."""

    def __init__(self, samplers: Sequence[PrioritizedSampler]) -> None:
        self.samplers = list(samplers)
        bad = [k for k, s in enumerate(self.samplers) if s.batch_size != 1]
        if bad:
            raise ValueError(f"a sampler group draws one index per batch: sampler {bad[0]} has batch_size "
                             f"{self.samplers[bad[0]].batch_size}")
        group = self.samplers
        self.trees = tuple(s.tree.nodes for s in group)
        self.layouts = tuple(s.tree.layout for s in group)
        self.seen = tuple(s._seen for s in group)
        self.rngs = tuple(s.rng_state for s in group)
        self.last_drawn = tuple(s.last_drawn_epoch for s in group)
        self.weights = tuple(s.weights for s in group)
        self.visits = tuple(s.visits for s in group)
        self.measured = tuple(s.measured for s in group)
        self.n_leaves = np.array([s.tree.n_leaves for s in group], np.int64)
        self.sizes = np.array([s.num_examples for s in group], np.int64)
        self.uniform_fractions = np.array([s.uniform_fraction for s in group], np.float64)
        self.alphas = np.array([s.alpha for s in group], np.float64)
        self.floors = np.array([s.floor for s in group], np.float64)
        # the compiled feedback applies LossValue's rule; an initializer that watches feedback is called per sampler
        self.loss_values = all(type(s.update_rule) is LossValue and not s.init.observes and not s.init.refreshes
                               for s in group)
        self.value_floors = np.array([s.update_rule.floor for s in group], np.float64) if self.loss_values else None

    def draw_singles(self, counts: np.ndarray, out: np.ndarray) -> None:
        """``counts[k]`` draws of one index from sampler k, for every k, written to ``out`` grouped by sampler."""
        group, wanted = self.samplers, counts.tolist()
        active = [k for k, count in enumerate(wanted) if count]
        if any(group[k].in_warmup or group[k].position + wanted[k] >= group[k].num_examples for k in active):
            start = 0  # a warm-up pass or an epoch's end: sampler by sampler
            for k in active:
                group[k]._single_draws(out[start:start + wanted[k]])
                start += wanted[k]
            return
        n_uniform = np.zeros(len(group), np.int64)
        failed = group_single_draws(counts, self.rngs, self.trees, self.n_leaves, self.uniform_fractions,
                                    self.sizes, self.last_drawn, np.array([s.epoch for s in group], np.int64), out,
                                    n_uniform)
        uniform = n_uniform.tolist()
        for k in active:
            if failed and k == -1 - failed:
                raise ValueError("cannot sample: the total priority is 0")
            group[k].counters["uniform_draws"] += uniform[k]
            group[k]._advance(wanted[k], wanted[k])

    def feedback_losses(self, counts: np.ndarray, local: np.ndarray, losses: np.ndarray) -> None:
        """``feedback(local[group k], loss=losses[group k])`` to every sampler k with ``counts[k]`` entries, the
        groups in ascending order; the caller has checked them (int64 indices each sampler handed out, float64
        losses finite and >= 0)."""
        group = self.samplers
        if not self.loss_values:
            start = 0
            for k, count in enumerate(counts.tolist()):
                if count:
                    group[k].feedback(local[start:start + count], loss=losses[start:start + count])
                    start += count
            return
        updated = np.zeros(len(group), np.int64)
        failed = _loss_feedback(counts, local, losses, self.last_drawn, self.seen, self.trees, self.layouts,
                                self.weights, self.visits, self.measured, self.alphas, self.floors,
                                self.value_floors, updated)
        if failed:
            raise RuntimeError(f"sampler {-1 - failed} of the group refused indices its caller had checked")
        for k, count in enumerate(updated.tolist()):
            group[k].counters["updated"] += count
