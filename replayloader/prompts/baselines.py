"""Baselines users compare a prompt sampler against, inside the library so the comparison uses one code path.

Both act *after* generation, on the groups a batch produced, which is what distinguishes them from
`PromptSampler` (which acts before, on which prompts to generate for):

- `OnlineFilter`: keep the groups whose mean reward lies strictly inside a band (default (0, 1): for 0/1 rewards,
  drop every all-solved and all-failed group); the batch shrinks by what it drops.
- `DynamicSampling` (DAPO's dynamic sampling): draw prompts in shuffled passes, over-sampled, drop the groups
  with zero reward variance, and keep drawing until ``batch_size`` groups with signal are gathered (the surplus
  of the last draw trimmed: a batch holds exactly ``batch_size``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import _checks as checks
from ..kernels.rng import seed_state, uniforms
from ..state.checks import array, check_header, counters, integer, require, rng_words
from .groups import read_groups
from .sampler import PromptBatch

STATE_VERSION = 1


class OnlineFilter:
    """Keep a group when its mean reward m satisfies ``low < m < high``.

    Why a band and not only "variance > 0": with 0/1 rewards the default band (0, 1) is exactly the zero-variance
    filter, and a narrower band (e.g. 0.2, 0.8, as in PRIME's online filtering) also drops groups whose few
    informative completions barely move the policy.

    Example:
        >>> import numpy as np
        >>> OnlineFilter().feedback(np.array([3, 7]), rewards=np.array([[1, 1, 1, 1], [1, 0, 0, 1]]))
        array([False,  True])
    """

    def __init__(self, *, low: float = 0.0, high: float = 1.0, group_size: int | None = None) -> None:
        self.low = checks.number("low", low)
        self.high = checks.number("high", high)
        if not self.low < self.high:
            raise ValueError(f"low must be below high, got low={self.low!r}, high={self.high!r}")
        self.group_size = checks.optional_integer("group_size", group_size, 2)
        self.counters = {"feedback_calls": 0, "groups": 0, "kept": 0}

    def feedback(self, prompt_indices: Any, *, rewards: Any) -> np.ndarray:
        """Which groups to train on (bool, one per group), from ``prompt_indices`` and ``rewards`` in either
        layout of `read_groups`. Bad input raises a ValueError naming the argument, and nothing is counted."""
        idx, values = read_groups(prompt_indices, rewards, group_size=self.group_size, binary=False,
                                  num_prompts=None)
        mean = values.mean(axis=1)
        keep = (mean > self.low) & (mean < self.high)
        self.counters["feedback_calls"] += 1
        self.counters["groups"] += len(idx)
        self.counters["kept"] += int(keep.sum())
        return keep

    def stats(self) -> dict[str, Any]:
        groups = self.counters["groups"]
        return {**self.counters, "frac_kept": self.counters["kept"] / groups if groups else 0.0}

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "config": {"low": self.low, "high": self.high,
                                                     "group_size": self.group_size},
                "counters": dict(self.counters)}

    def load_state_dict(self, state: Mapping) -> None:
        where = check_header(state, STATE_VERSION, self.state_dict()["config"], "online filter")
        self.counters = counters(state, "counters", where, self.counters)


class DynamicSampling:
    """DAPO's dynamic sampling: over-sample, drop zero-variance groups, refill until the batch is full.

    Each `next_batch` draws ``ceil(need × oversample)`` prompts (``need``: groups still missing from the current
    training batch) from shuffled passes over the prompt set (each prompt once per pass, as TRL's
    ``RepeatSampler`` draws; the prompts of one draw are distinct). `feedback` says which of the drawn groups
    have reward variance, and counts them toward the batch; once ``batch_size`` are kept (or after
    ``max_rounds`` draws, DAPO's ``max_num_gen_batches``) the batch is `full`, and the next draw starts a new one.
    A batch never holds more than ``batch_size`` groups: as DAPO keeps generating until it has at least
    ``batch_size`` groups with signal and then trims to ``batch_size``, `feedback` keeps the first ``need``
    groups with variance (in the order given) and marks the surplus False (counted as ``trimmed``; ``dropped``
    counts the zero-variance groups).

    Why it is a baseline and not the answer: every dropped group was generated and paid for; a prioritized
    sampler tries not to generate it in the first place.

    Each `next_batch` gets exactly one `feedback`, for all of its prompts (in any order): a second draw before the
    feedback, a feedback without a draw, or one for other prompts raises, and nothing changes. ``oversample`` and
    ``max_rounds`` may differ when a checkpoint is loaded (they shape the rounds to come; the draw stream, the
    prompts and the seed must match).

    Args:
        num_prompts: N.
        batch_size: groups with signal per training batch.
        oversample: the factor a draw over-samples the missing groups by (≥ 1).
        max_rounds: draws per training batch before it is declared full anyway (None: until filled).
        group_size: G, needed for rewards given one per completion.
        seed: the generator's seed (its state is checkpointed).

    Example:
        >>> import numpy as np
        >>> dynamic = DynamicSampling(50, 4, oversample=2.0, group_size=2, seed=0)
        >>> while not dynamic.full:
        ...     batch = dynamic.next_batch()
        ...     keep = dynamic.feedback(batch.indices, rewards=np.tile([[0.0, 1.0], [1.0, 1.0]], (4, 1))[:len(batch)])
        >>> dynamic.kept
        4
    """

    def __init__(self, num_prompts: int, batch_size: int, *, oversample: float = 1.0, max_rounds: int | None = None,
                 group_size: int | None = None, seed: int = 0) -> None:
        self.num_prompts = checks.integer("num_prompts", num_prompts, 1)
        self.batch_size = checks.integer("batch_size", batch_size, 1)
        self.oversample = checks.number("oversample", oversample, 1.0)
        if math.ceil(self.batch_size * self.oversample) > self.num_prompts:
            raise ValueError(f"batch_size × oversample = {math.ceil(self.batch_size * self.oversample)} prompts a "
                             f"draw, more than num_prompts={self.num_prompts} (a draw's prompts are distinct)")
        self.max_rounds = checks.optional_integer("max_rounds", max_rounds, 1)
        self.group_size = checks.optional_integer("group_size", group_size, 2)
        self.seed = checks.integer("seed", seed, 0)
        self.rng_state = seed_state(self.seed)
        self.order = self._permutation()
        self.position = 0
        self.step = 0
        self.kept = 0
        self.rounds = 0
        self.last_drawn = np.full(self.num_prompts, -1, np.int64)
        self.pending: np.ndarray | None = None  # the last draw, until its feedback
        self.counters = {"drawn": 0, "groups": 0, "kept": 0, "dropped": 0, "trimmed": 0, "batches": 0, "passes": 0}

    def _permutation(self) -> np.ndarray:
        return np.argsort(uniforms(self.rng_state, self.num_prompts), kind="stable")

    @property
    def need(self) -> int:
        """Groups with signal still missing from the current training batch."""
        return max(0, self.batch_size - self.kept)

    @property
    def full(self) -> bool:
        """The current training batch has its ``batch_size`` groups, or ran out of rounds."""
        return self.need == 0 or (self.max_rounds is not None and self.rounds >= self.max_rounds)

    def next_batch(self) -> PromptBatch:
        """The next prompts to generate for (a new training batch starts when the current one is `full`)."""
        if self.pending is not None:
            raise RuntimeError(f"the last draw's {len(self.pending)} prompts have had no feedback yet: each "
                               f"next_batch() gets one feedback(...) before the next draw")
        if self.full:
            self.kept = self.rounds = 0
            self.counters["batches"] += 1
        size = math.ceil(self.need * self.oversample)
        taken = self.order[self.position:self.position + size]
        self.position += len(taken)
        if len(taken) < size:  # a new pass; the prompts this draw already holds go to its end (distinct draws)
            fresh = self._permutation()
            carried = np.isin(fresh, taken)
            self.order = np.concatenate([fresh[~carried], fresh[carried]])
            self.position = size - len(taken)
            taken = np.concatenate([taken, self.order[:self.position]])
            self.counters["passes"] += 1
        batch = PromptBatch(taken.copy(), np.zeros(len(taken), bool), self.step, self.step)
        self.last_drawn[taken] = self.step
        self.step += 1
        self.rounds += 1
        self.counters["drawn"] += len(taken)
        self.pending = taken.copy()
        return batch

    def feedback(self, prompt_indices: Any, *, rewards: Any) -> np.ndarray:
        """Which groups to train on (bool, one per group): those with reward variance, up to the ``need`` groups
        still missing from the batch (the surplus is trimmed), counted toward the batch. Bad input raises a
        ValueError naming the argument, and nothing changes."""
        if self.pending is None:
            raise ValueError("prompt_indices: no draw is waiting for feedback (each next_batch() gets one "
                             "feedback(...), for all of its prompts)")
        idx, values = read_groups(prompt_indices, rewards, group_size=self.group_size, binary=False,
                                  num_prompts=self.num_prompts, drawn=self.last_drawn >= 0)
        if len(idx) != len(self.pending) or not np.array_equal(np.sort(idx), np.sort(self.pending)):
            raise ValueError(f"prompt_indices must be the {len(self.pending)} prompts of the last next_batch(), each "
                             f"once, got {len(idx)} prompts: {np.asarray(idx)[:8].tolist()}"
                             + (" ..." if len(idx) > 8 else ""))
        self.pending = None
        signal = ~(values == values[:, :1]).all(axis=1)
        keep = signal & (np.cumsum(signal) <= self.need)  # DAPO trims the surplus: exactly batch_size are kept
        kept = int(keep.sum())
        self.kept += kept
        self.counters["groups"] += len(idx)
        self.counters["kept"] += kept
        self.counters["dropped"] += len(idx) - int(signal.sum())
        self.counters["trimmed"] += int(signal.sum()) - kept
        return keep

    def stats(self) -> dict[str, Any]:
        """Counts since the start: ``drawn`` prompts and ``groups`` fed back (equal once every draw is fed),
        ``kept`` (trained on), ``dropped`` (zero reward variance), ``trimmed`` (with variance, beyond a full
        batch), so groups = kept + dropped + trimmed; ``batches``: training batches begun before the current one;
        ``passes``: completed shuffled passes over the prompts; ``kept_in_batch`` and ``rounds_in_batch`` of the
        current batch; ``frac_zero_variance_total`` = dropped / groups."""
        groups = self.counters["groups"]
        return {**self.counters, "kept_in_batch": self.kept, "rounds_in_batch": self.rounds,
                "frac_zero_variance_total": self.counters["dropped"] / groups if groups else 0.0}

    def config(self) -> dict:
        return {"num_prompts": self.num_prompts, "batch_size": self.batch_size, "oversample": self.oversample,
                "max_rounds": self.max_rounds, "group_size": self.group_size, "seed": self.seed}

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "config": self.config(), "rng": self.rng_state.copy(),
                "order": self.order.copy(), "position": self.position, "step": self.step, "kept": self.kept,
                "rounds": self.rounds, "last_drawn": self.last_drawn.copy(), "counters": dict(self.counters),
                "waiting": self.pending is not None,
                "pending": (self.pending if self.pending is not None else np.zeros(0, np.int64)).copy()}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a `state_dict` (checked first: `InvalidState` names the bad field, nothing changes)."""
        fixed = {k: v for k, v in self.config().items() if k not in ("oversample", "max_rounds")}
        where = check_header(state, STATE_VERSION, fixed, "dynamic sampling")
        n = self.num_prompts
        order = array(state, "order", where, (n,), "iu", np.int64)
        require(np.array_equal(np.sort(order), np.arange(n)), f"{where}['order'] must be a permutation of {n}")
        position = integer(state, "position", where, 0, n)
        step = integer(state, "step", where, 0)
        kept = integer(state, "kept", where, 0)
        rounds = integer(state, "rounds", where, 0)
        last_drawn = array(state, "last_drawn", where, (n,), "iu", np.int64)
        require(bool(((last_drawn >= -1) & (last_drawn < max(step, 0))).all() or not len(last_drawn)),
                f"{where}['last_drawn'] must lie in [-1, step={step})")
        rng = rng_words(state, "rng", where)
        counts = counters(state, "counters", where, self.counters)
        pending = None  # states written before the draw/feedback pairing was kept hold no pending draw
        if "waiting" in state and bool(state["waiting"]):
            pending = array(state, "pending", where, (-1,), "iu", np.int64)
            require(bool(((pending >= 0) & (pending < n)).all()) and len(pending) > 0
                    and bool((last_drawn[pending] == step - 1).all()),
                    f"{where}['pending'] must be the prompts drawn at step {step - 1}")
        self.order, self.position, self.step, self.kept, self.rounds = order, position, step, kept, rounds
        self.last_drawn, self.rng_state, self.counters, self.pending = last_drawn, rng, counts, pending
