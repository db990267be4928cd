"""Numba kernels of the sum tree: optional min trees and a raw-weight sum, interleaved in one node array.

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

Kernels take the tree as two arrays: ``nodes`` and ``layout = [n_leaves, c_raw, c_minp, c_keys, kernels]``,
the leaf count, the column of each optional quantity (-1 when untracked) and which kernels write the tree
(`LEVELS` or `WALKS`), made by `make_layout`. Every write recomputes ancestors from their children instead of
adding deltas, so the tree never drifts.

Two sets of write kernels walk the same array, with bit-identical results (the same node values after every
write; draws are untouched):

* `LEVELS` (the default): a write recomputes the K walks' ancestors level by level across the walks, with no
  bookkeeping, so the K cache misses of a level overlap (`ascend_levels`), about twice as fast at N >= 1e5.
* `WALKS` (the original): each slot's ancestors to the top of the levels wider than 2K, walk by walk
  (`_ascend_walks`).

A wider node (a descent that reads the four grandchildren of node i, rows 4i..4i+3, one 64-byte line for rows
of up to 16 bytes, and takes two levels a step, leaf for leaf the same walk) was measured and lost: 0.95-1.13x
the binary descent at N = 1e4..1e7 (results/bench_sumtree/bench_sumtree_wide.md, bench/wide_descent.py). The K descents
already go down together, so their misses overlap and a descent is not bound by the lines it touches.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .minselect import select_min_keys

_INF = np.inf
N_LEAVES, C_RAW, C_MINP, C_KEYS, KERNELS = 0, 1, 2, 3, 4  # positions in a layout vector
LEVELS, WALKS = 0, 1  # values of layout[KERNELS]
KERNEL_NAMES = {"levels": LEVELS, "walks": WALKS}


def make_layout(n_leaves: int, c_raw: int, c_minp: int, c_keys: int, kernels: int = LEVELS) -> np.ndarray:
    """The layout vector kernels read the tree's shape from (one small array instead of five scalars)."""
    return np.array([n_leaves, c_raw, c_minp, c_keys, kernels], np.int64)


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
def ascend_levels(nodes, c_raw, c_minp, c_keys, n_leaves, slots):
    """Recompute every ancestor of `slots` (the `LEVELS` kernels), in two regimes:

    * levels wider than K: level by level, every walk's node on that level, no bookkeeping. A node shared by
      several walks is recomputed once per walk, each time from children finished on the level below, so
      every recomputation gives the same, exact value; the K recomputations of a level are independent, so
      their cache misses overlap (about twice as fast as `_ascend_walks` at N >= 1e5);
    * from the first level of at most K nodes: that level and all above it whole, a contiguous pass.
    """
    k = slots.shape[0]
    if k == 0 or n_leaves == 1:  # nothing written, or the single leaf is the root
        return
    width = n_leaves >> 1  # the current level's nodes are [width, 2 * width)
    if width > k:
        up = np.empty(k, np.int64)
        for j in range(k):
            up[j] = (slots[j] + n_leaves) >> 1
        while width > k:
            for j in range(k):
                i = up[j]
                _recompute(nodes, i, c_raw, c_minp, c_keys)
                up[j] = i >> 1
            width >>= 1
    while width >= 1:  # whole levels from here to the root
        for i in range(width, 2 * width):
            _recompute(nodes, i, c_raw, c_minp, c_keys)
        width >>= 1


@njit(cache=True, nogil=True)
def _ascend_walks(nodes, c_raw, c_minp, c_keys, n_leaves, slots):
    """Recompute every ancestor of `slots` (the `WALKS` kernels), in three regimes measured to be fastest in turn:

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
def set_leaves(nodes, layout, slots, priorities, new_keys, new_raw):
    """Write leaves (in order, so a duplicated slot keeps its last value), then recompute ancestors."""
    n_leaves, c_raw, c_minp, c_keys = layout[N_LEAVES], layout[C_RAW], layout[C_MINP], layout[C_KEYS]
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
    if layout[KERNELS] == WALKS:
        _ascend_walks(nodes, c_raw, c_minp, c_keys, n_leaves, slots)
    else:
        ascend_levels(nodes, c_raw, c_minp, c_keys, n_leaves, slots)


@njit(cache=True, nogil=True)
def set_leaves_checked(nodes, layout, capacity, slots, priorities, new_keys, new_raw):
    """`set_leaves` after checking every slot lies in [0, capacity); returns the first bad index (nothing
    written) or -1."""
    for j in range(slots.shape[0]):
        if slots[j] < 0 or slots[j] >= capacity:
            return j
    set_leaves(nodes, layout, slots, priorities, new_keys, new_raw)
    return -1


@njit(cache=True, nogil=True)
def descend(nodes, n_leaves, targets):
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
def sample_leaves(nodes, n_leaves, uniforms, total, stratified):
    """`to_targets` on a copy of `uniforms`, then `descend`: one call instead of two (`SumTree.sample`)."""
    targets = np.empty(uniforms.shape[0], np.float64)
    for j in range(uniforms.shape[0]):
        targets[j] = uniforms[j]
    return descend(nodes, n_leaves, to_targets(targets, total, stratified))


@njit(cache=True, nogil=True)
def argmin_key(nodes, layout):
    """Slot of the smallest eviction key (lowest slot among ties)."""
    return argmin_in_column(nodes, layout[N_LEAVES], layout[C_KEYS])


@njit(cache=True, nogil=True)
def argmin_in_column(nodes, n_leaves, column):
    """Slot of the smallest leaf of the min tree in ``nodes[:, column]`` (lowest slot among ties): one walk down,
    to the smaller child each level. Also the prompt sampler's next retest (`kernels.prompts`)."""
    i = 1
    while i < n_leaves:
        left = 2 * i
        i = left if nodes[left, column] <= nodes[left + 1, column] else left + 1
    return i - n_leaves


@njit(cache=True, nogil=True)
def select_lowest(nodes, layout, k):
    """The k non-empty slots of lowest key in (key, slot) order; reads only. Raises if fewer than k exist."""
    return select_min_keys(nodes[:, layout[C_KEYS]], layout[N_LEAVES], k)


@njit(cache=True, nogil=True)
def replace_lowest(nodes, layout, k, priorities, new_keys, new_raw):
    """Overwrite the k lowest-key leaves with new values in one pass; returns their slots in (key, slot)
    order. Raises (nothing written) when fewer than k leaves are non-empty."""
    slots = select_lowest(nodes, layout, k)
    set_leaves(nodes, layout, slots, priorities, new_keys, new_raw)
    return slots
