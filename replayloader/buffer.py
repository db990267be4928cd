"""ReplayBuffer: a fixed-capacity memory of examples sampled with P(i) = w_i^alpha / sum_j w_j^alpha.

The buffer joins three parts that never see each other: the `SumTree` (slot indices and priorities), the
`Storage` (slot indices and arrays) and the `Strategy` (weights from feedback). It owns the per-slot
bookkeeping and validates every input before anything changes, so a rejected call leaves it exactly as it was.
The work of each call happens in one compiled kernel (`buffer_kernels`); built-in strategy rules run there, and
a strategy part that overrides them runs in Python with the same results.

Ids: every added example gets ``id = serial * capacity + slot`` where ``serial`` counts examples ever added.
Feedback for an id whose slot has since been refilled is stale: it is ignored and counted, never applied to
the example that replaced it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .buffer_kernels import (ADDED_AT, BAD_ID, EVICT_FIFO, EVICT_GIVEN, EVICT_LOWEST, MARK, SERIAL, UPDATE_LOSS_DIFF_ABS,
                             UPDATE_LOSS_DIFF_DECREASE, UPDATE_VALUE, VISITS, apply_feedback, choose_slots,
                             commit_add, draw_sample, first_invalid, resolve_ids, write_weights)
from .rng import seed_state
from .storage import Storage, to_numpy
from .strategies import (KNOWN_FEEDBACK, FIFO, EvictLowest, Eviction, GradBound, Initializer, LossDifference,
                         Strategy, WeightUpdate)
from .sumtree import SumTree

STATE_VERSION = 2


@dataclass
class Sample:
    """A sampled mini-batch. ``weights`` are importance weights (P_min / P_i)^beta, or None without beta;
    ``ages`` count the adds since each example was added (0: it came with the latest add)."""

    data: dict[str, Any]
    ids: np.ndarray
    probabilities: np.ndarray
    weights: np.ndarray | None
    ages: np.ndarray | None = None


def _check_feedback_array(name: str, value: Any, k: int) -> np.ndarray:
    arr = to_numpy(value, name)
    if arr.shape != (k,):
        raise ValueError(f"{name} must have shape ({k},) to match ids, got {arr.shape}")
    arr = np.ascontiguousarray(arr, np.float64)
    bad = first_invalid(arr)
    if bad >= 0:
        raise ValueError(f"{name} must be finite and >= 0; {name}[{bad}] = {float(arr[bad])}")
    return arr


def _kernel_rule(update: WeightUpdate) -> int | None:
    """The built-in kernel rule that implements `update`, or None when only its Python methods can (a subclass
    that changes how feedback becomes values or weights)."""
    if type(update).values not in (WeightUpdate.values, GradBound.values):  # GradBound passes grad_bound= as is
        return None
    compute = type(update).compute
    if compute is WeightUpdate.compute:
        return UPDATE_VALUE
    if compute is LossDifference.compute:
        return UPDATE_LOSS_DIFF_ABS if update.mode == "abs" else UPDATE_LOSS_DIFF_DECREASE
    return None


def _kernel_eviction(evict: Eviction) -> int:
    choose = type(evict).choose
    if choose is EvictLowest.choose:
        return EVICT_LOWEST
    if choose is FIFO.choose:
        return EVICT_FIFO
    return EVICT_GIVEN


def _overrides(obj: Any, base: type, method: str) -> bool:
    return getattr(type(obj), method) is not getattr(base, method)


_EMPTY_F64 = np.empty(0, np.float64)
_EMPTY_I64 = np.empty(0, np.int64)


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
        self.strategy.update.bind(self.capacity)
        self._plan_kernels()

    def _plan_kernels(self) -> None:
        """Decide once which strategy parts the kernels run and which Python hooks still need calling."""
        init, update, evict = self.strategy.init, self.strategy.update, self.strategy.evict
        self._evict_mode = _kernel_eviction(evict)
        self._rule = _kernel_rule(update)
        loss_diff = self._rule in (UPDATE_LOSS_DIFF_ABS, UPDATE_LOSS_DIFF_DECREASE)
        self._last_loss = update.last_loss if loss_diff else _EMPTY_F64
        # The loss-difference kernel forgets an overwritten slot's loss itself; any other on_add runs in Python.
        self._call_on_add = _overrides(update, LossDifference if loss_diff else WeightUpdate, "on_add")
        self._constant_init = not _overrides(init, Initializer, "initial_weights")
        self._call_observe = _overrides(init, Initializer, "observe")
        self._call_refresh = _overrides(init, Initializer, "refresh")
        self._beta_arg = -1.0 if self.beta is None else self.beta
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
        strategy = self.strategy
        init = strategy.init
        features = None
        if init.feature_based:
            features = np.asarray(init.featurize(batch), np.float64)
            if features.ndim != 2 or len(features) != n:
                raise ValueError(f"features must have shape ({n}, d), got {features.shape}")
            if self.features is not None and features.shape[1] != self.features.shape[1]:
                raise ValueError(f"features have {features.shape[1]} columns, earlier adds had "
                                 f"{self.features.shape[1]}")
        weight = init.constant_weight(self) if self._constant_init else None
        if weight is not None:
            if not 0.0 <= weight < np.inf:
                raise ValueError(f"initializer {init.name!r} gave an invalid initial weight {weight!r}")
            weights = _EMPTY_F64  # the kernel writes `weight` to every new example
        else:
            weight = 0.0
            weights = np.ascontiguousarray(init.initial_weights(self, n, features), np.float64)
            if weights.shape != (n,) or first_invalid(weights) >= 0:
                raise ValueError(f"initializer {init.name!r} gave invalid initial weights {weights!r}")
        # Everything is validated: from here on the buffer changes.
        tree, evict, mode = self.tree, strategy.evict, self._evict_mode
        victims = _EMPTY_I64
        if mode == EVICT_GIVEN and n > self.capacity - self.size:
            victims = np.ascontiguousarray(evict.choose(tree, n - (self.capacity - self.size)), np.int64)
        fifo_next = evict.next_slot if mode == EVICT_FIFO else 0
        slots, evicted, run_start = choose_slots(tree.nodes, tree.c_keys, tree.n_leaves, self.size, self.capacity, n, mode,
                                                 fifo_next, victims)
        self.storage.write(slots, batch, run_start)
        if evicted and mode == EVICT_FIFO:
            evict.advance(evicted, self.capacity)
        if features is not None:
            if self.features is None:
                self.features = np.zeros((self.capacity, features.shape[1]))
            self.features[slots] = features
        counters = self.counters
        ids = commit_add(tree.nodes, tree.c_raw, tree.c_minp, tree.c_keys, tree.n_leaves, self.meta, self.weights,
                         self._last_loss, slots, weights, weight, self.alpha, self.next_serial,
                         counters["add_calls"])
        if self._call_on_add:
            strategy.update.on_add(slots)
        self.next_serial += n
        self.size += n - evicted
        self.last_add_slots = slots
        counters["add_calls"] += 1
        counters["added"] += n
        counters["evicted"] += evicted
        return ids

    def _set_weights(self, slots: np.ndarray, weights: np.ndarray) -> None:
        """Record raw weights; the tree gets priorities (w^alpha), eviction keys and raw sums (w)."""
        tree = self.tree
        write_weights(tree.nodes, tree.c_raw, tree.c_minp, tree.c_keys, tree.n_leaves, self.weights,
                      np.ascontiguousarray(slots, np.int64), np.ascontiguousarray(weights, np.float64), self.alpha)

    # ------------------------------------------------------------------ sample
    def sample(self, k: int) -> Sample:
        """Draw k examples (with replacement) by weight; see the class docstring for the all-zero case."""
        if type(k) is not int and (isinstance(k, bool) or not isinstance(k, (int, np.integer))):
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        if k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
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
            weights = None if self.beta is None else np.ones(k)
            ids = self.meta[slots, SERIAL] * self.capacity + slots
            ages = last_add - self.meta[slots, ADDED_AT]
            age_sum = int(ages.sum())
        else:
            tree = self.tree
            slots, ids, probabilities, weights, ages, age_sum = draw_sample(
                tree.nodes, tree.c_minp, tree.n_leaves, self.meta, self.rng_state, int(k), self._stratified, self.size,
                self._beta_arg, last_add)
            if self.beta is None:
                weights = None
        counters["sample_calls"] += 1
        counters["sampled"] += k
        counters["sampled_age_sum"] += age_sum
        return Sample(self.storage.gather(slots), ids, probabilities, weights, ages)

    # ------------------------------------------------------------------ update
    def update(self, ids: Any, **feedback: Any) -> int:
        """Apply per-example feedback (e.g. ``loss=``) to the examples of ``ids``; returns how many changed.

        Stale ids are skipped and counted; a duplicated id counts once, with its last value.
        """
        if not (type(ids) is np.ndarray and ids.dtype == np.int64 and ids.ndim == 1 and ids.size
                and ids.flags.c_contiguous):
            ids = to_numpy(ids, "ids")
            if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
                raise ValueError(f"ids must be a non-empty 1-D integer array, got dtype {ids.dtype} "
                                 f"shape {ids.shape}")
            ids = np.ascontiguousarray(ids, np.int64)
        update = self.strategy.update
        key = update.feedback_key
        if self._rule is not None and len(feedback) == 1 and key in feedback:
            return self._update_in_kernel(ids, key, feedback[key])
        return self._update_in_python(ids, feedback)

    def _update_in_kernel(self, ids: np.ndarray, key: str, value: Any) -> int:
        """The built-in update rules: validation, id resolution and the weight write in one kernel call."""
        values = value if type(value) is np.ndarray else to_numpy(value, key)
        if values.shape != ids.shape:
            raise ValueError(f"{key} must have shape ({len(ids)},) to match ids, got {values.shape}")
        if values.dtype != np.float64 or not values.flags.c_contiguous:
            values = np.ascontiguousarray(values, np.float64)
        self._epoch += 1
        tree = self.tree
        status, bad, stale, first, slots, new_weights = apply_feedback(
            tree.nodes, tree.c_raw, tree.c_minp, tree.c_keys, tree.n_leaves, self.meta, self.weights, self._last_loss, ids,
            values, self.next_serial, self._epoch, self._rule, self.strategy.update.floor, self.alpha)
        if status == BAD_ID:
            raise ValueError(f"ids[{bad}] = {ids[bad]} was never issued by this buffer")
        if status:
            raise ValueError(f"{key} must be finite and >= 0; {key}[{bad}] = {float(values[bad])}")
        return self._after_update(slots, new_weights, stale, first)

    def _update_in_python(self, ids: np.ndarray, feedback: Mapping[str, Any]) -> int:
        """Any update: feedback validated here, new weights from the strategy's `compute`."""
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
        slots, pos, stale, first, bad = resolve_ids(ids, self.meta, self.next_serial, self._epoch,
                                                    values is not None)
        if bad >= 0:
            raise ValueError(f"ids[{bad}] = {ids[bad]} was never issued by this buffer")
        if values is None or len(slots) == 0:
            return self._after_update(_EMPTY_I64, _EMPTY_F64, stale, first)
        changed, new_weights = update.compute(slots, values[pos])
        target = slots[changed]
        new_weights = np.ascontiguousarray(new_weights, np.float64)
        if len(target):
            self._set_weights(target, new_weights)
        return self._after_update(target, new_weights, stale, first)

    def _after_update(self, slots: np.ndarray, new_weights: np.ndarray, stale: int, first: int) -> int:
        """Initializer hooks (learning from the new weights, re-scoring unsampled examples) and counters."""
        init = self.strategy.init
        if self._call_observe and len(slots):
            init.observe(self, slots, new_weights)
        if self._call_refresh:
            refreshed = init.refresh(self)
            if refreshed is not None:
                self._set_weights(*refreshed)
        counters = self.counters
        counters["stale_feedback"] += stale
        counters["first_visits"] += first
        counters["updated"] += len(slots)
        return len(slots)

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
            "counters": dict(self.counters), "rng": self.rng_state.copy(),
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
        rng = np.asarray(state["rng"])
        if rng.shape != (4,) or rng.dtype != np.uint64:
            raise ValueError(f"checkpoint rng state must be 4 uint64 words, got dtype {rng.dtype} shape {rng.shape}")
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
        self.rng_state = rng.copy()
        self.strategy.update.bind(self.capacity)
        self.strategy.load_state_dict(state["strategy"])
        self.storage.load_state_dict(state["storage"])
        self._plan_kernels()
        self.tree.clear()
        live = np.arange(self.size, dtype=np.int64)
        live_weights = self.weights[: self.size].copy()
        self._set_weights(live, live_weights)
        self._epoch = 0


def _warm_up() -> None:
    """Compile (or load from the cache) the kernels for both tree dtypes, so the first real call pays nothing."""
    for dtype in (np.float64, np.float32):
        for strategy in (Strategy(), Strategy(evict=FIFO())):
            buf = ReplayBuffer(4, alpha=0.5, beta=0.4, strategy=strategy, seed=0, tree_dtype=dtype)
            for _ in range(3):
                ids = buf.add({"x": np.zeros((2, 1))})
                buf.update(ids, loss=np.ones(2))
            buf.sample(2)


_warm_up()
