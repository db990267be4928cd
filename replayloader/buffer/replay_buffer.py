"""ReplayBuffer: a fixed-capacity memory of examples sampled with P(i) = w_i^alpha / sum_j w_j^alpha.

The buffer joins three parts that never see each other: the `SumTree` (slot indices and priorities), the
`Storage` (slot indices and arrays) and the `Strategy` (weights from feedback). It owns the per-slot
bookkeeping and validates every input before anything changes, so a rejected call leaves it exactly as it was.
The buffer coordinates and knows no concrete strategy: each call validates, runs the generic bookkeeping in a
compiled kernel (`kernels.buffer`), and asks the strategy parts for their decisions through their methods
(whose rules are kernels of their own), or, when a part offers one through its hook (`fused_step`,
`fused_place`, `fused_on_add`; see `strategies.fused`), runs the part's rule and the bookkeeping as one
compiled call with the same result.

Ids: every added example gets ``id = serial * capacity + slot`` where ``serial`` counts examples ever added.
Feedback for an id whose slot has since been refilled is stale: it is ignored and counted, never applied to
the example that replaced it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _checks as checks
from .. import schedules
from ..kernels.buffer import (
    ADDED_AT,
    BAD_VALUE,
    MARK,
    SERIAL,
    VISITS,
    commit_add,
    draw_sample,
    first_bad_victim,
    first_invalid,
    place,
    resolve_ids,
    write_weights,
)
from ..kernels.rng import seed_state
from ..schedules import Schedule, describe, value_at
from ..state.checks import array as state_array
from ..state.checks import check_header, counters, field, finite_nonnegative, first_bad, integer, require, rng_words
from ..strategies import Strategy, TreeReadView
from ..sumtree import SAMPLINGS, SumTree
from ..strategies.feedback import invalid_value, read_feedback
from .storage import Storage
from .._moved import renamed

STATE_VERSION = 2


@dataclass
class Sample:
    """A sampled mini-batch, in the field order of every batch record: what was drawn (``data``, ``ids``), then
    ``probabilities`` and the importance ``weights`` (P_min / P_i)^beta. Weights are always an array (all 1
    without beta), so a loss multiplies by them without asking first. ``ages`` count the adds since each example
    was added (0: it came with the latest add)."""

    data: dict[str, Any]
    ids: np.ndarray
    probabilities: np.ndarray
    weights: np.ndarray
    ages: np.ndarray | None = None


class BufferReadView:
    """What strategy parts may read of a buffer (the `strategies.BufferView` protocol), read-only."""

    __slots__ = ("_buffer", "weights", "visits", "mean_weight")

    def __init__(self, buffer: "ReplayBuffer") -> None:
        self._buffer = buffer
        self.mean_weight = buffer.mean_weight  # read on every add by MeanWeight: one call, not two
        self.weights = buffer.weights.view()
        self.weights.flags.writeable = False
        self.visits = buffer.meta[:, VISITS].view()  # strided, like `buffer.visits`
        self.visits.flags.writeable = False

    @property
    def capacity(self) -> int:
        return self._buffer.capacity

    @property
    def size(self) -> int:
        return self._buffer.size

    @property
    def features(self) -> np.ndarray | None:
        return self._buffer.features


_EMPTY_F64 = np.empty(0, np.float64)
_EMPTY_I64 = np.empty(0, np.int64)


NO_WEIGHTS = -1.0  # the sampling kernel's beta for "no importance weights"


class ReplayBuffer:
    """Prioritized replay memory with pluggable weighting.

    Args:
        capacity: number of examples kept (N).
        alpha: prioritization exponent; 0 is uniform, 1 samples proportionally to the weights.
        beta: importance-weight exponent (PER): a number, a schedule of the sample call (``LinearSchedule(0.4,
            1.0, steps)`` anneals it as PER does; the call count is checkpointed), or None for no weighting (weights all 1).
        strategy: initializer + update + eviction; None means the paper's MeanWeight/LossDifference/EvictLowest.
        storage: a `Storage` to write into (None: a new one; torch tensors stay on their device).
        seed: seed of the sampling generator (its state is checkpointed).
        sampling: "stratified" (one draw per equal segment of the mass) or "independent".
        tree_dtype: float64 (default) or float32 for the sum tree.

    A weight of 0 means "never sampled"; if every weight is 0, sampling falls back to uniform over the stored
    examples. Feedback and initial weights above ``max_weight`` (`SumTree.max_weight`: about 8.6e301 ** (1 /
    max(alpha, 1)) for a float64 tree of a million slots) are refused, as their priorities would overflow.
    """

    def __init__(self, capacity: int, *, alpha: float = 1.0, beta: float | Schedule | None = None,
                 strategy: Strategy | None = None, storage: Storage | None = None, seed: int | None = None,
                 sampling: str = "stratified", tree_dtype: Any = np.float64) -> None:
        checks.integer("capacity", capacity, 1)
        checks.number("alpha", alpha, 0)
        beta = schedules.check("beta", beta)
        checks.one_of("sampling", sampling, SAMPLINGS)
        strategy = Strategy() if strategy is None else strategy
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must be a replayloader.strategies.Strategy, got {type(strategy).__name__}")
        self.capacity = int(capacity)
        self.alpha = float(alpha)
        self.beta = beta
        self.sampling = sampling
        self.strategy = strategy
        # Track only what this configuration reads: P_min for importance weights, the key index for
        # evict-lowest, the raw-weight sum when priorities are not the weights themselves (alpha != 1).
        self.tree = SumTree(self.capacity, tree_dtype, min_priority=self.beta is not None,
                            min_key=strategy.evict.uses_min_key, raw_sum=self.alpha != 1.0)
        self.max_weight = self.tree.max_weight(self.alpha)  # the largest weight feedback may set
        self.storage = Storage(self.capacity) if storage is None else storage
        if self.storage.capacity != self.capacity:
            raise ValueError(f"storage capacity {self.storage.capacity} != buffer capacity {self.capacity}")
        self.seed = seed
        self.rng_state = seed_state(seed)
        self.size = 0
        self.weights = np.zeros(self.capacity)
        self.meta = np.zeros((self.capacity, 4), np.int64)
        self.meta[:, SERIAL] = -1
        self.meta[:, MARK] = -1
        self.features: np.ndarray | None = None
        self.next_serial = 0
        self.last_add_slots = np.empty(0, np.int64)
        self._epoch = 0
        self.counters = {"add_calls": 0, "added": 0, "evicted": 0, "sample_calls": 0, "sampled": 0,
                         "updated": 0, "stale_feedback": 0, "first_visits": 0, "sampled_age_sum": 0}
        self.strategy.bind(self.capacity)
        self.view = BufferReadView(self)
        self.tree_view = TreeReadView(self.tree)  # what evictions see of the tree
        self._stratified = self.sampling == "stratified"

    # ------------------------------------------------------------------ views used by strategies
    def __len__(self) -> int:
        return self.size

    @property
    def visits(self) -> np.ndarray:
        """Feedback visits per slot (a view)."""
        return self.meta[:, VISITS]

    @property
    def slot_serial(self) -> np.ndarray:
        """Serial number of the example in each slot, -1 if empty (a view)."""
        return self.meta[:, SERIAL]

    def mean_weight(self) -> float:
        """Exact mean raw weight of the stored examples (the tree keeps their sum), 0 when empty."""
        if not self.size:
            return 0.0
        tree = self.tree
        return float(tree.raw[1] if self.alpha != 1.0 else tree.sums[1]) / self.size

    # ------------------------------------------------------------------ add
    def add(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Store a batch (field -> array with a leading batch dim) and return one id per example."""
        n = self.storage.check_batch(batch)
        if n == 0:
            raise ValueError("batch must hold at least one example, got 0")
        if n > self.capacity:
            raise ValueError(f"batch of {n} examples does not fit a buffer of capacity {self.capacity}")
        init, evict = self.strategy.init, self.strategy.evict
        features = self._new_features(batch, n) if init.feature_based else None
        weight = init.constant_weight(self.view) if init.constant else None  # what the base initial_weights asks
        if type(weight) is float and 0.0 <= weight <= self.max_weight:  # the usual answer: one weight for all
            weights = _EMPTY_F64
        else:
            weight, weights = self._initial_weights(n, features, weight)
        n_evicted = max(0, n - (self.capacity - self.size))
        tree = self.tree
        fused = evict.fused_place()
        if fused is not None:  # the part's rule and the placement in one compiled call
            step, args = fused
            slots, run_start = step(tree.nodes, tree.layout, self.capacity, self.size, n, *args)
        else:
            victims = _EMPTY_I64
            if n_evicted:
                victims = np.ascontiguousarray(evict.choose(self.tree_view, n_evicted), np.int64)
                if victims.shape != (n_evicted,):
                    raise ValueError(f"eviction {evict.name!r} chose {victims.shape} slots, expected ({n_evicted},)")
                stamp = -2 - self.counters["add_calls"]  # new for every add, never an update's epoch
                bad = first_bad_victim(self.meta, self.size, victims, stamp)
                if bad >= 0:
                    raise ValueError(f"eviction {evict.name!r} chose slot {victims[bad]}, which is not a distinct "
                                     f"stored example (size {self.size})")
            slots, run_start = place(self.capacity, self.size, n, victims)
        # Everything is validated; the storage write is the last step that can still refuse the batch.
        self.storage.write(slots, batch, run_start)
        # From here on the buffer changes.
        if evict.commits:
            evict.commit(self.tree_view, slots[n - n_evicted:])
        if features is not None:
            if self.features is None:
                self.features = np.zeros((self.capacity, features.shape[1]))
            self.features[slots] = features
        counters = self.counters
        update = self.strategy.update
        memory = update.fused_on_add()  # the update's on_add done by the kernel, or None
        ids = commit_add(tree.nodes, tree.layout, self.meta, self.weights, slots, weights, weight, self.alpha,
                         self.next_serial, counters["add_calls"], _EMPTY_F64 if memory is None else memory)
        if memory is None and update.forgets:
            update.on_add(slots)
        self.next_serial += n
        self.size += n - n_evicted
        self.last_add_slots = slots
        counters["add_calls"] += 1
        counters["added"] += n
        counters["evicted"] += n_evicted
        return ids

    def _new_features(self, batch: Mapping[str, Any], n: int) -> np.ndarray:
        features = np.asarray(self.strategy.init.featurize(batch), np.float64)
        if features.ndim != 2 or len(features) != n:
            raise ValueError(f"features must have shape ({n}, d), got {features.shape}")
        if self.features is not None and features.shape[1] != self.features.shape[1]:
            raise ValueError(f"features have {features.shape[1]} columns, earlier adds had "
                             f"{self.features.shape[1]}")
        return features

    def _initial_weights(self, n: int, features: np.ndarray | None, given: Any) -> tuple[float, np.ndarray]:
        """The initializer's answer (`given`, or asked now when None) as (one weight for all, empty) or (unused,
        one weight each), checked."""
        init = self.strategy.init
        if given is None:
            given = init.initial_weights(self.view, n, features)
        if type(given) is float or np.ndim(given) == 0:
            weight = float(given)
            if not 0.0 <= weight <= self.max_weight:
                raise ValueError(f"initializer {init.name!r} gave an invalid initial weight {given!r}")
            return weight, _EMPTY_F64
        weights = np.ascontiguousarray(given, np.float64)
        if weights.shape != (n,) or first_invalid(weights, self.max_weight) >= 0:
            raise ValueError(f"initializer {init.name!r} gave invalid initial weights {weights!r}")
        return 0.0, weights

    def _set_weights(self, slots: np.ndarray, weights: np.ndarray) -> None:
        """Record raw weights; the tree gets priorities (w^alpha), eviction keys and raw sums (w)."""
        write_weights(self.tree.nodes, self.tree.layout, self.weights, np.ascontiguousarray(slots, np.int64),
                      np.ascontiguousarray(weights, np.float64), self.alpha)

    # ------------------------------------------------------------------ sample
    def sample(self, k: int) -> Sample:
        """Draw k examples (with replacement) by weight; see the class docstring for the all-zero case."""
        k = k if type(k) is int and k >= 1 else checks.integer("k", k, 1)  # the common case without a call
        if self.size == 0:
            raise ValueError("cannot sample from an empty buffer; add examples first")
        counters = self.counters
        last_add = counters["add_calls"] - 1
        if self.strategy.no_replay:
            if k > len(self.last_add_slots):
                raise ValueError(f"no-replay mode returns the latest add ({len(self.last_add_slots)} examples); "
                                 f"k={k} is larger")
            slots = self.last_add_slots[:k]
            probabilities = np.full(k, 1.0 / k)
            weights = np.ones(k)
            ids = self.meta[slots, SERIAL] * self.capacity + slots
            ages = last_add - self.meta[slots, ADDED_AT]
            age_sum = int(ages.sum())
        else:
            tree = self.tree
            beta = NO_WEIGHTS if self.beta is None else self.current_beta()
            slots, ids, probabilities, weights, ages, age_sum = draw_sample(
                tree.nodes, tree.layout, self.meta, self.rng_state, int(k), self._stratified, self.size,
                beta, last_add)
            if self.beta is None:
                weights = np.ones(k)
        counters["sample_calls"] += 1
        counters["sampled"] += k
        counters["sampled_age_sum"] += age_sum
        return Sample(self.storage.gather(slots), ids, probabilities, weights, ages)

    def current_beta(self) -> float | None:
        """β for the next `sample`: the number given, or the schedule at the number of samples drawn so far."""
        return value_at("beta", self.beta, self.counters["sample_calls"])

    # ------------------------------------------------------------------ update
    update = renamed("feedback")

    def feedback(self, ids: Any, **feedback: Any) -> int:
        """Apply per-example feedback (e.g. ``loss=``) to the examples of ``ids``; returns how many changed.

        The keywords are those the strategy's update declares (`replayloader.strategies.feedback`). Stale ids are skipped and
        counted; a duplicated id counts once, with its last value.
        """
        if not (type(ids) is np.ndarray and ids.dtype == np.int64 and ids.ndim == 1 and ids.size
                and ids.flags.c_contiguous):
            ids = checks.index_array("ids", ids)
        update = self.strategy.update
        values, source = read_feedback(update, feedback, len(ids))
        self._epoch += 1
        fused = None if values is None else update.fused_step()
        if fused is not None:  # the part's rule as one compiled step: resolve ids, compute, write
            step, args = fused
            tree = self.tree
            status, bad, target, new_weights, stale, first = step(
                tree.nodes, tree.layout, self.meta, self.weights, self.alpha, ids, values, self.max_weight,
                self.next_serial, self._epoch, *args)
            if status:
                self._refuse(status, bad, ids, source, values, self.max_weight)
        else:
            status, bad, slots, slot_values, stale, first = resolve_ids(
                ids, _EMPTY_F64 if values is None else values, self.max_weight, self.meta, self.next_serial,
                self._epoch, values is not None)
            if status:
                self._refuse(status, bad, ids, source, values, self.max_weight)
            target, new_weights = _EMPTY_I64, _EMPTY_F64
            if values is not None and len(slots):
                changed, new_weights = update.compute(slots, slot_values)
                target = slots[changed]
                new_weights = np.ascontiguousarray(new_weights, np.float64)  # observe() gets what the tree got
                if len(target):
                    self._set_weights(target, new_weights)
        init = self.strategy.init
        if init.observes and len(target):
            init.observe(self.view, target, new_weights)
        if init.refreshes:
            refreshed = init.refresh(self.view)
            if refreshed is not None:
                self._set_weights(*refreshed)
        counters = self.counters
        counters["stale_feedback"] += stale
        counters["first_visits"] += first
        counters["updated"] += len(target)
        return len(target)

    @staticmethod
    def _refuse(status: int, bad: int, ids: np.ndarray, source: str, values: np.ndarray | None,
                limit: float) -> None:
        """Raise the error for a failed `resolve_ids` status (nothing was written)."""
        if status == BAD_VALUE:
            raise invalid_value(source, values, bad, limit)
        raise ValueError(f"ids[{bad}] = {ids[bad]} was never issued by this buffer")

    # ------------------------------------------------------------------ introspection
    def stats(self) -> dict[str, float]:
        """Counters and weight statistics (O(N); meant for logging, not the hot path)."""
        live = self.weights[: self.size]
        visits = self.visits[: self.size]
        out: dict[str, float] = {"size": self.size, "capacity": self.capacity}
        out.update({k: v for k, v in self.counters.items() if k != "sampled_age_sum"})
        out["mean_sample_age"] = (self.counters["sampled_age_sum"] / self.counters["sampled"]
                                  if self.counters["sampled"] else 0.0)
        if self.size:
            out.update(weight_min=float(live.min()), weight_mean=float(live.mean()), weight_max=float(live.max()),
                       weight_std=float(live.std()), mean_visits=float(visits.mean()),
                       max_visits=int(visits.max()), frac_never_visited=float((visits == 0).mean()))
        return out

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """A snapshot (copies, not views) of everything needed to continue exactly: slots, weights, counters,
        RNG, strategy memory and stored data."""
        return {
            "version": STATE_VERSION, "config": self._config(),
            "size": self.size, "next_serial": self.next_serial,
            "weights": self.weights.copy(), "visits": self.meta[:, VISITS].copy(),
            "slot_serial": self.meta[:, SERIAL].copy(), "added_at_call": self.meta[:, ADDED_AT].copy(),
            "last_add_slots": self.last_add_slots.copy(),
            "features": None if self.features is None else self.features.copy(),
            "counters": dict(self.counters), "rng": self.rng_state.copy(),
            "strategy": self.strategy.state_dict(), "storage": self.storage.state_dict(),
        }

    def _config(self) -> dict:
        return {"capacity": self.capacity, "alpha": self.alpha, "beta": describe(self.beta), "sampling": self.sampling,
                "tree_dtype": str(self.tree.dtype), "strategy": self.strategy.config()}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a `state_dict` of a buffer with the same configuration: all or nothing.

        Every value is checked first (shapes, dtypes, ranges, the consistency of slots, serials and size, the RNG
        state, the stored data); a state that fails any check raises `state_checks.InvalidState` naming the
        field, and the buffer is exactly as it was. Nothing loaded reaches a compiled kernel unchecked.
        """
        where = check_header(state, STATE_VERSION, self._config(), "buffer")
        n = self.capacity
        size = integer(state, "size", where, 0, n)
        next_serial = integer(state, "next_serial", where, size)
        counts = counters(state, "counters", where, self.counters)
        weights = state_array(state, "weights", where, (n,), "fiu", np.float64)
        finite_nonnegative(weights, f"{where}['weights']")
        serial = state_array(state, "slot_serial", where, (n,), "iu", np.int64)
        added_at = state_array(state, "added_at_call", where, (n,), "iu", np.int64)
        visits = state_array(state, "visits", where, (n,), "iu", np.int64)
        live = slice(0, size)
        empty = slice(size, n)
        # Slots fill in order and are only reused once the buffer is full, so the stored examples sit in slots
        # [0, size), each with its own serial below next_serial; the other slots never held one.
        bad = first_bad((serial[live] < 0) | (serial[live] >= next_serial))
        require(bad < 0, f"{where}['slot_serial'][{bad}] = {serial[bad] if bad >= 0 else 0} must lie in "
                         f"[0, next_serial={next_serial}) for a stored example (size {size})")
        require(len(np.unique(serial[live])) == size, f"{where}['slot_serial'] gives two stored examples one serial")
        for name, values, value in (("slot_serial", serial, -1), ("added_at_call", added_at, 0), ("visits", visits, 0)):
            bad = first_bad(values[empty] != value)
            require(bad < 0, f"{where}[{name!r}][{size + bad}] must be {value} for an empty slot (size {size})")
        bad = first_bad((added_at[live] < 0) | (added_at[live] >= max(counts["add_calls"], 1)))
        require(bad < 0, f"{where}['added_at_call'][{bad}] must lie in [0, add_calls={counts['add_calls']})")
        bad = first_bad(visits < 0)
        require(bad < 0, f"{where}['visits'][{bad}] must be >= 0")
        require(counts["added"] == next_serial, f"{where}: counters['added'] = {counts['added']} must equal "
                                                f"next_serial = {next_serial} (one serial per added example)")
        last_add = state_array(state, "last_add_slots", where, (-1,), "iu", np.int64)
        require(bool(((last_add >= 0) & (last_add < size)).all()) and len(np.unique(last_add)) == len(last_add),
                f"{where}['last_add_slots'] must be distinct stored slots in [0, {size}), got {last_add}")
        features = None
        if field(state, "features", where) is not None:
            features = state_array(state, "features", where, (n, -1), "fiu", np.float64)
            require(bool(np.isfinite(features).all()), f"{where}['features'] must be finite")
        require(features is not None or not (self.strategy.init.feature_based and size),
                f"{where}['features'] is missing, but initializer {self.strategy.init.name!r} reads features")
        rng = rng_words(state, "rng", where)
        storage = self.storage.checked_state(field(state, "storage", where))
        require(storage[0] or not size, f"{where}['storage'] holds no fields, but size is {size}")
        self.strategy.load_state_dict(field(state, "strategy", where))  # all parts or none; the last check
        # Everything is checked: from here on nothing can fail.
        self.storage.commit_state(storage)
        self.size, self.next_serial = size, next_serial
        self.weights[:] = weights  # in place: the read view keeps pointing here
        self.meta[:, SERIAL] = serial
        self.meta[:, ADDED_AT] = added_at
        self.meta[:, VISITS] = visits
        self.meta[:, MARK] = -1
        self.last_add_slots = last_add
        self.features = features
        self.counters = counts
        self.rng_state = rng
        self.tree.clear()
        self._set_weights(np.arange(size, dtype=np.int64), weights[:size].copy())
        self._epoch = 0
