"""DistributedScoreThenSelect: score-then-select across the ranks of a torch.distributed job.

Optional module (torch is imported by the `DistributedPrioritizedSampler` it coordinates). It chooses nothing
itself: the rule is `Selector.choose_split` (selection.py) and the candidates come from the shared sampler; this
module only moves the scores between ranks and applies the result on every rank alike.

Per step, with W ranks, n_B candidates (the shared sampler's ``batch_size``) and n_b chosen rows (the rule's k):

- the global candidate batch is drawn once, identically on every rank (the shared sampler's draw); each rank
  takes its disjoint share of n_B / W candidates (positions rank, rank + W, ...), which its own DataLoader
  workers fetch, and scores only those with one no-grad forward pass;
- each rank chooses n_b / W rows among its OWN candidates: top-k is top-k within the rank's slice, not of the
  whole candidate batch. A global choice would need every rank to fetch and score all n_B candidates, or would
  leave the ranks with different numbers of rows, and DDP needs balanced ranks;
- the scores of all ranks travel in one small ``all_gather`` (n_B / W float64 per rank plus a 9-word header), so
  every rank runs the same `Selector.choose_split` over all slices (the selector's generator and
  SelectiveBackprop's history advance identically) and the same refresh of the shared tree with the whole
  candidate batch's scores: trees and selectors stay bit-identical on every rank (`verify_identical` checks).
  2 ranks x (n_B / 2, n_b / 2) therefore give exactly what 1 process gives that applies the per-slice rule
  (2 slices) to the same global candidate batch (tested).

The warm-up pass's short last candidate batch is padded like the sampler's (repeated first candidates), so every
rank scores the same number; a padded repeat's score refreshes nothing (its first copy's does), and a repeated
candidate may be chosen on two ranks (trained twice in that one step). Rules without a fixed k
(SelectiveBackprop) keep a varying number of rows per rank, as in one process.

Checkpoint: `state_dict` holds the shared sampler and the selector, the same on every rank and the same format
as the one-process `ScoreThenSelect`, so one file (`save_shared_state`) resumes on any world size.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .sampler import DistributedPrioritizedSampler, RankBatch, described, share_positions
from .state_files import state_digest
from ..selection.score_then_select import refresh_values
from ..selection.rules import Selection, Selector, SelectorLike
from .._arrays import to_numpy

_HEADER = 9  # status, candidate step, slice length, then the sampler's 6 step words


class DistributedScoreThenSelect:
    """Candidates from a `DistributedPrioritizedSampler` (its ``batch_size`` is the global n_B), rows chosen by a
    `Selector` whose k is the global n_b; each rank trains n_b / W rows of its own n_B / W candidates.

    Build it on every rank (a collective) with the same selector (rule, score, seed). ``refresh=False``: the
    scores do not touch the sampler's weights.
    """

    def __init__(self, sampler: DistributedPrioritizedSampler, selector: Selector, *,
                 refresh: bool = True) -> None:
        if not isinstance(sampler, DistributedPrioritizedSampler):
            raise TypeError(f"sampler must be a DistributedPrioritizedSampler, got {type(sampler).__name__}")
        if not isinstance(selector, SelectorLike):
            raise TypeError(f"selector must be a Selector (or a SelectorLike: rule, score, check_candidates, choose, "
                            f"choose_split, stats, state_dict, load_state_dict), got {type(selector).__name__}")
        self.shared, self.selector, self.refresh = sampler, selector, bool(refresh)
        self.world, self.rank, self.world_size = sampler.world, sampler.rank, sampler.world_size
        self.world.agree(self._check_sizes, "DistributedScoreThenSelect")
        self.world.require_same(_fingerprint(selector), "Selector",
                                "build the same selector with the same seed on every rank (seed=None gives each "
                                "its own)")
        self.row_width = _HEADER + sampler.local_batch_size  # int64 words each rank sends per step
        self.counters = {"score_gathers": 0, "gathered_bytes": 0}

    def _check_sizes(self) -> None:
        inner, k = self.shared.sampler, self.selector.rule.k
        self.selector.check_candidates(inner.batch_size, inner.num_examples)
        if k is not None and k % self.world_size:
            raise ValueError(f"k (n_b) = {k} is not divisible by the world size {self.world_size}: each rank "
                             f"trains n_b / world_size rows of its own candidates")

    @property
    def sampler(self) -> DistributedPrioritizedSampler:
        return self.shared

    def next_candidates(self) -> RankBatch:
        """This rank's share of the next global candidate batch (fetch these, score them, then `choose`)."""
        return self.shared.next_batch()

    def choose(self, candidates: RankBatch, losses: Any) -> Selection:
        """Collective (every rank calls it once per candidate batch): the rows of this rank's ``candidates`` to
        train on, from their training ``losses`` (shape (n_B / W,)). Positions index this rank's candidates.

        Bad input on any rank (a batch that is not this sampler's share, losses of the wrong shape, not finite)
        raises on every rank and changes nothing anywhere; ranks that drew different batches raise too.
        """
        self.shared.settle()
        row = np.zeros(self.row_width, np.int64)
        row[3:_HEADER] = self.shared.step_words()
        try:
            scores = self._local_losses(candidates, losses)
            row[1], row[2] = candidates.step, len(scores)
            row[_HEADER:_HEADER + len(scores)] = scores.view(np.int64)
        except (ValueError, TypeError) as exc:
            row[0], rejected = 1, exc
        table = self.world.all_gather_rows(row)
        self.counters["score_gathers"] += 1
        self.counters["gathered_bytes"] += table.nbytes
        if row[0]:
            raise rejected
        failed = np.flatnonzero(table[:, 0])
        if len(failed):
            raise ValueError(f"rank {failed[0]} rejected its losses (its own error says why); nothing changed")
        self.shared.check_in_step(table[:, 3:_HEADER])
        if len(set(table[:, 1])) > 1:
            raise RuntimeError(f"the ranks scored different candidate batches (steps {table[:, 1].tolist()}); "
                               f"every rank calls choose once per candidate batch, in order")
        return self._choose_all(candidates.whole, table)[self.rank]

    def _local_losses(self, candidates: Any, losses: Any) -> np.ndarray:
        """This rank's losses as float64, checked to fit its share (the rest is checked after the gather, on
        every rank alike)."""
        if not isinstance(candidates, RankBatch) or candidates.whole is None:
            raise TypeError(f"candidates must be the RankBatch this rank's sampler drew, got "
                            f"{type(candidates).__name__}")
        arr = to_numpy(losses, "losses")
        if arr.shape != (len(candidates),) or arr.dtype.kind not in "fiu":
            raise ValueError(f"losses must have shape ({len(candidates)},), one number per candidate of this "
                             f"rank's share, got dtype {arr.dtype} shape {arr.shape}")
        return np.ascontiguousarray(arr, np.float64)

    def _choose_all(self, whole: Any, table: np.ndarray) -> list[Selection]:
        """Every rank's selection, computed alike on every rank; the refresh runs before the selector commits."""
        length = len(whole)
        shares = [share_positions(length, rank, self.world_size) for rank in range(self.world_size)]
        losses = [table[rank, _HEADER:_HEADER + table[rank, 2]].copy().view(np.float64)
                  for rank in range(self.world_size)]

        def refresh(selections: list[Selection]) -> None:
            scores = np.empty(length)
            for rank, (positions, selection) in enumerate(zip(shares, selections)):
                first = np.arange(rank, rank + self.world_size * len(positions), self.world_size) < length
                scores[positions[first]] = selection.scores[first]  # a padded repeat: its first copy's score
            self.shared.sampler.feedback(whole, loss=refresh_values(scores))

        return self.selector.choose_split(losses, [whole.indices[p] for p in shares],
                                          [whole.weights[p] for p in shares], refresh if self.refresh else None,
                                          short_batch=length < self.shared.sampler.batch_size)

    def state_dict(self) -> dict:
        """The shared sampler's and the selector's state: the same on every rank, any world size loads it."""
        return {"sampler": self.shared.state_dict(), "selector": self.selector.state_dict()}

    def load_state_dict(self, state: Mapping) -> None:
        """Collective: restore both on every rank; if any rank rejects either part, no rank changes."""
        before = self.selector.state_dict()
        try:
            self.world.agree(lambda: self.selector.load_state_dict(state["selector"]), "loading the selector")
            self.shared.load_state_dict(state["sampler"])
        except BaseException:
            self.selector.load_state_dict(before)
            raise


def _fingerprint(selector: Selector) -> dict[str, str]:
    """What must be equal on every rank, by name: rule, score, the irreducible losses if any, generator and memory."""
    irreducible = getattr(selector.score, "irreducible", None)
    return {"rule": described(selector.rule), "score": described(selector.score),
            "irreducible losses": state_digest({"irreducible": np.zeros(0) if irreducible is None else irreducible}),
            "generator and memory": state_digest({"selector": selector.state_dict()})}
