"""Score-then-select over a fixed dataset (`ScoreThenSelect`) or a replay buffer (`BufferScoreThenSelect`).

Each step draws a candidate batch of n_B examples, the training loop scores it with one no-grad forward pass,
and a `Selector` picks the n_b rows to train on. The scores also refresh the weights candidates are drawn by
(a `PrioritizedSampler`'s tree, or the buffer's): a candidate's new weight is its score, clipped at 0, fed back
as ``loss=`` through the sampler's or buffer's own update rule (default `LossValue`: weight = the value).

Cost model per step: one forward over n_B rows without gradients (the scoring pass), one forward + backward over
the n_b chosen rows, and O(n_B log n_B) host work for the choice. The chosen rows are already in memory (they
were fetched as candidates), so nothing is fetched twice. The training forward recomputes the chosen rows'
outputs with gradients; reusing the scoring pass's outputs would need a gradient-enabled forward over all n_B.
"""
from __future__ import annotations

import warnings

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..buffer.protocol import BufferLike
from ..buffer.replay_buffer import Sample
from ..loader.replay_loader import ReplayDataLoader
from ..sampler.prioritized import PrioritizedSampler, SampledBatch
from .rules import Selection, Selector, SelectorLike


def refresh_values(scores: np.ndarray) -> np.ndarray:
    """The weight feedback of scored candidates: each candidate's score, clipped at 0 (the sampler's and buffer's
    weights are >= 0; a negative reducible loss means "nothing left to learn here")."""
    return np.maximum(scores, 0.0)


class ScoreThenSelect:
    """Candidates from a `PrioritizedSampler` (its ``batch_size`` is n_B), rows chosen by a `Selector`.

    Uniform candidates: a sampler with ``alpha=0`` (shuffled passes while in warm-up, then uniform draws);
    candidates by the current weights: ``alpha > 0``. With ``refresh=False`` the scores do not touch the sampler.
    """

    def __init__(self, sampler: PrioritizedSampler, selector: Selector, *, refresh: bool = True) -> None:
        if not isinstance(sampler, PrioritizedSampler):
            raise TypeError(f"sampler must be a PrioritizedSampler, got {type(sampler).__name__}")
        if not isinstance(selector, SelectorLike):
            raise TypeError(f"selector must be a Selector (or a SelectorLike: rule, score, check_candidates, choose, "
                            f"choose_split, stats, state_dict, load_state_dict), got {type(selector).__name__}")
        selector.check_candidates(sampler.batch_size, sampler.num_examples)
        self.sampler, self.selector, self.refresh = sampler, selector, bool(refresh)

    def next_candidates(self) -> SampledBatch:
        """The next candidate batch of n_B dataset indices (fetch these, score them, then call `choose`)."""
        return self.sampler.next_batch()

    def choose(self, candidates: SampledBatch, losses: Any) -> Selection:
        """The rows of ``candidates`` to train on, from their training ``losses`` (shape (n_B,)). The selection's
        weights include the candidates' own importance weights. The short last batch of a shuffled pass (fewer
        than n_B candidates) gives min(n_b, its size) rows. Bad input raises and changes nothing."""
        if not isinstance(candidates, SampledBatch):
            raise TypeError(f"candidates must be the SampledBatch the sampler drew, got {type(candidates).__name__}")
        refresh = ((lambda s: self.sampler.feedback(candidates, loss=refresh_values(s.scores))) if self.refresh
                   else None)
        short = len(candidates) < self.sampler.batch_size  # the last batch of a shuffled pass
        return self.selector.choose(losses, candidates.indices, candidates.weights, before_commit=refresh,
                                    short_batch=short)

    def state_dict(self) -> dict:
        """The sampler's and the selector's state (a torch DataLoader's prefetched batches are kept by
        `replayloader.torch.candidates.CandidateBatchSampler.state_dict` instead)."""
        return {"sampler": self.sampler.state_dict(), "selector": self.selector.state_dict()}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore both; if either rejects its part, neither changes."""
        load_together(self.selector, state["selector"], lambda: self.sampler.load_state_dict(state["sampler"]))


def load_together(selector: Selector, selector_state: Mapping, load_rest: Callable[[], None]) -> None:
    """Load ``selector_state``, then ``load_rest()``; if that raises, the selector goes back to where it was."""
    before = selector.state_dict()
    selector.load_state_dict(selector_state)
    try:
        load_rest()
    except BaseException:
        selector.load_state_dict(before)
        raise


class BufferScoreThenSelect:
    """Choose among buffered examples by fresh scores: sample n_B from a `ReplayBuffer` (or take a
    `ReplayDataLoader`'s batch of n_B), score them, choose n_b, and feed every candidate's score back.

    ``target``: a `ReplayDataLoader` (its buffer is sampled and updated under the loader's lock), or any
    `BufferLike`: a `ReplayBuffer`, a `LockedBuffer`, Ray's `RemoteBuffer` / `ShardedBuffer`.
    ``candidate_size``: n_B, the pool `next_candidates` samples. It is given here, once, as `ScoreThenSelect`'s
    pool is its sampler's batch size, so both classes draw a pool with ``next_candidates()`` (0.1 passed it to
    every call; that still works for one release, with a DeprecationWarning).
    """

    def __init__(self, target: Any, selector: Selector, *, candidate_size: int | None = None,
                 refresh: bool = True) -> None:
        if not isinstance(selector, SelectorLike):
            raise TypeError(f"selector must be a Selector (or a SelectorLike: rule, score, check_candidates, choose, "
                            f"choose_split, stats, state_dict, load_state_dict), got {type(selector).__name__}")
        if not isinstance(target, (ReplayDataLoader, BufferLike)):  # any buffer: local, locked, Ray's, yours
            raise TypeError(f"target must be a ReplayDataLoader or a buffer (a BufferLike: sample, feedback, "
                            f"state_dict, ...), got {type(target).__name__}")
        if candidate_size is not None:
            selector.check_candidates(candidate_size)
        self.buffer = target.shared if isinstance(target, ReplayDataLoader) else target  # the loader's lock
        self.selector, self.refresh, self.candidate_size = selector, bool(refresh), candidate_size

    def next_candidates(self, candidate_size: int | None = None) -> Sample:
        """n_B = ``candidate_size`` (given at construction) examples sampled from the buffer by its weights (or
        take a `ReplayDataLoader`'s batches of n_B: the same draw)."""
        if candidate_size is not None:
            warnings.warn("BufferScoreThenSelect.next_candidates(candidate_size) is deprecated since replayloader "
                          "1.0 and will be removed in the next release: give candidate_size= to the constructor "
                          "and call next_candidates()", DeprecationWarning, stacklevel=2)
        elif self.candidate_size is None:
            raise ValueError("candidate_size is not set: give BufferScoreThenSelect(..., candidate_size=n_B)")
        size = self.candidate_size if candidate_size is None else candidate_size
        self.selector.check_candidates(size)
        return self.buffer.sample(size)

    def choose(self, candidates: Sample, losses: Any, indices: Any = None) -> Selection:
        """The rows of ``candidates`` to train on. ``indices``: the candidates' dataset indices when the score
        needs them (e.g. a stored ``index`` field for `ReducibleLoss`); the selection's ``indices`` are then
        those, else None. Bad input raises and changes nothing."""
        if not isinstance(candidates, Sample):
            raise TypeError(f"candidates must be a Sample or ReplayBatch, got {type(candidates).__name__}")
        refresh = ((lambda s: self.buffer.feedback(candidates.ids, loss=refresh_values(s.scores))) if self.refresh
                   else None)
        return self.selector.choose(losses, indices, candidates.weights, before_commit=refresh)

    def state_dict(self) -> dict:
        """The selector's state (the buffer or loader checkpoints itself)."""
        return self.selector.state_dict()

    def load_state_dict(self, state: Mapping) -> None:
        self.selector.load_state_dict(state)
