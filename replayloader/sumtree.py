"""SumTree: sampling priorities with O(log N) set / sample, optional min trees (P_min, argmin for eviction) and
a raw-weight sum. The arrays and their layout are described in `kernels.tree`, which holds the Numba kernels;
this class owns the arrays and validates input.
"""
from __future__ import annotations

import numpy as np

from . import _checks as checks

from .kernels.tree import (
    KERNEL_NAMES,
    argmin_key,
    make_layout,
    replace_lowest,
    sample_leaves,
    select_lowest,
    set_leaves,
    set_leaves_checked,
)

# How a batch of k draws reads the tree's mass (`SumTree.sample`'s ``stratified``): one draw in each of k equal
# segments, or k independent draws. The buffers and the sampler take it as their ``sampling=``.
SAMPLINGS = ("stratified", "independent")


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

    ``kernels`` picks how a write recomputes the ancestors (`kernels.tree`): ``"levels"`` (default; level by
    level across the batch) or ``"walks"`` (the original, walk by walk). Both leave the same array with the
    same values, bit for bit, so draws, totals and minima are the same.
    """

    def __init__(self, capacity: int, dtype: np.dtype | type = np.float64, *, min_priority: bool = True,
                 min_key: bool = True, raw_sum: bool = True, kernels: str = "levels") -> None:
        capacity = checks.integer("capacity", capacity, 1)
        if kernels not in KERNEL_NAMES:
            raise ValueError(f"kernels must be one of {sorted(KERNEL_NAMES)}, got {kernels!r}")
        self.kernels = kernels
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
        self.layout = make_layout(self.n_leaves, self.c_raw, self.c_minp, self.c_keys, KERNEL_NAMES[kernels])

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

    def max_weight(self, alpha: float) -> float:
        """The largest weight w that may be written with exponent ``alpha``: with every leaf at w, its priority
        w^alpha and w itself (the raw sum) summed over all leaves stay finite in this tree's dtype, with a
        factor 2 to spare for rounding. A larger weight is refused where it enters (feedback, an initializer's
        answer): an inf total would turn every probability into NaN."""
        top = float(np.finfo(self.dtype).max) / (2.0 * self.n_leaves)
        return top if alpha <= 1.0 else top ** (1.0 / alpha)

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
        bad = set_leaves_checked(self.nodes, self.layout, self.capacity, slots, priorities, keys, raw)
        if bad >= 0:
            raise IndexError(f"slots must lie in [0, {self.capacity}), got slots[{bad}] = {slots[bad]}")

    def set_unchecked(self, slots: np.ndarray, priorities: np.ndarray, keys: np.ndarray, raw: np.ndarray) -> None:
        """`set` for trusted callers: int64 slots in range and contiguous arrays of this tree's dtype."""
        set_leaves(self.nodes, self.layout, slots, priorities, keys, raw)

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
        if not (type(uniforms) is np.ndarray and uniforms.dtype == np.float64 and uniforms.ndim == 1):
            uniforms = np.asarray(uniforms, np.float64).reshape(-1)
        return sample_leaves(self.nodes, self.n_leaves, uniforms, total, bool(stratified))

    def argmin(self) -> int:
        """Slot of the smallest key (lowest slot among ties)."""
        self._need(self.keys, "min_key")
        return int(argmin_key(self.nodes, self.layout))

    def lowest(self, k: int) -> np.ndarray:
        """The k lowest-key slots in (key, slot) order, among the non-empty ones; changes nothing."""
        self._need(self.keys, "min_key")
        k = self._check_k(k)
        try:
            return select_lowest(self.nodes, self.layout, k)
        except ValueError as err:
            raise _too_few(k) from err

    def pop_min(self, k: int, empty: bool = True) -> np.ndarray:
        """Return the k lowest-key slots in (key, slot) order; only non-empty slots can be popped.

        ``empty=True`` empties those leaves (priority 0). ``empty=False`` only sets their keys to +inf and leaves
        their priorities in place. To overwrite the lowest leaves with new values, `replace_min` does it in
        one pass.
        """
        slots = self.lowest(k)
        k = len(slots)
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
            return replace_lowest(self.nodes, self.layout, k, priorities, keys, raw)
        except ValueError as err:  # the selection refuses, before anything is written
            raise _too_few(k) from err

    def _check_k(self, k) -> int:
        return checks.integer("k", k, 0, self.capacity)

    def clear(self) -> None:
        self.sums[:] = 0
        self.raw[:] = 0
        self.minp[:] = np.inf
        self.keys[:] = np.inf
