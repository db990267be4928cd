"""Sum tree with optional min trees, over flat arrays, with Numba kernels.

Layout: a 1-indexed binary heap over ``P`` leaves (``P`` = capacity rounded up to a power of two). Node ``i``
has children ``2i`` and ``2i+1``; the leaf of slot ``s`` is node ``P + s``. Each tracked quantity is its own
contiguous array of ``2P`` nodes, so a sampling descent reads 8 bytes a node and siblings share a cache line:

* ``sums``  (always)      -- sampling priorities; a parent is the sum of its children.
* ``minp``  (min_priority) -- the priorities again, 0 (never sampled) read as +inf; the root is the smallest
  positive priority, which importance weights need (P_min).
* ``keys``  (min_key)      -- eviction keys (raw weights, or anything the caller ranks by); the root is the
  smallest key, and a descent finds its leaf in O(log N). Empty leaves hold +inf, so they are never evicted.
* ``raw``   (raw_sum)      -- a second sum, of raw weights (before the alpha power), so a mean weight is exact.

Untracked arrays are not allocated. Every write recomputes ancestors from their children instead of adding
deltas, so the tree never drifts. Sums ascend level by level for the whole batch (K independent walks issue
their loads together, hiding cache misses; a shared ancestor is recomputed once). Min arrays ascend walk by
walk and stop at the first ancestor whose minimum did not change: above it nothing can change.
"""
from __future__ import annotations

import numpy as np
from numba import njit

_INF = np.inf


@njit(cache=True, nogil=True, inline="always")
def _ascend_min(tree, leaf, stop=1):
    """Recompute minima above one leaf, on nodes >= stop; end where a minimum is unchanged (nothing above it
    can change)."""
    i = leaf >> 1
    while i >= stop:
        a, b = tree[2 * i], tree[2 * i + 1]
        m = a if a < b else b
        if tree[i] == m:
            break
        tree[i] = m
        i >>= 1


@njit(cache=True, nogil=True)
def _ascend(sums, raw, minp, keys, n_leaves, slots):
    """Recompute every ancestor of `slots` in each tracked array (length 0 = untracked).

    Sums go up level by level for the whole batch: all K walks issue their loads together (hiding cache
    misses) and where walks meet a node is done once. Min arrays go up walk by walk and stop at the first
    node whose minimum did not change (nothing above it can change), which after a random update is usually
    within a level or two. Once a level is narrow enough that the walks cover a good part of it, every array
    recomputes that level and all above it whole: a contiguous pass with no bookkeeping is cheaper there.
    """
    has_raw, has_minp, has_keys = raw.shape[0] > 0, minp.shape[0] > 0, keys.shape[0] > 0
    k = slots.shape[0]
    nodes = np.empty(k, np.int64)
    for j in range(k):
        nodes[j] = (slots[j] + n_leaves) >> 1
    seen = np.zeros(0, np.int64)  # seen[i - width] == width: node i was done on the level of that width
    active = k
    width = n_leaves >> 1  # the current level's nodes are [width, 2 * width)
    while width >= 1 and width > 2 * active:
        dedupe = width < k  # walks can only meet on levels narrower than the batch
        if dedupe and seen.shape[0] == 0:
            seen = np.zeros(k, np.int64)
        kept = 0
        for j in range(active):
            i = nodes[j]
            if dedupe:
                if seen[i - width] == width:
                    continue
                seen[i - width] = width
            sums[i] = sums[2 * i] + sums[2 * i + 1]
            if has_raw:
                raw[i] = raw[2 * i] + raw[2 * i + 1]
            nodes[kept] = i >> 1
            kept += 1
        active = kept
        width >>= 1
    dense = width  # levels of width <= dense are recomputed whole below
    if has_minp:
        for j in range(k):
            _ascend_min(minp, slots[j] + n_leaves, 2 * dense)
    if has_keys:
        for j in range(k):
            _ascend_min(keys, slots[j] + n_leaves, 2 * dense)
    while width >= 1:
        for i in range(width, 2 * width):
            sums[i] = sums[2 * i] + sums[2 * i + 1]
        if has_raw:
            for i in range(width, 2 * width):
                raw[i] = raw[2 * i] + raw[2 * i + 1]
        if has_minp:
            for i in range(width, 2 * width):
                minp[i] = min(minp[2 * i], minp[2 * i + 1])
        if has_keys:
            for i in range(width, 2 * width):
                keys[i] = min(keys[2 * i], keys[2 * i + 1])
        width >>= 1


@njit(cache=True, nogil=True)
def _set_leaves(sums, raw, minp, keys, n_leaves, slots, priorities, new_keys, new_raw):
    """Write leaves (in order, so a duplicated slot keeps its last value), then recompute ancestors.

    Arrays of length 0 are untracked and skipped.
    """
    has_raw, has_minp, has_keys = raw.shape[0] > 0, minp.shape[0] > 0, keys.shape[0] > 0
    k = slots.shape[0]
    for j in range(k):
        i = slots[j] + n_leaves
        p = priorities[j]
        sums[i] = p
        if has_raw:
            raw[i] = new_raw[j]
        if has_minp:
            minp[i] = p if p > 0 else _INF
        if has_keys:
            keys[i] = new_keys[j]
    _ascend(sums, raw, minp, keys, n_leaves, slots)


@njit(cache=True, nogil=True)
def _set_leaves_checked(sums, raw, minp, keys, n_leaves, capacity, slots, priorities, new_keys, new_raw):
    """`_set_leaves` after checking every slot lies in [0, capacity); returns the first bad index (nothing
    written) or -1."""
    for j in range(slots.shape[0]):
        if slots[j] < 0 or slots[j] >= capacity:
            return j
    _set_leaves(sums, raw, minp, keys, n_leaves, slots, priorities, new_keys, new_raw)
    return -1


@njit(cache=True, nogil=True)
def _descend(sums, n_leaves, targets):
    """Find, for each target mass, the leaf whose cumulative range holds it.

    Never enters a subtree of zero mass, so a leaf of priority 0 (or an empty slot past the end) is never
    returned, even when rounding pushes a target to or past an edge. The K walks go down level by level
    together (their loads overlap), and the left/right choice is arithmetic, not a branch: with fresh
    uniforms each call, a branch would be mispredicted half the time.
    """
    k = targets.shape[0]
    nodes = np.ones(k, np.int64)
    u = targets.copy()
    while nodes[0] < n_leaves:
        for j in range(k):
            left = 2 * nodes[j]
            mass_left = sums[left]
            go_right = ((u[j] >= mass_left) | (mass_left <= 0.0)) & (sums[left + 1] > 0.0)
            u[j] -= mass_left * go_right
            nodes[j] = left + go_right
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
def _take_min_keys(keys, n_leaves, k):
    """The k lowest-key slots in (key, slot) order: k argmin descents, each followed by setting that key to
    +inf and re-ascending the key array only (the caller recomputes the rest in one batch)."""
    out = np.empty(k, np.int64)
    for j in range(k):
        s = _argmin_key(keys, n_leaves)
        out[j] = s
        keys[s + n_leaves] = _INF
        _ascend_min(keys, s + n_leaves)
    return out


@njit(cache=True, nogil=True)
def select_lowest_keys(keys, n_leaves, k):
    """TEMPORARY: the k lowest-key slots without changing `keys` (pop, then restore)."""
    out = np.empty(k, np.int64)
    old = np.empty(k, keys.dtype)
    for j in range(k):
        s = _argmin_key(keys, n_leaves)
        out[j] = s
        old[j] = keys[s + n_leaves]
        keys[s + n_leaves] = _INF
        _ascend_min(keys, s + n_leaves)
    for j in range(k):
        keys[out[j] + n_leaves] = old[j]
        _ascend_min(keys, out[j] + n_leaves)
    return out


_WARM: set = set()


def _warm_up(dtype: np.dtype) -> None:
    """Run every kernel once per dtype so compilation (or the on-disk cache load) happens here, not at step 1."""
    if dtype in _WARM:
        return
    sums, raw, minp, keys = np.zeros(4, dtype), np.zeros(4, dtype), np.full(4, np.inf, dtype), np.full(4, np.inf, dtype)
    values = np.ones(2, dtype)
    _set_leaves(sums, raw, minp, keys, 2, np.array([0, 1], np.int64), values, values, values)
    _set_leaves(sums, raw[:0], minp[:0], keys[:0], 2, np.array([0, 1], np.int64), values, values, values)
    _set_leaves_checked(sums, raw, minp, keys, 2, 2, np.array([0, 1], np.int64), values, values, values)
    _descend(sums, 2, _stratified_targets(2.0, np.array([0.5, 0.5])))
    _take_min_keys(keys, 2, 1)
    _WARM.add(dtype)


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
        size = 2 * self.n_leaves
        self.sums = np.zeros(size, dtype)
        self.raw = np.zeros(size if raw_sum else 0, dtype)
        self.minp = np.full(size if min_priority else 0, np.inf, dtype)
        self.keys = np.full(size if min_key else 0, np.inf, dtype)
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
        bad = _set_leaves_checked(self.sums, self.raw, self.minp, self.keys, self.n_leaves, self.capacity, slots,
                                  priorities, keys, raw)
        if bad >= 0:
            raise IndexError(f"slots must lie in [0, {self.capacity}), got slots[{bad}] = {slots[bad]}")

    def set_unchecked(self, slots: np.ndarray, priorities: np.ndarray, keys: np.ndarray, raw: np.ndarray) -> None:
        """`set` for trusted callers: int64 slots in range and contiguous arrays of this tree's dtype."""
        _set_leaves(self.sums, self.raw, self.minp, self.keys, self.n_leaves, slots, priorities, keys, raw)

    def _column(self, values, slots: np.ndarray) -> np.ndarray:
        if (type(values) is np.ndarray and values.dtype == self.dtype and values.shape == slots.shape
                and values.flags.c_contiguous):
            return values
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
        return int(_argmin_key(self._need(self.keys, "min_key"), self.n_leaves))

    def pop_min(self, k: int, empty: bool = True) -> np.ndarray:
        """Return the k lowest-key slots in (key, slot) order; only non-empty slots can be popped.

        ``empty=True`` empties those leaves (priority 0). ``empty=False`` only sets their keys to +inf and leaves
        their priorities in place, for a caller that `set`s the same slots right away (the buffer's
        evict-then-write), which saves one batched ascent.
        """
        keys = self._need(self.keys, "min_key")
        if k < 0 or k > self.capacity:
            raise ValueError(f"k must lie in [0, {self.capacity}], got {k}")
        slots = _take_min_keys(keys, self.n_leaves, int(k))
        if empty and k:
            zeros = np.zeros(k, self.dtype)
            self.set_unchecked(slots, zeros, np.full(k, np.inf, self.dtype), zeros)
        return slots

    def clear(self) -> None:
        self.sums[:] = 0
        self.raw[:] = 0
        self.minp[:] = np.inf
        self.keys[:] = np.inf
