"""Compiled steps of the decay calendar of `PromptSampler` (`replayloader.prompts.staleness`): which records
halve between two feedback calls, found by position in a list of (prompt, measured step) entries kept in step
order, with no read of the records.

An entry stays *live* while its prompt is neither measured again nor retired: `add` marks a prompt's previous
entry dead (prompt -1) when it enters the prompt again, and enters no retired prompt. So a live entry is the
prompt's current record, measured at the entry's step, and the records due are the live entries in the due
ranges of steps, read in order. Each entry also keeps the prompt's bucket and its slot in that bucket's tree,
so a halving's leaf is found without reading ``bucket_of`` / ``position`` at random.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .prompts import MAX_HALVINGS

DEAD = -1  # the prompt of an entry that went stale


@njit(cache=True, nogil=True)
def _first_after(steps, size, value):
    """The first position of ``steps[:size]`` (sorted) holding a step > ``value``."""
    lo, hi = 0, size
    while lo < hi:
        mid = (lo + hi) >> 1
        if steps[mid] <= value:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, nogil=True)
def due_between(entries, steps, size, since, now, stale_after):
    """The positions of the live entries whose record halves after step ``since`` and at or before ``now``: a
    record measured at m halves at m + j·stale_after for j = 1 .. MAX_HALVINGS (the last halving forgets it).
    Each position once."""
    found = np.empty(64, np.int64)
    count = 0
    if now <= since:
        return found[:0]
    if now - since < stale_after:  # each halving's steps are one range, the ranges disjoint
        for j in range(1, MAX_HALVINGS + 1):
            lo = _first_after(steps, size, since - j * stale_after)
            hi = _first_after(steps, size, now - j * stale_after)
            for q in range(lo, hi):
                if entries[q] != DEAD:
                    if count == found.shape[0]:
                        found = np.concatenate((found, np.empty(count, np.int64)))
                    found[count] = q
                    count += 1
        return found[:count]
    lo = _first_after(steps, size, since - MAX_HALVINGS * stale_after)
    hi = _first_after(steps, size, now - stale_after)
    for q in range(lo, hi):  # a jump of the clock: each entry's first halving after `since`, if it is by `now`
        m = steps[q]
        halving = m + ((since - m) // stale_after + 1) * stale_after
        if entries[q] != DEAD and halving <= now and halving <= m + MAX_HALVINGS * stale_after:
            if count == found.shape[0]:
                found = np.concatenate((found, np.empty(count, np.int64)))
            found[count] = q
            count += 1
    return found[:count]


@njit(cache=True, nogil=True)
def add(entries, steps, buckets, slots, size, entry_of, fed, now, retired, bucket_of, position):
    """Enter the prompts ``fed`` (distinct), measured at ``now``, after ``size`` entries (room is the caller's):
    each one's previous entry goes dead; a retired prompt gets none. Returns the new size."""
    for j in range(fed.shape[0]):
        i = fed[j]
        if entry_of[i] >= 0:
            entries[entry_of[i]] = DEAD
            entry_of[i] = -1
        if not retired[i]:
            entries[size] = i
            steps[size] = now
            buckets[size] = bucket_of[i]
            slots[size] = position[i]
            entry_of[i] = size
            size += 1
    return size


@njit(cache=True, nogil=True)
def compact(entries, steps, buckets, slots, size, entry_of, since, stale_after):
    """Drop the entries that can no longer come due (dead, or all their halvings at or before ``since``, the
    last step whose halvings were read), keeping the order and each prompt's ``entry_of``; returns the new
    size."""
    kept = 0
    for q in range(size):
        i = entries[q]
        if i == DEAD:
            continue
        if steps[q] + MAX_HALVINGS * stale_after <= since:
            entry_of[i] = -1
            continue
        entries[kept], steps[kept], buckets[kept], slots[kept] = i, steps[q], buckets[q], slots[q]
        entry_of[i] = kept
        kept += 1
    return kept
