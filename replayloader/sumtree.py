"""Sum tree with optional min trees, in one interleaved array, with Numba kernels.

Layout: a 1-indexed binary heap over ``P`` leaves (``P`` = capacity rounded up to a power of two). Node ``i``
has children ``2i`` and ``2i+1``; the leaf of slot ``s`` is node ``P + s``. Each node is one row holding the
columns the caller asked for, so the two children of a node sit side by side and an update or a descent
touches about one cache line per level:

* ``sum``  (always)      -- sampling priorities; a parent is the sum of its children.
* ``minp`` (min_priority) -- the priorities again, 0 (never sampled) read as +inf; the root is the smallest
  positive priority, which importance weights need (P_min).
* ``key``  (min_key)      -- eviction keys (raw weights, or anything the caller ranks by); the root is the
  smallest key, and a descent finds its leaf in O(log N). Empty leaves hold +inf, so they are never evicted.
* ``raw``  (raw_sum)      -- a second sum, of raw weights (before the alpha power), so a mean weight is exact.

Columns nobody needs are not stored: the paper's setting (evict-lowest, no importance weights, alpha = 1)
keeps 16 bytes a node instead of 32. Every write recomputes ancestors from their children instead of adding
deltas, so the tree never drifts. Kernels process a batch one level at a time: the K independent descents (or
ascents) of a level issue their loads together, which hides cache misses at large N.
"""
from __future__ import annotations

import numpy as np
from numba import njit

_INF = np.inf


@njit(cache=True, nogil=True, inline="always")
def _pull(tree, i, c_minp, c_key, c_raw):
    """Recompute node i from its two children (absent columns have index -1)."""
    left = 2 * i
    right = left + 1
    tree[i, 0] = tree[left, 0] + tree[right, 0]
    if c_minp >= 0:
        a, b = tree[left, c_minp], tree[right, c_minp]
        tree[i, c_minp] = a if a < b else b
    if c_key >= 0:
        a, b = tree[left, c_key], tree[right, c_key]
        tree[i, c_key] = a if a < b else b
    if c_raw >= 0:
        tree[i, c_raw] = tree[left, c_raw] + tree[right, c_raw]


@njit(cache=True, nogil=True)
def _set_leaves(tree, n_leaves, c_minp, c_key, c_raw, slots, priorities, keys, raw):
    """Write leaves (in order, so a duplicated slot keeps its last value), then recompute ancestors.

    Ascents run level by level. On levels with fewer nodes than walks, where walks meet, a shared ancestor is
    recomputed once and the walks that reach it again stop; below that, repeats are rare and harmless.
    """
    k = slots.shape[0]
    nodes = np.empty(k, np.int64)
    for j in range(k):
        i = slots[j] + n_leaves
        p = priorities[j]
        tree[i, 0] = p
        if c_minp >= 0:
            tree[i, c_minp] = p if p > 0 else _INF
        if c_key >= 0:
            tree[i, c_key] = keys[j]
        if c_raw >= 0:
            tree[i, c_raw] = raw[j]
        nodes[j] = i >> 1
    seen = np.zeros(k, np.int64)  # seen[i - width] == width: node i was done on the level of that width
    active = k
    width = n_leaves >> 1  # the current level's nodes are [width, 2 * width)
    while width >= 1:
        kept = 0
        for j in range(active):
            i = nodes[j]
            if width < k:
                if seen[i - width] == width:
                    continue
                seen[i - width] = width
            _pull(tree, i, c_minp, c_key, c_raw)
            nodes[kept] = i >> 1
            kept += 1
        active = kept
        width >>= 1


@njit(cache=True, nogil=True)
def _descend(tree, n_leaves, targets):
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
            mass_left = tree[left, 0]
            if (u[j] < mass_left and mass_left > 0.0) or tree[left + 1, 0] <= 0.0:
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
def _argmin_key(tree, n_leaves, c_key):
    i = 1
    while i < n_leaves:
        left = 2 * i
        i = left if tree[left, c_key] <= tree[left + 1, c_key] else left + 1
    return i - n_leaves


@njit(cache=True, nogil=True)
def _take_min_keys(tree, n_leaves, c_key, k):
    """The k lowest-key slots in (key, slot) order: k argmin descents, each followed by an ascent that only
    refreshes the key column (the other columns get one batched recompute from the caller)."""
    out = np.empty(k, np.int64)
    for j in range(k):
        s = _argmin_key(tree, n_leaves, c_key)
        out[j] = s
        i = s + n_leaves
        tree[i, c_key] = _INF
        i >>= 1
        while i >= 1:
            a, b = tree[2 * i, c_key], tree[2 * i + 1, c_key]
            tree[i, c_key] = a if a < b else b
            i >>= 1
    return out


_WARM: set = set()


def _warm_up(dtype: np.dtype) -> None:
    """Run every kernel once per dtype so compilation (or the on-disk cache load) happens here, not at step 1."""
    if dtype in _WARM:
        return
    tree = np.zeros((4, 4), dtype)
    values = np.ones(2, dtype)
    _set_leaves(tree, 2, 1, 2, 3, np.array([0, 1], np.int64), values, values, values)
    _descend(tree, 2, _stratified_targets(2.0, np.array([0.5, 0.5])))
    _take_min_keys(tree, 2, 2, 1)
    _WARM.add(dtype)


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


class SumTree:
    """Sampling priorities with O(log N) set / sample, plus optional min trees (P_min, argmin for eviction)
    and a raw-weight sum.

    The class validates shapes and owns the array; it holds no policy. Priorities must be finite and >= 0
    (the buffer validates user input before it reaches here). Asking for a column that was not tracked raises.
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
        columns = 1
        self.c_minp = self.c_key = self.c_raw = -1
        if min_priority:
            self.c_minp, columns = columns, columns + 1
        if min_key:
            self.c_key, columns = columns, columns + 1
        if raw_sum:
            self.c_raw, columns = columns, columns + 1
        self.columns = columns
        self.tree = np.empty((2 * self.n_leaves, columns), dtype)
        self.clear()
        _warm_up(dtype)

    def _cols(self) -> tuple[int, int, int]:
        return self.c_minp, self.c_key, self.c_raw

    def _need(self, column: int, what: str) -> int:
        if column < 0:
            raise RuntimeError(f"this SumTree does not track {what}; construct it with {what}=True")
        return column

    @property
    def total(self) -> float:
        return float(self.tree[1, 0])

    def raw_total(self) -> float:
        """Sum of the raw weights (the ``raw`` argument of `set`)."""
        return float(self.tree[1, self._need(self.c_raw, "raw_sum")])

    def min_priority(self) -> float:
        """Smallest positive priority (inf when no leaf is positive)."""
        return float(self.tree[1, self._need(self.c_minp, "min_priority")])

    def min_key(self) -> float:
        return float(self.tree[1, self._need(self.c_key, "min_key")])

    def get(self, slots: np.ndarray) -> np.ndarray:
        return self.tree[np.asarray(slots, np.int64) + self.n_leaves, 0]

    def get_keys(self, slots: np.ndarray) -> np.ndarray:
        return self.tree[np.asarray(slots, np.int64) + self.n_leaves, self._need(self.c_key, "min_key")]

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
        _set_leaves(self.tree, self.n_leaves, *self._cols(), slots, priorities, keys, raw)

    def set_unchecked(self, slots: np.ndarray, priorities: np.ndarray, keys: np.ndarray, raw: np.ndarray) -> None:
        """`set` for trusted callers: int64 slots in range and contiguous arrays of this tree's dtype."""
        _set_leaves(self.tree, self.n_leaves, *self._cols(), slots, priorities, keys, raw)

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
        total = float(self.tree[1, 0])
        if not total > 0:
            raise ValueError("cannot sample: the total priority is 0")
        u = np.ascontiguousarray(uniforms, np.float64)
        targets = _stratified_targets(total, u) if stratified else u * total
        return _descend(self.tree, self.n_leaves, targets)

    def argmin(self) -> int:
        """Slot of the smallest key (lowest slot among ties)."""
        return int(_argmin_key(self.tree, self.n_leaves, self._need(self.c_key, "min_key")))

    def pop_min(self, k: int, empty: bool = True) -> np.ndarray:
        """Return the k lowest-key slots in (key, slot) order; only non-empty slots can be popped.

        ``empty=True`` empties those leaves (priority 0). ``empty=False`` only sets their keys to +inf and leaves
        their priorities in place, for a caller that `set`s the same slots right away (the buffer's
        evict-then-write), which saves one batched ascent.
        """
        c_key = self._need(self.c_key, "min_key")
        if k < 0 or k > self.capacity:
            raise ValueError(f"k must lie in [0, {self.capacity}], got {k}")
        slots = _take_min_keys(self.tree, self.n_leaves, c_key, int(k))
        if empty and k:
            zeros = np.zeros(k, self.dtype)
            self.set_unchecked(slots, zeros, np.full(k, np.inf, self.dtype), zeros)
        return slots

    def clear(self) -> None:
        self.tree[:] = 0
        for column in (self.c_minp, self.c_key):
            if column >= 0:
                self.tree[:, column] = np.inf
