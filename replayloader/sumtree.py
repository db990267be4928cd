"""Sum tree with optional min trees and a raw-weight sum, interleaved in one node array, with Numba kernels.

Layout: a 1-indexed binary heap over ``P`` leaves (``P`` = capacity rounded up to a power of two). Node ``i``
has children ``2i`` and ``2i+1``; the leaf of slot ``s`` is node ``P + s``. Every tracked quantity of a node sits
side by side in one row of ``nodes`` (shape ``(2P, R)``, R in 1, 2, 4, rows 64-byte aligned), so the two
children of a node, with all their quantities, share one cache line: recomputing a parent's sum and minima
costs one memory access, not one per quantity. (Measured against one array per quantity: writes are about
twice as fast, sampling slower on a warm cache; with the cache cold, as in a training step that moves data
between calls, the interleaved layout wins overall.) Columns:

* sum (column 0, always): sampling priorities; a parent is the sum of its children.
* min_priority: the priorities again, 0 (never sampled) read as +inf; the root is the smallest positive
  priority, which importance weights need (P_min).
* min_key: eviction keys (raw weights, or anything the caller ranks by); the root is the smallest key, and the
  k smallest are found in O(k log(N/k)) (`minselect`). Empty leaves hold +inf, so they are never evicted.
* raw_sum: a second sum, of raw weights (before the alpha power), so a mean weight is exact.

Kernels take ``nodes`` and the column of each optional quantity (-1 when untracked). Every write recomputes
ancestors from their children instead of adding deltas, so the tree never drifts.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .minselect import select_min_keys

_INF = np.inf


@njit(cache=True, nogil=True, inline="always")
def _recompute(nodes, i, c_raw, c_minp, c_keys):
    """Node i from its two children, every tracked column."""
    a, b = 2 * i, 2 * i + 1
    nodes[i, 0] = nodes[a, 0] + nodes[b, 0]
    if c_raw >= 0:
        nodes[i, c_raw] = nodes[a, c_raw] + nodes[b, c_raw]
    if c_minp >= 0:
        nodes[i, c_minp] = min(nodes[a, c_minp], nodes[b, c_minp])
    if c_keys >= 0:
        nodes[i, c_keys] = min(nodes[a, c_keys], nodes[b, c_keys])


@njit(cache=True, nogil=True)
def _ascend(nodes, c_raw, c_minp, c_keys, n_leaves, slots):
    """Recompute every ancestor of `slots`, in three regimes measured to be fastest in turn:

    * levels wider than 2K, where walks rarely meet: walk by walk to the top of that band, with no bookkeeping
      between levels (a node shared by two walks is recomputed by the later one, after the earlier one changed
      what lies under it, so the result is exact);
    * narrower levels where the walks are still sparse: level by level, each shared node once;
    * once the walks cover a good part of a level: that level and all above it whole, a contiguous pass.
    """
    k = slots.shape[0]
    if k == 0 or n_leaves == 1:  # nothing written, or the single leaf is the root
        return
    top = n_leaves >> 1  # the level width where walking one by one stops
    while top > 2 * k:
        top >>= 1
    up = np.empty(k, np.int64)
    for j in range(k):
        i = (slots[j] + n_leaves) >> 1
        while i >= 2 * top:
            _recompute(nodes, i, c_raw, c_minp, c_keys)
            i >>= 1
        up[j] = i
    seen = np.zeros(top, np.int64)  # seen[i - width] == width: node i was done on the level of that width
    active = k
    width = top  # the current level's nodes are [width, 2 * width)
    while width >= 1 and width > 2 * active:
        kept = 0
        for j in range(active):
            i = up[j]
            if seen[i - width] == width:
                continue
            seen[i - width] = width
            _recompute(nodes, i, c_raw, c_minp, c_keys)
            up[kept] = i >> 1
            kept += 1
        active = kept
        width >>= 1
    while width >= 1:  # whole levels from here to the root
        for i in range(width, 2 * width):
            _recompute(nodes, i, c_raw, c_minp, c_keys)
        width >>= 1


@njit(cache=True, nogil=True)
def _set_leaves(nodes, c_raw, c_minp, c_keys, n_leaves, slots, priorities, new_keys, new_raw):
    """Write leaves (in order, so a duplicated slot keeps its last value), then recompute ancestors."""
    for j in range(slots.shape[0]):
        i = slots[j] + n_leaves
        p = priorities[j]
        nodes[i, 0] = p
        if c_raw >= 0:
            nodes[i, c_raw] = new_raw[j]
        if c_minp >= 0:
            nodes[i, c_minp] = p if p > 0 else _INF
        if c_keys >= 0:
            nodes[i, c_keys] = new_keys[j]
    _ascend(nodes, c_raw, c_minp, c_keys, n_leaves, slots)


@njit(cache=True, nogil=True)
def _set_leaves_checked(nodes, c_raw, c_minp, c_keys, n_leaves, capacity, slots, priorities, new_keys, new_raw):
    """`_set_leaves` after checking every slot lies in [0, capacity); returns the first bad index (nothing
    written) or -1."""
    for j in range(slots.shape[0]):
        if slots[j] < 0 or slots[j] >= capacity:
            return j
    _set_leaves(nodes, c_raw, c_minp, c_keys, n_leaves, slots, priorities, new_keys, new_raw)
    return -1


@njit(cache=True, nogil=True)
def _descend(nodes, n_leaves, targets):
    """Find, for each target mass, the leaf whose cumulative range holds it.

    Never enters a subtree of zero mass, so a leaf of priority 0 (or an empty slot past the end) is never
    returned, even when rounding pushes a target to or past an edge. The K walks go down level by level
    together (their loads overlap), and the left/right choice is arithmetic, not a branch: with fresh
    uniforms each call, a branch would be mispredicted half the time.
    """
    k = targets.shape[0]
    at = np.ones(k, np.int64)
    u = targets.copy()
    while at[0] < n_leaves:
        for j in range(k):
            left = 2 * at[j]
            mass_left = nodes[left, 0]
            go_right = ((u[j] >= mass_left) | (mass_left <= 0.0)) & (nodes[left + 1, 0] > 0.0)
            u[j] -= mass_left * go_right
            at[j] = left + go_right
    return at - n_leaves


@njit(cache=True, nogil=True)
def to_targets(u, total, stratified):
    """Turn uniforms in [0, 1) into target masses, in place: stratified puts draw j in the j-th of K equal
    segments of the total mass; independent spreads each draw over all of it."""
    k = u.shape[0]
    if stratified:
        seg = total / k
        for j in range(k):
            u[j] = (j + u[j]) * seg
    else:
        for j in range(k):
            u[j] *= total
    return u


@njit(cache=True, nogil=True)
def _argmin_key(nodes, c_keys, n_leaves):
    i = 1
    while i < n_leaves:
        left = 2 * i
        i = left if nodes[left, c_keys] <= nodes[left + 1, c_keys] else left + 1
    return i - n_leaves


@njit(cache=True, nogil=True)
def select_lowest(nodes, c_keys, n_leaves, k):
    """The k non-empty slots of lowest key in (key, slot) order; reads only. Raises if fewer than k exist."""
    return select_min_keys(nodes[:, c_keys], n_leaves, k)


@njit(cache=True, nogil=True)
def _replace_lowest(nodes, c_raw, c_minp, c_keys, n_leaves, k, priorities, new_keys, new_raw):
    """Overwrite the k lowest-key leaves with new values in one pass; returns their slots in (key, slot)
    order. Raises (nothing written) when fewer than k leaves are non-empty."""
    slots = select_lowest(nodes, c_keys, n_leaves, k)
    _set_leaves(nodes, c_raw, c_minp, c_keys, n_leaves, slots, priorities, new_keys, new_raw)
    return slots


_WARM: set = set()


def _warm_up(dtype: np.dtype) -> None:
    """Run every kernel once per dtype so compilation (or the on-disk cache load) happens here, not at step 1."""
    if dtype in _WARM:
        return
    nodes = _allocate_rows(4, 4, dtype)
    nodes[:, 1:3] = np.inf
    values = np.ones(2, dtype)
    slots = np.array([0, 1], np.int64)
    _set_leaves(nodes, 3, 1, 2, 2, slots, values, values, values)
    _set_leaves_checked(nodes, -1, -1, -1, 2, 2, slots, values, values, values)
    _descend(nodes, 2, to_targets(np.array([0.5, 0.5]), 2.0, True))
    _argmin_key(nodes, 2, 2)
    _replace_lowest(nodes, 3, 1, 2, 2, 1, values[:1], values[:1], values[:1])
    _WARM.add(dtype)


def _allocate_rows(rows: int, columns: int, dtype: np.dtype) -> np.ndarray:
    """Zeroed (rows, columns) array whose rows start on a 64-byte boundary, so sibling rows share a line."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.zeros(rows * columns + 64 // itemsize, dtype)
    skip = (-raw.ctypes.data % 64) // itemsize
    return raw[skip: skip + rows * columns].reshape(rows, columns)


def _too_few(k: int) -> ValueError:
    return ValueError(f"cannot take the {k} lowest leaves: fewer than {k} leaves are non-empty")


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


class SumTree:
    """Sampling priorities with O(log N) set / sample, plus optional min trees (P_min, argmin for eviction)
    and a raw-weight sum.

    The class validates shapes and owns the arrays; it holds no policy. Priorities must be finite and >= 0
    (the buffer validates user input before it reaches here). Asking for an untracked quantity raises.
    """

    def __init__(self, capacity: int, dtype: np.dtype | type = np.float64, *, min_priority: bool = True,
                 min_key: bool = True, raw_sum: bool = True) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
            raise ValueError(f"dtype must be float64 or float32, got {dtype}")
        self.capacity = int(capacity)
        self.dtype = dtype
        self.n_leaves = _next_power_of_two(self.capacity)
        tracked = [name for name, on in (("minp", min_priority), ("keys", min_key), ("raw", raw_sum)) if on]
        column = {name: 1 + j for j, name in enumerate(tracked)}
        self.c_minp, self.c_keys, self.c_raw = (column.get(name, -1) for name in ("minp", "keys", "raw"))
        width = 1 if not tracked else 2 if len(tracked) == 1 else 4  # a power of two keeps row pairs aligned
        self.nodes = _allocate_rows(2 * self.n_leaves, width, dtype)
        # Views of the columns (an untracked one is empty), for reading and for tests.
        empty = np.zeros(0, dtype)
        self.sums = self.nodes[:, 0]
        self.minp = self.nodes[:, self.c_minp] if min_priority else empty
        self.keys = self.nodes[:, self.c_keys] if min_key else empty
        self.raw = self.nodes[:, self.c_raw] if raw_sum else empty
        self.minp[:] = np.inf
        self.keys[:] = np.inf
        _warm_up(dtype)

    def _need(self, array: np.ndarray, what: str) -> np.ndarray:
        if array.shape[0] == 0:
            raise RuntimeError(f"this SumTree does not track {what}; construct it with {what}=True")
        return array

    @property
    def total(self) -> float:
        return float(self.sums[1])

    def raw_total(self) -> float:
        """Sum of the raw weights (the ``raw`` argument of `set`)."""
        return float(self._need(self.raw, "raw_sum")[1])

    def min_priority(self) -> float:
        """Smallest positive priority (inf when no leaf is positive)."""
        return float(self._need(self.minp, "min_priority")[1])

    def min_key(self) -> float:
        return float(self._need(self.keys, "min_key")[1])

    def get(self, slots: np.ndarray) -> np.ndarray:
        return self.sums[np.asarray(slots, np.int64) + self.n_leaves]

    def get_keys(self, slots: np.ndarray) -> np.ndarray:
        return self._need(self.keys, "min_key")[np.asarray(slots, np.int64) + self.n_leaves]

    def set(self, slots: np.ndarray, priorities: np.ndarray, keys: np.ndarray | None = None,
            raw: np.ndarray | None = None) -> None:
        """Set leaves; a slot given twice keeps its last value. ``keys`` and ``raw`` default to the priorities."""
        if not (type(slots) is np.ndarray and slots.dtype == np.int64 and slots.ndim == 1
                and slots.flags.c_contiguous):
            slots = np.ascontiguousarray(slots, np.int64).reshape(-1)
        if slots.size == 0:
            return
        priorities = self._column(priorities, slots)
        keys = priorities if keys is None else self._column(keys, slots)
        raw = priorities if raw is None else self._column(raw, slots)
        bad = _set_leaves_checked(self.nodes, self.c_raw, self.c_minp, self.c_keys, self.n_leaves,
                                  self.capacity, slots, priorities, keys, raw)
        if bad >= 0:
            raise IndexError(f"slots must lie in [0, {self.capacity}), got slots[{bad}] = {slots[bad]}")

    def set_unchecked(self, slots: np.ndarray, priorities: np.ndarray, keys: np.ndarray, raw: np.ndarray) -> None:
        """`set` for trusted callers: int64 slots in range and contiguous arrays of this tree's dtype."""
        _set_leaves(self.nodes, self.c_raw, self.c_minp, self.c_keys, self.n_leaves, slots, priorities, keys, raw)

    def _column(self, values, slots: np.ndarray) -> np.ndarray:
        if (type(values) is np.ndarray and values.dtype == self.dtype and values.shape == slots.shape
                and values.flags.c_contiguous):
            return values
        if isinstance(values, (float, int, np.floating, np.integer)):
            return np.full(slots.shape, values, self.dtype)
        values = np.asarray(values, self.dtype)
        if values.shape != slots.shape:
            values = np.broadcast_to(values, slots.shape)
        return np.ascontiguousarray(values)

    def sample(self, uniforms: np.ndarray, stratified: bool = True) -> np.ndarray:
        """Map uniforms in [0, 1) to slots with probability priority / total.

        Stratified: draw j lands in the j-th of K equal segments of the mass (lower variance, as in PER).
        Independent: each draw covers the whole mass.
        """
        total = float(self.sums[1])
        if not total > 0:
            raise ValueError("cannot sample: the total priority is 0")
        targets = to_targets(np.array(uniforms, np.float64), total, bool(stratified))  # a copy: filled in place
        return _descend(self.nodes, self.n_leaves, targets)

    def argmin(self) -> int:
        """Slot of the smallest key (lowest slot among ties)."""
        self._need(self.keys, "min_key")
        return int(_argmin_key(self.nodes, self.c_keys, self.n_leaves))

    def pop_min(self, k: int, empty: bool = True) -> np.ndarray:
        """Return the k lowest-key slots in (key, slot) order; only non-empty slots can be popped.

        ``empty=True`` empties those leaves (priority 0). ``empty=False`` only sets their keys to +inf and leaves
        their priorities in place. To overwrite the lowest leaves with new values, `replace_min` does it in
        one pass.
        """
        self._need(self.keys, "min_key")
        k = self._check_k(k)
        try:
            slots = select_lowest(self.nodes, self.c_keys, self.n_leaves, k)
        except ValueError as err:  # the selection refuses, before anything is written
            raise _too_few(k) from err
        leaves = slots + self.n_leaves
        if empty:
            priorities = raw = np.zeros(k, self.dtype)
        else:
            priorities = self.sums[leaves]
            raw = self.raw[leaves] if self.raw.shape[0] else priorities
        self.set_unchecked(slots, priorities, np.full(k, np.inf, self.dtype), raw)
        return slots

    def replace_min(self, k: int, priorities, keys=None, raw=None) -> np.ndarray:
        """Evict-then-write in one pass: overwrite the k lowest-key leaves (only non-empty ones) with new values
        and return their slots in (key, slot) order. Values broadcast to k; ``keys`` and ``raw`` default to the
        priorities."""
        if self.c_keys < 0:
            self._need(self.keys, "min_key")
        if type(k) is not int:
            k = self._check_k(k)
        elif not 0 <= k <= self.capacity:
            self._check_k(k)
        shape_of = np.empty(k, np.int64)
        priorities = self._column(priorities, shape_of)
        keys = priorities if keys is None else self._column(keys, shape_of)
        raw = priorities if raw is None else self._column(raw, shape_of)
        try:
            return _replace_lowest(self.nodes, self.c_raw, self.c_minp, self.c_keys, self.n_leaves, k, priorities,
                                   keys, raw)
        except ValueError as err:  # the selection refuses, before anything is written
            raise _too_few(k) from err

    def _check_k(self, k) -> int:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= self.capacity:
            raise ValueError(f"k must be an integer in [0, {self.capacity}], got {k!r}")
        return int(k)

    def clear(self) -> None:
        self.sums[:] = 0
        self.raw[:] = 0
        self.minp[:] = np.inf
        self.keys[:] = np.inf
