"""Compiled index checks of `PrioritizedSampler.feedback`: one pass over the batch instead of a dozen numpy calls,
so a feedback call costs a few microseconds more than the strategy's own work."""
from __future__ import annotations

import numpy as np
from numba import njit

OUT_OF_RANGE = 1
NEVER_HANDED_OUT = 2


@njit(cache=True, nogil=True)
def resolve_feedback(indices, last_drawn_epoch, epoch, seen):
    """Check every index, then keep, for each distinct index whose feedback is fresh, the position of its last
    occurrence (a duplicate's last value counts once). ``epoch`` < 0 means "no epoch given": all fresh.
    ``seen`` is zeroed scratch of length N, left zeroed. Returns (first bad position or -1, why, positions in
    ascending order, number of stale occurrences)."""
    n = last_drawn_epoch.shape[0]
    k = indices.shape[0]
    for j in range(k):
        i = indices[j]
        if i < 0 or i >= n:
            return j, OUT_OF_RANGE, np.empty(0, np.int64), 0
        if last_drawn_epoch[i] < 0:
            return j, NEVER_HANDED_OUT, np.empty(0, np.int64), 0
    kept = np.empty(k, np.int64)
    count = 0
    stale = 0
    for j in range(k - 1, -1, -1):  # backwards: the first time an index is met holds its last value
        i = indices[j]
        if epoch >= 0 and last_drawn_epoch[i] > epoch:
            stale += 1
        elif not seen[i]:
            seen[i] = True
            kept[count] = j
            count += 1
    positions = kept[:count][::-1].copy()
    for c in range(count):
        seen[indices[positions[c]]] = False
    return -1, 0, positions, stale

