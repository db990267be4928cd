"""Compiled steps of `PrioritizedSampler`: the index checks of `feedback` and the write of its result, and the
draws of the prioritized phase, each one pass instead of a dozen numpy calls, so a feedback call costs a few
microseconds more than the strategy's own work, and a `MixtureSampler` that keeps one sampler per source pays
little per source."""
from __future__ import annotations

import numpy as np
from numba import njit

from .buffer import tree_priorities
from .rng import fill_uniforms
from .tree import descend, set_leaves

OUT_OF_RANGE = 1
NEVER_HANDED_OUT = 2


@njit(cache=True, nogil=True)
def resolve_feedback(indices, last_drawn_epoch, epoch, seen, positions):
    """Check every index, then keep, for each distinct index whose feedback is fresh, the position of its last
    occurrence (a duplicate's last value counts once). ``epoch`` < 0 means "no epoch given": all fresh.
    ``seen`` is zeroed scratch of length N, left zeroed. Writes the positions kept, in ascending order, to the
    start of ``positions`` (as long as ``indices``) and returns (first bad position or -1, why, how many were
    kept, number of stale occurrences). (Outputs are written, not returned: a returned array costs a few
    hundred nanoseconds to box, per call.)"""
    n = last_drawn_epoch.shape[0]
    k = indices.shape[0]
    for j in range(k):
        i = indices[j]
        if i < 0 or i >= n:
            return j, OUT_OF_RANGE, 0, 0
        if last_drawn_epoch[i] < 0:
            return j, NEVER_HANDED_OUT, 0, 0
    count = 0
    stale = 0
    for j in range(k - 1, -1, -1):  # backwards: the first time an index is met holds its last value
        i = indices[j]
        if epoch >= 0 and last_drawn_epoch[i] > epoch:
            stale += 1
        elif not seen[i]:
            seen[i] = True
            positions[count] = j
            count += 1
    positions[:count] = positions[:count][::-1].copy()
    for c in range(count):
        seen[indices[positions[c]]] = False
    return -1, 0, count, stale


@njit(cache=True, nogil=True)
def prioritized_draws(u, pairs, nodes, n_leaves, uniform_fraction, n, stratified, out):
    """One index per pair of uniforms (choice, where), read from ``u`` as [choice_0, where_0, choice_1, ...]
    when ``pairs`` (draws of one index each), else as [all choices, all wheres] (one batch): uniformly over the
    n indices, ``min(int(where * n), n - 1)``, when choice < uniform_fraction, else the leaf holding mass
    ``where`` of the tree (stratified: the j-th tree draw in the j-th of equal segments, as `SumTree.sample`).
    Returns the number of uniform draws, or -1 (nothing written) when a draw needs the tree and its total is
    not > 0."""
    m = out.shape[0]
    total = nodes[1, 0]
    targets = np.empty(m, np.float64)
    at = np.empty(m, np.int64)
    t = 0
    for j in range(m):
        choice, where = (u[2 * j], u[2 * j + 1]) if pairs else (u[j], u[m + j])
        if choice < uniform_fraction:
            out[j] = min(np.int64(where * n), n - 1)
        else:
            targets[t] = where
            at[t] = j
            t += 1
    if t > 0 and not total > 0:
        return -1
    if t > 0:
        seg = total / t
        for q in range(t):
            targets[q] = (q + targets[q]) * seg if stratified else targets[q] * total
        leaves = descend(nodes, n_leaves, targets[:t])
        for q in range(t):
            out[at[q]] = leaves[q]
    return m - t


@njit(cache=True, nogil=True)
def write_floored(nodes, layout, weights, alpha, floor, slots, new_weights):
    """Weights ``max(new_weights, floor)`` (NaN stays NaN, as ``np.maximum``) for ``slots``, recorded in
    ``weights`` and written to the tree as priorities w^alpha: the one write of `PrioritizedSampler`."""
    floored = np.empty(new_weights.shape[0], np.float64)
    for j in range(new_weights.shape[0]):
        w = new_weights[j]
        floored[j] = floor if w < floor else w
        weights[slots[j]] = floored[j]
    priorities = tree_priorities(floored, alpha, nodes)
    set_leaves(nodes, layout, slots, priorities, priorities, priorities)


@njit(cache=True, nogil=True)
def apply_feedback(nodes, layout, weights, visits, measured, alpha, floor, distinct, changed, new_weights, target):
    """The result of an update rule for the ``distinct`` fed-back indices: each one's visit counted; those
    flagged in ``changed`` measured and given ``new_weights`` (one each, in order; `write_floored`), and
    written to the start of ``target`` (as long as ``distinct``). Returns how many, or -1 with nothing written
    when ``new_weights`` does not hold one weight per flagged index (the caller's general path then says what
    is wrong)."""
    t = 0
    for j in range(distinct.shape[0]):
        t += changed[j]
    if t != new_weights.shape[0]:
        return -1
    t = 0
    for j in range(distinct.shape[0]):
        visits[distinct[j]] += 1
        if changed[j]:
            target[t] = distinct[j]
            measured[distinct[j]] = True
            t += 1
    write_floored(nodes, layout, weights, alpha, floor, target[:t], new_weights)
    return t


@njit(cache=True, nogil=True)
def group_single_draws(counts, rngs, trees, n_leaves, uniform_fractions, sizes, last_drawn, epochs, out, n_uniform):
    """For every sampler k of a group (tuples of their arrays, ascending k), ``counts[k]`` draws of one index
    each in its prioritized phase, written to ``out`` grouped by sampler: pairs of uniforms from ``rngs[k]``
    through `prioritized_draws`, each index marked drawn in ``epochs[k]``; ``n_uniform[k]``: its uniform draws.
    Returns -1 - k when sampler k's tree is empty (the samplers before it have drawn), else 0."""
    start = 0
    for k in range(counts.shape[0]):
        c = counts[k]
        if c == 0:
            continue
        u = np.empty(2 * c, np.float64)
        fill_uniforms(rngs[k], u)
        part = out[start:start + c]
        drawn = prioritized_draws(u, True, trees[k], n_leaves[k], uniform_fractions[k], sizes[k], False, part)
        if drawn < 0:
            return -1 - k
        n_uniform[k] = drawn
        marks = last_drawn[k]
        for j in range(c):
            marks[part[j]] = epochs[k]
        start += c
    return 0
