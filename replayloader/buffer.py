"""ReplayBuffer: a fixed-capacity memory of examples sampled with P(i) = w_i^alpha / sum_j w_j^alpha.

The buffer joins three parts that never see each other: the `SumTree` (slot indices and priorities), the
`Storage` (slot indices and arrays) and the `Strategy` (weights from feedback). It owns the per-slot
bookkeeping and validates every input before anything changes, so a rejected call leaves it exactly as it was.

Ids: every added example gets ``id = serial * capacity + slot`` where ``serial`` counts examples ever added.
Feedback for an id whose slot has since been refilled is stale: it is ignored and counted, never applied to
the example that replaced it.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from .storage import Storage, to_numpy
from .strategies import KNOWN_FEEDBACK, Strategy
from .sumtree import SumTree

STATE_VERSION = 1


@dataclass
class Sample:
    """A sampled mini-batch. ``weights`` are importance weights (P_min / P_i)^beta, or None without beta;
    ``ages`` count the adds since each example was added (0: it came with the latest add)."""

    data: dict[str, Any]
    ids: np.ndarray
    probabilities: np.ndarray
    weights: np.ndarray | None
    ages: np.ndarray | None = None


# Per-slot bookkeeping lives in one int64 row per slot, so touching a slot costs one cache line.
SERIAL, ADDED_AT, VISITS, MARK = 0, 1, 2, 3


@njit(cache=True, nogil=True)
def _claim_slots(meta, slots, first_serial, add_call):
    """Record newly written examples: serial numbers, the add call that wrote them, zero visits."""
    for j in range(slots.shape[0]):
        s = slots[j]
        meta[s, 0] = first_serial + j
        meta[s, 1] = add_call
        meta[s, 2] = 0


@njit(cache=True, nogil=True)
def _ids_and_ages(meta, slots, capacity, last_add_call):
    """Ids of sampled slots and the age (in add calls) of the examples they hold."""
    k = slots.shape[0]
    ids = np.empty(k, np.int64)
    ages = np.empty(k, np.int64)
    for j in range(k):
        s = slots[j]
        ids[j] = meta[s, 0] * capacity + s
        ages[j] = last_add_call - meta[s, 1]
    return ids, ages


@njit(cache=True, nogil=True)
def _resolve_ids(ids, capacity, meta, next_serial, epoch, count_visits):
    """Decode ids to slots, drop stale ones, keep the last occurrence of duplicates, count visits.

    Returns (slots, positions in `ids`, stale count, first visits, index of the first never-issued id or -1).
    Nothing is written unless every id was issued.
    """
    k = ids.shape[0]
    for j in range(k):
        if ids[j] < 0 or ids[j] // capacity >= next_serial:
            return np.empty(0, np.int64), np.empty(0, np.int64), 0, 0, j
    slots = np.empty(k, np.int64)
    pos = np.empty(k, np.int64)
    n = 0
    stale = 0
    first = 0
    for j in range(k - 1, -1, -1):  # backwards, so the first occurrence met is the last write
        slot = ids[j] % capacity
        if meta[slot, 0] != ids[j] // capacity:
            stale += 1
        elif meta[slot, 3] != epoch:
            meta[slot, 3] = epoch
            if count_visits:
                meta[slot, 2] += 1
                if meta[slot, 2] == 1:
                    first += 1
            slots[n] = slot
            pos[n] = j
            n += 1
    return slots[:n][::-1].copy(), pos[:n][::-1].copy(), stale, first, -1


@njit(cache=True, nogil=True)
def _first_invalid(values):
    """Index of the first NaN, inf or negative value, or -1."""
    for j in range(values.shape[0]):
        v = values[j]
        if not (v >= 0.0 and v < np.inf):
            return j
    return -1


def _check_feedback_array(name: str, value: Any, k: int) -> np.ndarray:
    arr = to_numpy(value, name)
    if arr.shape != (k,):
        raise ValueError(f"{name} must have shape ({k},) to match ids, got {arr.shape}")
    arr = np.ascontiguousarray(arr, np.float64)
    bad = _first_invalid(arr)
    if bad >= 0:
        raise ValueError(f"{name} must be finite and >= 0; {name}[{bad}] = {float(arr[bad])}")
    return arr


class ReplayBuffer:
    """Prioritized replay memory with pluggable weighting.

    Args:
        capacity: number of examples kept (N).
        alpha: prioritization exponent; 0 is uniform, 1 samples proportionally to the weights.
        beta: importance-weight exponent (PER); None skips importance weights. Fixed at construction.
        strategy: initializer + update + eviction; None means the paper's MeanWeight/LossDifference/EvictLowest.
        storage: a `Storage` to write into (None: a new one; torch tensors stay on their device).
        seed: seed of the sampling generator (its state is checkpointed).
        sampling: "stratified" (one draw per equal segment of the mass) or "independent".
        tree_dtype: float64 (default) or float32 for the sum tree.

    A weight of 0 means "never sampled"; if every weight is 0, sampling falls back to uniform over the stored
    examples.
    """

    def __init__(self, capacity: int, alpha: float = 1.0, beta: float | None = None,
                 strategy: Strategy | None = None, storage: Storage | None = None, seed: int | None = None,
                 sampling: str = "stratified", tree_dtype: Any = np.float64) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
        if not (isinstance(alpha, (int, float, np.floating)) and np.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
        if beta is not None and not (isinstance(beta, (int, float, np.floating)) and np.isfinite(beta)
                                     and beta >= 0):
            raise ValueError(f"beta must be None or a finite number >= 0, got {beta!r}")
        if sampling not in ("stratified", "independent"):
            raise ValueError(f"sampling must be 'stratified' or 'independent', got {sampling!r}")
        strategy = Strategy() if strategy is None else strategy
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must be a replayloader.strategies.Strategy, got {type(strategy).__name__}")
        self.capacity = int(capacity)
        self.alpha = float(alpha)
        self.beta = None if beta is None else float(beta)
        self.sampling = sampling
        self.strategy = strategy
        # Track only what this configuration reads: P_min for importance weights, the key index for
        # evict-lowest, the raw-weight sum when priorities are not the weights themselves (alpha != 1).
        self.tree = SumTree(self.capacity, tree_dtype, min_priority=self.beta is not None,
                            min_key=strategy.evict.uses_min_key, raw_sum=self.alpha != 1.0)
        self.storage = Storage(self.capacity) if storage is None else storage
        if self.storage.capacity != self.capacity:
            raise ValueError(f"storage capacity {self.storage.capacity} != buffer capacity {self.capacity}")
        self.seed = seed
        self.rng = np.random.Generator(np.random.PCG64(seed))
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
        self.strategy.update.bind(self.capacity)

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
        return (self.tree.raw_total() if self.alpha != 1.0 else self.tree.total) / self.size

    # ------------------------------------------------------------------ add
    def add(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Store a batch (field -> array with a leading batch dim) and return one id per example."""
        n = self.storage.check_batch(batch)
        if n == 0:
            raise ValueError("batch must hold at least one example, got 0")
        if n > self.capacity:
            raise ValueError(f"batch of {n} examples does not fit a buffer of capacity {self.capacity}")
        init = self.strategy.init
        features = None
        if init.feature_based:
            features = np.asarray(init.featurize(batch), np.float64)
            if features.ndim != 2 or len(features) != n:
                raise ValueError(f"features must have shape ({n}, d), got {features.shape}")
            if self.features is not None and features.shape[1] != self.features.shape[1]:
                raise ValueError(f"features have {features.shape[1]} columns, earlier adds had "
                                 f"{self.features.shape[1]}")
        weights = np.ascontiguousarray(init.initial_weights(self, n, features), np.float64)
        if weights.shape != (n,) or _first_invalid(weights) >= 0:
            raise ValueError(f"initializer {init.name!r} gave invalid initial weights {weights!r}")
        # Everything is validated: from here on the buffer changes.
        n_free = min(n, self.capacity - self.size)
        slots = np.arange(self.size, self.size + n_free, dtype=np.int64)
        if n_free < n:
            victims = self.strategy.evict.choose(self.tree, n - n_free)
            self.counters["evicted"] += len(victims)
            slots = np.concatenate([slots, victims])
        self.storage.write(slots, batch)
        if features is not None:
            if self.features is None:
                self.features = np.zeros((self.capacity, features.shape[1]))
            self.features[slots] = features
        first_serial = self.next_serial
        _claim_slots(self.meta, slots, first_serial, self.counters["add_calls"])
        self.next_serial += n
        self.size += n_free
        self.strategy.update.on_add(slots)
        self._set_weights(slots, weights)
        self.last_add_slots = slots
        self.counters["add_calls"] += 1
        self.counters["added"] += n
        return (np.arange(first_serial, first_serial + n, dtype=np.int64)) * self.capacity + slots

    def _priorities(self, weights: np.ndarray) -> np.ndarray:
        if self.alpha == 1.0:
            return weights
        if self.alpha == 0.0:
            return (weights > 0).astype(np.float64)
        return np.where(weights > 0, weights ** self.alpha, 0.0)

    def _set_weights(self, slots: np.ndarray, weights: np.ndarray) -> None:
        """Record raw weights; the tree gets priorities (w^alpha), eviction keys and raw sums (w)."""
        self.weights[slots] = weights
        dtype = self.tree.dtype
        raw = weights if weights.dtype == dtype else weights.astype(dtype)
        priorities = self._priorities(weights)
        priorities = priorities if priorities.dtype == dtype else priorities.astype(dtype)
        self.tree.set_unchecked(np.ascontiguousarray(slots, np.int64), np.ascontiguousarray(priorities),
                                np.ascontiguousarray(raw), np.ascontiguousarray(raw))

    # ------------------------------------------------------------------ sample
    def sample(self, k: int) -> Sample:
        """Draw k examples (with replacement) by weight; see the class docstring for the all-zero case."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        if self.size == 0:
            raise ValueError("cannot sample from an empty buffer; add examples first")
        if self.strategy.no_replay:
            if k > len(self.last_add_slots):
                raise ValueError(f"no-replay mode returns the latest add ({len(self.last_add_slots)} examples); "
                                 f"k={k} is larger")
            slots = self.last_add_slots[:k]
            probabilities = np.full(k, 1.0 / k)
        else:
            total = self.tree.total
            uniforms = self.rng.random(k)
            if total > 0:
                slots = self.tree.sample(uniforms, self.sampling == "stratified")
                probabilities = self.tree.get(slots).astype(np.float64) / total
            else:
                slots = np.minimum((uniforms * self.size).astype(np.int64), self.size - 1)
                probabilities = np.full(k, 1.0 / self.size)
        weights = None
        if self.beta is not None:
            uniform = self.strategy.no_replay or not self.tree.total > 0  # probabilities did not come from the tree
            p_min = probabilities.min() if uniform else self.tree.min_priority() / self.tree.total
            weights = (p_min / probabilities) ** self.beta
        ids, ages = _ids_and_ages(self.meta, slots, self.capacity, self.counters["add_calls"] - 1)
        counters = self.counters
        counters["sample_calls"] += 1
        counters["sampled"] += k
        counters["sampled_age_sum"] += int(ages.sum())
        return Sample(self.storage.gather(slots), ids, probabilities, weights, ages)

    # ------------------------------------------------------------------ update
    def update(self, ids: Any, **feedback: Any) -> int:
        """Apply per-example feedback (e.g. ``loss=``) to the examples of ``ids``; returns how many changed.

        Stale ids are skipped and counted; a duplicated id counts once, with its last value.
        """
        ids = to_numpy(ids, "ids")
        if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
            raise ValueError(f"ids must be a non-empty 1-D integer array, got dtype {ids.dtype} shape {ids.shape}")
        ids = np.ascontiguousarray(ids, np.int64)
        checked = {}
        for name, value in feedback.items():
            if name not in KNOWN_FEEDBACK:
                raise TypeError(f"unknown feedback keyword {name!r}; known: {list(KNOWN_FEEDBACK)}")
            if name in ("logits", "targets", "mask"):
                checked[name] = to_numpy(value, name)
            else:
                checked[name] = _check_feedback_array(name, value, len(ids))
        update = self.strategy.update
        values = update.values(checked)
        if values is not None and not any(values is v for v in checked.values()):  # derived, e.g. from logits
            values = _check_feedback_array(update.feedback_key or "feedback", values, len(ids))
        self._epoch += 1
        slots, pos, stale, first, bad = _resolve_ids(ids, self.capacity, self.meta, self.next_serial,
                                                     self._epoch, values is not None)
        if bad >= 0:
            raise ValueError(f"ids[{bad}] = {ids[bad]} was never issued by this buffer")
        counters = self.counters
        counters["stale_feedback"] += stale
        counters["first_visits"] += first
        if values is None or len(slots) == 0:
            return 0
        changed, new_weights = update.compute(slots, values[pos])
        target = slots[changed]
        init = self.strategy.init
        if len(target):
            new_weights = np.ascontiguousarray(new_weights, np.float64)
            self._set_weights(target, new_weights)
            init.observe(self, target, new_weights)
        refreshed = init.refresh(self)
        if refreshed is not None:
            r_slots, r_weights = refreshed
            self._set_weights(r_slots, np.ascontiguousarray(r_weights, np.float64))
        counters["updated"] += len(target)
        return len(target)

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
            "version": STATE_VERSION,
            "config": {"capacity": self.capacity, "alpha": self.alpha, "beta": self.beta, "sampling": self.sampling,
                       "tree_dtype": str(self.tree.dtype), "strategy": self.strategy.describe()},
            "size": self.size, "next_serial": self.next_serial,
            "weights": self.weights.copy(), "visits": self.meta[:, VISITS].copy(),
            "slot_serial": self.meta[:, SERIAL].copy(), "added_at_call": self.meta[:, ADDED_AT].copy(),
            "last_add_slots": self.last_add_slots.copy(),
            "features": None if self.features is None else self.features.copy(),
            "counters": dict(self.counters), "rng": copy.deepcopy(self.rng.bit_generator.state),
            "strategy": self.strategy.state_dict(), "storage": self.storage.state_dict(),
        }

    def load_state_dict(self, state: Mapping) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"state version {state.get('version')!r} is not supported (expected {STATE_VERSION})")
        config = state["config"]
        mine = {"capacity": self.capacity, "alpha": self.alpha, "beta": self.beta, "sampling": self.sampling,
                "tree_dtype": str(self.tree.dtype), "strategy": self.strategy.describe()}
        for key, value in mine.items():
            if config[key] != value:
                raise ValueError(f"checkpoint has {key}={config[key]!r} but this buffer has {key}={value!r}")
        self.size = int(state["size"])
        self.next_serial = int(state["next_serial"])
        self.weights = np.array(state["weights"], np.float64)
        self.meta[:, SERIAL] = state["slot_serial"]
        self.meta[:, ADDED_AT] = state["added_at_call"]
        self.meta[:, VISITS] = state["visits"]
        self.meta[:, MARK] = -1
        self.last_add_slots = np.array(state["last_add_slots"], np.int64)
        self.features = None if state["features"] is None else np.array(state["features"], np.float64)
        self.counters = {k: int(v) for k, v in state["counters"].items()}
        self.rng.bit_generator.state = state["rng"]
        self.strategy.update.bind(self.capacity)
        self.strategy.load_state_dict(state["strategy"])
        self.storage.load_state_dict(state["storage"])
        self.tree.clear()
        live = np.arange(self.size, dtype=np.int64)
        live_weights = self.weights[: self.size]
        self.tree.set(live, self._priorities(live_weights), live_weights, live_weights)
        self._epoch = 0


def _warm_up() -> None:
    meta = np.zeros((1, 4), np.int64)
    one = np.zeros(1, np.int64)
    _claim_slots(meta, one, 0, 0)
    _ids_and_ages(meta, one, 1, 0)
    _resolve_ids(one, 1, meta, 1, 1, True)
    _first_invalid(np.zeros(1))


_warm_up()
