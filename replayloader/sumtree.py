"""Sum tree + min trees over flat arrays, with Numba kernels.

Layout: a 1-indexed binary heap over ``P`` leaves (``P`` = capacity rounded up to a power of two). Node ``i``
has children ``2i`` and ``2i+1``; leaf of slot ``s`` is node ``P + s``. Three arrays share that layout:

* ``sums``  -- sampling priorities; a parent is the sum of its children.
* ``minp``  -- the same priorities with 0 (never sampled) replaced by +inf; root = smallest positive priority,
  which importance weights need (P_min).
* ``keys``  -- eviction keys (raw weights, or anything the caller ranks by); root = smallest key, and a descent
  finds its leaf in O(log N). Empty leaves hold +inf so they are never "evicted".

Every write recomputes ancestors from their children instead of adding deltas, so the tree never drifts.
Kernels process a whole batch one tree level at a time: the K independent descents (or ascents) of a level
issue their memory loads together, which hides cache misses at large N.
"""
from __future__ import annotations

import numpy as np
from numba import njit

_INF = np.inf


@njit(cache=True, nogil=True)
def _set_leaves(sums, minp, keys, n_leaves, slots, priorities, new_keys):
    """Write leaves (in order, so a duplicated slot keeps its last value), then recompute ancestors."""
    k = slots.shape[0]
    nodes = np.empty(k, np.int64)
    for j in range(k):
        i = slots[j] + n_leaves
        p = priorities[j]
        sums[i] = p
        minp[i] = p if p > 0 else _INF
        keys[i] = new_keys[j]
        nodes[j] = i >> 1
    while nodes[0] >= 1:  # every walk reaches the root on the same level: the tree is perfect
        for j in range(k):
            i = nodes[j]
            left = 2 * i
            right = left + 1
            sums[i] = sums[left] + sums[right]
            a, b = minp[left], minp[right]
            minp[i] = a if a < b else b
            a, b = keys[left], keys[right]
            keys[i] = a if a < b else b
            nodes[j] = i >> 1


@njit(cache=True, nogil=True)
def _descend(sums, n_leaves, targets):
    """Find, for each target mass, the leaf whose cumulative range holds it.

    Never enters a subtree of zero mass, so a leaf of priority 0 (or an empty slot past the end) is never
    returned, even when rounding pushes a target to or past an edge.
    """
    k = targets.shape[0]
    nodes = np.ones(k, np.int64)
    u = targets.copy()
    while nodes[0] < n_leaves:
        for j in range(k):
            left = 2 * nodes[j]
            mass_left = sums[left]
            if (u[j] < mass_left and mass_left > 0.0) or sums[left + 1] <= 0.0:
                nodes[j] = left
            else:
                u[j] -= mass_left
                nodes[j] = left + 1
    return nodes - n_leaves


@njit(cache=True, nogil=True)
def _stratified_targets(total, uniforms):
    """One uniform draw inside each of K equal segments of the total mass."""
    k = uniforms.shape[0]
    out = np.empty(k, np.float64)
    seg = total / k
    for j in range(k):
        out[j] = (j + uniforms[j]) * seg
    return out


@njit(cache=True, nogil=True)
def _argmin_key(keys, n_leaves):
    i = 1
    while i < n_leaves:
        left = 2 * i
        i = left if keys[left] <= keys[left + 1] else left + 1
    return i - n_leaves


@njit(cache=True, nogil=True)
def _pop_min(sums, minp, keys, n_leaves, k):
    """Remove the k lowest-key leaves (distinct) and return their slots; ties go to the lowest slot."""
    out = np.empty(k, np.int64)
    for j in range(k):
        s = _argmin_key(keys, n_leaves)
        out[j] = s
        i = s + n_leaves
        sums[i] = 0.0
        minp[i] = _INF
        keys[i] = _INF
        i >>= 1
        while i >= 1:
            left = 2 * i
            sums[i] = sums[left] + sums[left + 1]
            a, b = minp[left], minp[left + 1]
            minp[i] = a if a < b else b
            a, b = keys[left], keys[left + 1]
            keys[i] = a if a < b else b
            i >>= 1
    return out


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


_WARM: set = set()


def _warm_up(dtype: np.dtype) -> None:
    """Run every kernel once per dtype so compilation (or the on-disk cache load) happens here, not at step 1."""
    if dtype in _WARM:
        return
    sums, minp, keys = np.zeros(4, dtype), np.full(4, np.inf, dtype), np.full(4, np.inf, dtype)
    slots = np.array([0, 1], np.int64)
    values = np.ones(2, dtype)
    _set_leaves(sums, minp, keys, 2, slots, values, values)
    _descend(sums, 2, _stratified_targets(2.0, np.array([0.5, 0.5])))
    _pop_min(sums, minp, keys, 2, 1)
    _WARM.add(dtype)


class SumTree:
    """Sampling priorities with O(log N) set / sample / argmin, plus a key tree for evict-lowest.

    The class only validates shapes and owns the arrays; it holds no policy. Priorities must be finite and
    >= 0 (the buffer validates user input before it reaches here).
    """

    def __init__(self, capacity: int, dtype: np.dtype | type = np.float64) -> None:
        if not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
            raise ValueError(f"dtype must be float64 or float32, got {dtype}")
        self.capacity = int(capacity)
        self.dtype = dtype
        self.n_leaves = _next_power_of_two(self.capacity)
        size = 2 * self.n_leaves
        self.sums = np.zeros(size, dtype)
        self.minp = np.full(size, np.inf, dtype)
        self.keys = np.full(size, np.inf, dtype)
        _warm_up(dtype)

    @property
    def total(self) -> float:
        return float(self.sums[1])

    def min_priority(self) -> float:
        """Smallest positive priority (inf when no leaf is positive)."""
        return float(self.minp[1])

    def min_key(self) -> float:
        return float(self.keys[1])

    def get(self, slots: np.ndarray) -> np.ndarray:
        return self.sums[np.asarray(slots, np.int64) + self.n_leaves]

    def get_keys(self, slots: np.ndarray) -> np.ndarray:
        return self.keys[np.asarray(slots, np.int64) + self.n_leaves]

    def set(self, slots: np.ndarray, priorities: np.ndarray, keys: np.ndarray | None = None) -> None:
        """Set leaves; a slot given twice keeps its last value. ``keys`` default to the priorities."""
        slots = np.ascontiguousarray(slots, np.int64)
        if slots.size == 0:
            return
        priorities = np.ascontiguousarray(np.broadcast_to(priorities, slots.shape), self.dtype)
        keys = priorities if keys is None else np.ascontiguousarray(np.broadcast_to(keys, slots.shape), self.dtype)
        if slots.min() < 0 or slots.max() >= self.capacity:
            raise IndexError(f"slots must lie in [0, {self.capacity}), got range [{slots.min()}, {slots.max()}]")
        _set_leaves(self.sums, self.minp, self.keys, self.n_leaves, slots, priorities, keys)

    def sample(self, uniforms: np.ndarray, stratified: bool = True) -> np.ndarray:
        """Map uniforms in [0, 1) to slots with probability priority / total.

        Stratified: draw j lands in the j-th of K equal segments of the mass (lower variance, as in PER).
        Independent: each draw covers the whole mass.
        """
        total = self.sums[1]
        if not total > 0:
            raise ValueError("cannot sample: the total priority is 0")
        u = np.ascontiguousarray(uniforms, np.float64)
        targets = _stratified_targets(float(total), u) if stratified else u * float(total)
        return _descend(self.sums, self.n_leaves, targets)

    def argmin(self) -> int:
        """Slot of the smallest key (lowest slot among ties)."""
        return int(_argmin_key(self.keys, self.n_leaves))

    def pop_min(self, k: int) -> np.ndarray:
        """Empty and return the k lowest-key slots. Only non-empty slots can be popped."""
        if k < 0 or k > self.capacity:
            raise ValueError(f"k must lie in [0, {self.capacity}], got {k}")
        return _pop_min(self.sums, self.minp, self.keys, self.n_leaves, int(k))

    def clear(self) -> None:
        self.sums[:] = 0
        self.minp[:] = np.inf
        self.keys[:] = np.inf
