"""Sum tree + min trees in one interleaved array, with Numba kernels.

Layout: a 1-indexed binary heap over ``P`` leaves (``P`` = capacity rounded up to a power of two). Node ``i``
has children ``2i`` and ``2i+1``; the leaf of slot ``s`` is node ``P + s``. Each node is one row of four
numbers, so the two children of a node share one 64-byte cache line (float64) and an update touches one line
per level instead of one per array:

* column 0, ``SUM``  -- sampling priorities; a parent is the sum of its children.
* column 1, ``MINP`` -- the same priorities with 0 (never sampled) read as +inf; the root is the smallest
  positive priority, which importance weights need (P_min).
* column 2, ``KEY``  -- eviction keys (raw weights, or anything the caller ranks by); the root is the smallest
  key, and a descent finds its leaf in O(log N). Empty leaves hold +inf so they are never "evicted".
* column 3, ``RAW``  -- a second sum, of raw weights (priorities before the alpha power), so the mean weight
  is exact at any alpha.

Every write recomputes ancestors from their children instead of adding deltas, so the tree never drifts.
Kernels process a whole batch one tree level at a time: the K independent descents (or ascents) of a level
issue their memory loads together, which hides cache misses at large N.
"""
from __future__ import annotations

import numpy as np
from numba import njit

MINP, KEY, RAW = 0, 1, 2  # columns of the aux array
_INF = np.inf


@njit(cache=True, nogil=True, inline="always")
def _pull(sums, aux, i):
    """Recompute node i from its two children."""
    left = 2 * i
    right = left + 1
    sums[i] = sums[left] + sums[right]
    a, b = aux[left, 0], aux[right, 0]
    aux[i, 0] = a if a < b else b
    a, b = aux[left, 1], aux[right, 1]
    aux[i, 1] = a if a < b else b
    aux[i, 2] = aux[left, 2] + aux[right, 2]


@njit(cache=True, nogil=True)
def _set_leaves(sums, aux, n_leaves, slots, priorities, keys, raw):
    """Write leaves (in order, so a duplicated slot keeps its last value), then recompute ancestors.

    Ascents run level by level. On levels with fewer nodes than walks, where walks meet, a shared ancestor is
    recomputed once and the walks that reach it again stop; below that, repeats are rare and harmless.
    """
    k = slots.shape[0]
    nodes = np.empty(k, np.int64)
    for j in range(k):
        i = slots[j] + n_leaves
        p = priorities[j]
        sums[i] = p
        aux[i, 0] = p if p > 0 else _INF
        aux[i, 1] = keys[j]
        aux[i, 2] = raw[j]
        nodes[j] = i >> 1
    seen = np.zeros(k, np.int64)  # seen[i - width] == width: node i was done on the level of that width
    active = k
    width = n_leaves >> 1  # nodes on the current level are [width, 2 * width)
    while width >= 1:
        kept = 0
        for j in range(active):
            i = nodes[j]
            if width < k:
                if seen[i - width] == width:
                    continue
                seen[i - width] = width
            _pull(sums, aux, i)
            nodes[kept] = i >> 1
            kept += 1
        active = kept
        width >>= 1


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
def _argmin_key(aux, n_leaves):
    i = 1
    while i < n_leaves:
        left = 2 * i
        i = left if aux[left, 1] <= aux[left + 1, 1] else left + 1
    return i - n_leaves


@njit(cache=True, nogil=True)
def _pop_min(sums, aux, n_leaves, k):
    """Remove the k lowest-key leaves (distinct) and return their slots; ties go to the lowest slot."""
    out = np.empty(k, np.int64)
    for j in range(k):
        s = _argmin_key(aux, n_leaves)
        out[j] = s
        i = s + n_leaves
        sums[i] = 0.0
        aux[i, 0] = _INF
        aux[i, 1] = _INF
        aux[i, 2] = 0.0
        i >>= 1
        while i >= 1:
            _pull(sums, aux, i)
            i >>= 1
    return out


@njit(cache=True, nogil=True)
def _lowest_leaves(aux, n_leaves, capacity, k):
    """The k lowest-key slots in (key, slot) order, by one O(N) scan: cheaper than k descents when k is a
    sizeable fraction of N. Same result and order as k successive argmin pops."""
    keys = aux[n_leaves:n_leaves + capacity, 1]
    threshold = np.partition(keys, k - 1)[k - 1]
    out = np.empty(k, np.int64)
    n = 0
    for s in range(capacity):  # strictly below the threshold: all of them belong
        if keys[s] < threshold:
            out[n] = s
            n += 1
    for s in range(capacity):  # ties at the threshold: lowest slots first
        if n == k:
            break
        if keys[s] == threshold:
            out[n] = s
            n += 1
    order = np.argsort(keys[out], kind="mergesort")  # stable: equal keys keep slot order
    return out[order]


def _empty_tree(n_leaves: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The sums (alone, so sampling descents read 8 bytes a node) and the aux rows [minp, key, raw, pad]."""
    aux = np.zeros((2 * n_leaves, 4), dtype)
    aux[:, MINP] = np.inf
    aux[:, KEY] = np.inf
    return np.zeros(2 * n_leaves, dtype), aux


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


_WARM: set = set()


def _warm_up(dtype: np.dtype) -> None:
    """Run every kernel once per dtype so compilation (or the on-disk cache load) happens here, not at step 1."""
    if dtype in _WARM:
        return
    sums, aux = _empty_tree(2, dtype)
    values = np.ones(2, dtype)
    _set_leaves(sums, aux, 2, np.array([0, 1], np.int64), values, values, values)
    _descend(sums, 2, _stratified_targets(2.0, np.array([0.5, 0.5])))
    _pop_min(sums, aux, 2, 1)
    _lowest_leaves(aux, 2, 2, 1)
    _WARM.add(dtype)


class SumTree:
    """Sampling priorities with O(log N) set / sample / argmin, plus a key tree for evict-lowest.

    The class only validates shapes and owns the array; it holds no policy. Priorities must be finite and
    >= 0 (the buffer validates user input before it reaches here).
    """

    def __init__(self, capacity: int, dtype: np.dtype | type = np.float64) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
            raise ValueError(f"dtype must be float64 or float32, got {dtype}")
        self.capacity = int(capacity)
        self.dtype = dtype
        self.n_leaves = _next_power_of_two(self.capacity)
        self.sums, self.aux = _empty_tree(self.n_leaves, dtype)
        _warm_up(dtype)

    @property
    def total(self) -> float:
        return float(self.sums[1])

    def raw_total(self) -> float:
        """Sum of the raw weights (the ``raw`` argument of `set`)."""
        return float(self.aux[1, RAW])

    def min_priority(self) -> float:
        """Smallest positive priority (inf when no leaf is positive)."""
        return float(self.aux[1, MINP])

    def min_key(self) -> float:
        return float(self.aux[1, KEY])

    def get(self, slots: np.ndarray) -> np.ndarray:
        return self.sums[np.asarray(slots, np.int64) + self.n_leaves]

    def get_keys(self, slots: np.ndarray) -> np.ndarray:
        return self.aux[np.asarray(slots, np.int64) + self.n_leaves, KEY]

    def set_unchecked(self, slots: np.ndarray, priorities: np.ndarray, keys: np.ndarray, raw: np.ndarray) -> None:
        """`set` for trusted callers: int64 slots in range and contiguous arrays of this tree's dtype."""
        _set_leaves(self.sums, self.aux, self.n_leaves, slots, priorities, keys, raw)

    def set(self, slots: np.ndarray, priorities: np.ndarray, keys: np.ndarray | None = None,
            raw: np.ndarray | None = None) -> None:
        """Set leaves; a slot given twice keeps its last value. ``keys`` and ``raw`` default to the priorities."""
        slots = np.ascontiguousarray(slots, np.int64)
        if slots.size == 0:
            return
        if slots.min() < 0 or slots.max() >= self.capacity:
            raise IndexError(f"slots must lie in [0, {self.capacity}), got range [{slots.min()}, {slots.max()}]")
        priorities = self._column(priorities, slots)
        keys = priorities if keys is None else self._column(keys, slots)
        raw = priorities if raw is None else self._column(raw, slots)
        _set_leaves(self.sums, self.aux, self.n_leaves, slots, priorities, keys, raw)

    def _column(self, values, slots: np.ndarray) -> np.ndarray:
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
        u = np.ascontiguousarray(uniforms, np.float64)
        targets = _stratified_targets(total, u) if stratified else u * total
        return _descend(self.sums, self.n_leaves, targets)

    def argmin(self) -> int:
        """Slot of the smallest key (lowest slot among ties)."""
        return int(_argmin_key(self.aux, self.n_leaves))

    def pop_min(self, k: int) -> np.ndarray:
        """Empty and return the k lowest-key slots. Only non-empty slots can be popped."""
        if k < 0 or k > self.capacity:
            raise ValueError(f"k must lie in [0, {self.capacity}], got {k}")
        k = int(k)
        depth = self.n_leaves.bit_length()
        if k == 0 or 8 * k * depth < self.capacity:
            return _pop_min(self.sums, self.aux, self.n_leaves, k)
        slots = _lowest_leaves(self.aux, self.n_leaves, self.capacity, k)
        zeros = np.zeros(k, self.dtype)
        _set_leaves(self.sums, self.aux, self.n_leaves, slots, zeros, np.full(k, np.inf, self.dtype), zeros)
        return slots

    def clear(self) -> None:
        sums, aux = _empty_tree(self.n_leaves, self.dtype)
        self.sums[:], self.aux[:] = sums, aux
