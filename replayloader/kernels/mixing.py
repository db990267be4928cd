"""Compiled per-batch bookkeeping of `MixtureSampler`: the slots' sources, the examples each source hands out,
and the per-source sums of a feedback call, each in one pass instead of a dozen numpy calls and a loop over
sources. The draws are bit-identical to the numpy forms they replace (same uniforms in the same order, the same
float operations), so a stream started before them continues unchanged after them (tests/mixing)."""
from __future__ import annotations

import numpy as np
from numba import njit

from .rng import fill_permutation, fill_uniforms

OUT_OF_RANGE = 1
NEVER_DRAWN = 2
BAD_LOSS = 3


@njit(cache=True, nogil=True)
def reshuffle(state, order, start, stop):
    """``order[start:stop]`` becomes a fresh permutation of 0 .. stop - start - 1 (`rng.fill_permutation`)."""
    fill_permutation(state, order[start:stop])


@njit(cache=True, nogil=True)
def draw_sources(state, weights, out, drawn_counts):
    """Each slot's source, by the inverse CDF of one uniform: ``cdf = cumsum(weights) / cdf[-1]`` and the
    number of cdf entries <= u (numpy's ``searchsorted(side="right")``), clipped to K - 1. Adds each source's
    slots to ``drawn_counts``."""
    k = weights.shape[0]
    cdf = np.empty(k, np.float64)
    acc = 0.0
    for j in range(k):
        acc += weights[j]
        cdf[j] = acc
    total = cdf[k - 1]
    for j in range(k):
        cdf[j] /= total
    u = np.empty(out.shape[0], np.float64)
    fill_uniforms(state, u)
    for j in range(out.shape[0]):
        lo, hi = 0, k
        while lo < hi:
            mid = (lo + hi) // 2
            if cdf[mid] <= u[j]:
                lo = mid + 1
            else:
                hi = mid
        source = min(lo, k - 1)
        out[j] = source
        drawn_counts[source] += 1


@njit(cache=True, nogil=True)
def take_uniform(state, sources, order, offsets, cursor, passes, members, drawn, out):
    """Fill ``out[j]`` with the global index slot j takes: source by source in ascending order, the next
    examples of the source's permutation (reshuffled, from ``state``, when a pass ends and more are needed),
    handed to the source's slots in slot order. Marks them in ``drawn``."""
    k = offsets.shape[0] - 1
    b = sources.shape[0]
    counts = np.zeros(k, np.int64)
    for j in range(b):
        counts[sources[j]] += 1
    start = np.empty(k, np.int64)
    acc = 0
    for s in range(k):
        start[s] = acc
        acc += counts[s]
    taken = np.empty(b, np.int64)
    for s in range(k):
        size = offsets[s + 1] - offsets[s]
        got = 0
        while got < counts[s]:
            if cursor[s] == size:
                reshuffle(state, order, offsets[s], offsets[s + 1])
                cursor[s] = 0
                passes[s] += 1
            n = min(counts[s] - got, size - cursor[s])
            for t in range(n):
                taken[start[s] + got + t] = order[offsets[s] + cursor[s] + t]
            cursor[s] += n
            got += n
    for j in range(b):
        s = sources[j]
        i = members[offsets[s] + taken[start[s]]]
        start[s] += 1
        out[j] = i
        drawn[i] = True


@njit(cache=True, nogil=True)
def feedback_sums(indices, losses, drawn, source_of, counts, sums, means):
    """One pass over a feedback call: the first bad position and why (an index out of range, one never drawn,
    a loss that is not finite or negative; in that order of precedence), else (-1, 0) with each source's
    count, loss sum (summed in input order, as ``np.bincount(weights=...)``) and mean loss (0.0 where the count
    is 0) in ``counts`` / ``sums`` / ``means`` (zeroed by the caller)."""
    n = drawn.shape[0]
    m = indices.shape[0]
    for j in range(m):
        if indices[j] < 0 or indices[j] >= n:
            return j, OUT_OF_RANGE
    for j in range(m):
        if not drawn[indices[j]]:
            return j, NEVER_DRAWN
    for j in range(m):
        if not (np.isfinite(losses[j]) and losses[j] >= 0.0):
            return j, BAD_LOSS
    for j in range(m):
        s = source_of[indices[j]]
        counts[s] += 1
        sums[s] += losses[j]
    for s in range(counts.shape[0]):
        if counts[s] > 0:
            means[s] = sums[s] / counts[s]
    return -1, 0


@njit(cache=True, nogil=True)
def order_by_source(sources, counts, order):
    """``order``: the positions of ``sources`` grouped by source, ascending, each group in position order (a
    stable counting sort, as ``np.argsort(sources, kind="stable")``); ``counts``: each source's positions."""
    for j in range(sources.shape[0]):
        counts[sources[j]] += 1
    start = np.empty(counts.shape[0], np.int64)
    acc = 0
    for s in range(counts.shape[0]):
        start[s] = acc
        acc += counts[s]
    for j in range(sources.shape[0]):
        s = sources[j]
        order[start[s]] = j
        start[s] += 1


@njit(cache=True, nogil=True)
def place_draws(sources, order, local, offsets, members, drawn, out):
    """Slot ``order[q]`` takes the example at position ``local[q]`` of its source (``order`` from
    `order_by_source`, ``local`` the sources' draws in that order); marks it in ``drawn``."""
    for q in range(order.shape[0]):
        j = order[q]
        i = members[offsets[sources[j]] + local[q]]
        out[j] = i
        drawn[i] = True
