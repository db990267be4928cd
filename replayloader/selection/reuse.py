"""`ReusedPool`: one scored candidate pool feeds m consecutive training steps, so scoring costs 1/m per step.

Why: a selection step scores n_B candidates to train n_b of them, so each trained row pays n_B / n_b forward rows
of scoring on top of its own forward + backward (docs/selection.md, "Cost model"). The scores of a pool stay
useful for a few steps: the model moves little in m steps, so the rows ranked highest now are still among the
highest after m - 1 updates (the stale-loss idea of SelectiveBackprop's variants). Handing out the pool's top
m·n_b rows over m steps divides the scoring cost per trained row by m: n_B / (m·n_b) forward rows.

Two ways to hand a pool out (``rerank``):

- ``rerank=False`` (default): the rule picks m·n_b rows once (TopK: the m·n_b highest scores, highest first;
  Proportional: m·n_b draws), and step j trains rows j·n_b ... (j+1)·n_b - 1 of that list.
- ``rerank=True``: each step the rule picks n_b rows among the rows not handed out yet, by their stale scores
  (Proportional then draws without repeating a row across the pool's steps, and its importance weights are
  relative to the remaining rows). For TopK both give the same rows (tested).

A short pool (the last candidate batch of a shuffled pass, s < m·n_b rows: 37 with m = 4, n_b = 32) hands out
what it holds, n_b rows per step: its plan has min(s, m·n_b) rows (TopK: all s, best first; Proportional: s
draws), so it gives ceil(s / n_b) <= m steps, the last one short (32 and 5 rows for 37). Why not refuse it:
every warm-up pass whose length is not a multiple of n_B ends in one, as the plain `Selector`'s short batch
(min(n_b, s) rows) does, and a loop should not fail at the end of a pass. Why not drop its rest: the step
counts are the Trainer's too (`PooledCandidateBatchSampler.steps_of`), and a changed count would desynchronise
them. Full steps only: a pool count that divides the pass (n_B divides N), or draws with replacement
(``warmup_epochs=0``), never short.

It wraps a `Selector` and is one (`WrappedSelector`), so it goes wherever a selector goes. ``choose`` (or
``choose_split`` under DDP) scores a new pool and returns its first step; `next_step` / `steps` hand out the
others; choosing again while steps are left is refused. The chosen positions index the fetched candidate batch,
which the loop keeps in memory for the pool's m steps (nothing is fetched again).

Checkpoints resume exactly mid-pool: the state holds the pool (stale scores, candidate indices, the plan, how
many steps were handed out). After a resume mid-pool the candidate rows are no longer in memory: fetch them again
with `candidate_indices` (the positions index that batch), then take the remaining steps. Between pools
(``pending_steps == 0``) the state holds no pool and resumes on any number of ranks; mid-pool it resumes on the
number of slices (ranks) that scored the pool.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _checks as checks
from ..state.checks import array, counters as counter_fields, field, integer, require
from .rules import Selection, Selector
from .wrapped import WrappedSelector


@dataclass
class _Slice:
    """One slice's pool: every candidate's stale score, index and own weight, and the plan. ``plan`` holds
    positions in hand-out order (``rerank=False``: all planned rows; ``rerank=True``: the rows handed out so far)
    with their importance weights ``plan_weights`` (the rule's times the candidate's own)."""

    scores: np.ndarray
    indices: np.ndarray | None
    weights: np.ndarray | None
    probabilities: np.ndarray | None
    plan: np.ndarray
    plan_weights: np.ndarray


class ReusedPool(WrappedSelector):
    """Score one candidate pool, train on it for ``steps`` (m) steps of n_b = ``selector.rule.k`` rows.

    Experimental: no measurement in this repository yet shows it paying for itself; it may change or go until
    one does (docs/selection.md, "Experimental levers").

    Args:
        selector: a `Selector` whose rule picks a fixed k (`TopK`, `Proportional`); `SelectiveBackprop` keeps a
            varying number of rows and is refused.
        steps: m, training steps per scored pool (m·n_b must not exceed n_B, checked against the candidate batch
            size; a short last batch of a pass gives ceil(s / n_b) steps of n_b rows, the last one short).
        rerank: re-apply the rule to the remaining rows each step (see the module doc); default: one pick of
            m·n_b rows, handed out n_b at a time.

    ``stats()`` adds ``pools``, ``steps_handed``, ``steps_per_pool``, ``pending_steps``; its
    ``forward_rows_per_trained_row`` is n_B / (m·n_b) once pools are used up.
    """

    part = "pool"

    def __init__(self, selector: Selector, *, steps: int, rerank: bool = False) -> None:
        super().__init__(selector)
        self.steps_per_pool = checks.integer("steps", steps, 1)
        if not isinstance(rerank, bool):
            raise ValueError(f"rerank must be True or False, got {rerank!r}")
        if selector.rule.k is None:
            raise ValueError(f"ReusedPool needs a rule that picks a fixed k (TopK, Proportional); "
                             f"{type(selector.rule).__name__} keeps a varying number of rows")
        self.rerank = rerank
        self.slices: list[_Slice] = []
        self.handed = 0  # steps of the current pool handed out
        self.pool_steps = 0  # steps the current pool gives
        self.pool_counters = {"pools": 0, "steps_handed": 0}

    @property
    def pending_steps(self) -> int:
        """Steps of the current pool not handed out yet (0: the next call scores a new pool)."""
        return self.pool_steps - self.handed

    def check_candidates(self, candidate_size: int, num_examples: int | None = None) -> None:
        super().check_candidates(candidate_size, num_examples)
        k = self.rule.k
        if self.steps_per_pool * k > candidate_size:
            m = self.steps_per_pool
            raise ValueError(f"steps x k (m * n_b) = {m} x {k} = {m * k} exceeds the candidate batch size (n_B) = "
                             f"{candidate_size}: a pool must hold the rows of its m steps")

    # ------------------------------------------------------------------ a new pool
    def choose_split(self, losses: Sequence[Any], indices: Sequence[Any] | None = None,
                     candidate_weights: Sequence[Any] | None = None,
                     before_commit: Callable[[list[Selection]], None] | None = None,
                     short_batch: bool = False) -> list[Selection]:
        """Score a new pool (one slice per rank, as `Selector.choose_split`) and return every slice's first step.
        ``before_commit`` (e.g. the sampler refresh of `ScoreThenSelect`) sees the whole plan's selections.
        Refused while the current pool has steps left. Bad input raises and changes nothing."""
        if self.pending_steps:
            raise ValueError(f"the current pool still has {self.pending_steps} of its {self.pool_steps} steps: take "
                             f"them with next_step() (or steps()) before scoring another candidate batch")
        checked = self._checked_slices(losses, indices, candidate_weights, short_batch)
        per_slice = self.rule.k // len(checked)
        take = per_slice if self.rerank else self.steps_per_pool * per_slice
        planned = self._pick(checked, take, before_commit)
        # from here on nothing can fail
        slices = []
        for (scores, slice_indices, slice_weights), selection in zip(checked, planned):
            slices.append(_Slice(scores, slice_indices, slice_weights, selection.probabilities,
                                 selection.positions, selection.weights))
        rows = [len(s.scores) for s in slices]
        if self.rerank:
            pool_steps = max(min(self.steps_per_pool, math.ceil(n / per_slice)) for n in rows)
        else:
            pool_steps = max(math.ceil(len(s.plan) / per_slice) for s in slices)
        self.slices, self.handed, self.pool_steps = slices, 0, pool_steps
        self.counters["batches"] += 1
        self.counters["scored"] += sum(rows)
        self.pool_counters["pools"] += 1
        return self._hand_out(planned if self.rerank else None)

    # ------------------------------------------------------------------ the pool's steps
    def next_step(self, *, rank: int = 0, world_size: int = 1) -> Selection:
        """The next step of the current pool: ``rank``'s rows (positions into its slice of the candidate batch).
        Under DDP every rank calls it once per step with its rank and the world size (the pool's state advances
        alike on every rank). Raises when no step is left, or when the pool was scored in another number of
        slices (a mid-pool checkpoint resumed on another world size)."""
        if not self.pending_steps:
            raise ValueError("no step is left in the pool: score the next candidate batch with choose()")
        checks.integer("world_size", world_size, 1)
        if world_size != len(self.slices):
            raise ValueError(f"the pool was scored in {len(self.slices)} slices (ranks) but world_size is "
                             f"{world_size}: a checkpoint taken mid-pool resumes on the same number of ranks "
                             f"(checkpoint between pools, pending_steps == 0, to change it)")
        checks.integer("rank", rank, 0, world_size - 1)
        return self._hand_out(None)[rank]

    def steps(self, first: Selection | None = None, *, rank: int = 0,
                      world_size: int = 1) -> Iterator[Selection]:
        """``first`` (what ``choose`` returned), then every remaining step of the pool: ``for chosen in
        pool.steps(batches.choose(candidates, scores)): ...``. After a resume mid-pool, call it without
        ``first`` for the remaining steps."""
        if first is not None:
            yield first
        while self.pending_steps:
            yield self.next_step(rank=rank, world_size=world_size)

    def candidate_indices(self, rank: int = 0) -> np.ndarray:
        """The dataset indices of the current pool's candidates (``rank``'s slice): fetch these rows again after
        a resume mid-pool; the steps' positions index them."""
        if not self.slices:
            raise ValueError("there is no current pool (pending_steps == 0)")
        checks.integer("rank", rank, 0, len(self.slices) - 1)
        found = self.slices[rank].indices
        if found is None:
            raise ValueError("the pool's candidates came without dataset indices")
        return found.copy()

    def _hand_out(self, first: list[Selection] | None) -> list[Selection]:
        """Every slice's rows for step ``self.handed`` (``first``: step 0 of a reranked pool, already picked);
        advances the pool and the counters."""
        k = self.rule.k // len(self.slices)
        step = self.handed
        if self.rerank and first is None:
            remaining = [np.setdiff1d(np.arange(len(s.scores)), s.plan) for s in self.slices]
            checked = [(s.scores[r], None if s.indices is None else s.indices[r],
                        None if s.weights is None else s.weights[r]) for s, r in zip(self.slices, remaining)]
            picked = self._pick(checked, k, None)
            out = []
            for s, r, sel in zip(self.slices, remaining, picked):
                positions = r[sel.positions]
                probabilities = None
                if sel.probabilities is not None:
                    probabilities = np.zeros(len(s.scores))
                    probabilities[r] = sel.probabilities
                s.plan = np.concatenate([s.plan, positions])
                s.plan_weights = np.concatenate([s.plan_weights, sel.weights])
                out.append(Selection(positions, sel.indices, sel.weights, s.scores, probabilities))
        elif self.rerank:
            out = first
        else:
            out = []
            for s in self.slices:
                positions = s.plan[step * k:(step + 1) * k]
                out.append(Selection(positions, None if s.indices is None else s.indices[positions],
                                     s.plan_weights[step * k:(step + 1) * k], s.scores, s.probabilities))
        self.handed += 1
        self.counters["selected"] += sum(len(s) for s in out)
        self.pool_counters["steps_handed"] += 1
        if not self.pending_steps:
            self.slices = []  # used up: between pools the state holds no pool (any world size resumes it)
        return out

    # ------------------------------------------------------------------ stats, checkpoint
    def stats(self) -> dict[str, float]:
        return {**super().stats(), **self.pool_counters, "steps_per_pool": self.steps_per_pool,
                "pending_steps": self.pending_steps}

    def _part_state(self) -> dict:
        def opt(a):
            return np.zeros(0) if a is None else a.copy()

        return {"steps": self.steps_per_pool, "rerank": self.rerank, "handed": self.handed,
                "pool_steps": self.pool_steps, "counters": dict(self.pool_counters),
                "slices": [{"scores": s.scores.copy(), "indices": np.zeros(0, np.int64) if s.indices is None
                            else s.indices.copy(), "weights": opt(s.weights), "probabilities": opt(s.probabilities),
                            "has": np.array([s.indices is not None, s.weights is not None,
                                             s.probabilities is not None]),
                            "plan": s.plan.copy(), "plan_weights": s.plan_weights.copy()} for s in self.slices]}

    def _checked_part(self, state: Any, where: str) -> tuple:
        for key, mine in (("steps", self.steps_per_pool), ("rerank", self.rerank)):
            require(field(state, key, where) == mine,
                    f"checkpoint has {key}={state[key]!r} but this ReusedPool has {key}={mine!r}")
        pool_steps = integer(state, "pool_steps", where, 0)
        handed = integer(state, "handed", where, 0, pool_steps)
        counts = counter_fields(state, "counters", where, self.pool_counters)
        saved = field(state, "slices", where)
        require(isinstance(saved, (list, tuple)), f"{where}['slices'] must be a list, got {type(saved).__name__}")
        require(len(saved) == 0 if handed == pool_steps else len(saved) > 0,
                f"{where}['slices'] must hold the pool's slices while steps are left ({pool_steps - handed}), and "
                f"none after (got {len(saved)})")
        slices = []
        for number, entry in enumerate(saved):
            at = f"{where}['slices'][{number}]"
            scores = array(entry, "scores", at, (-1,), "f", np.float64)
            n = len(scores)
            require(n > 0 and bool(np.isfinite(scores).all()), f"{at}['scores'] must be non-empty and finite")
            has = array(entry, "has", at, (3,), "b", np.bool_)
            indices = array(entry, "indices", at, (n if has[0] else 0,), "iu", np.int64)
            weights = array(entry, "weights", at, (n if has[1] else 0,), "fiu", np.float64)
            probabilities = array(entry, "probabilities", at, (n if has[2] else 0,), "fiu", np.float64)
            plan = array(entry, "plan", at, (-1,), "iu", np.int64)
            require(bool(((plan >= 0) & (plan < n)).all()), f"{at}['plan'] must hold positions in [0, {n})")
            plan_weights = array(entry, "plan_weights", at, plan.shape, "fiu", np.float64)
            require(bool(np.isfinite(plan_weights).all()), f"{at}['plan_weights'] must be finite")
            slices.append(_Slice(scores, indices if has[0] else None, weights if has[1] else None,
                                 probabilities if has[2] else None, plan, plan_weights))
        return slices, handed, pool_steps, counts

    def _load_part(self, checked: tuple) -> None:
        self.slices, self.handed, self.pool_steps, self.pool_counters = checked
