"""Compiled steps of the decay calendar of `PromptSampler` (`replayloader.prompts.staleness`): which records
halve between two feedback calls, found by position in a list of (prompt, measured step) entries kept in step
order, with no read of the records.

An entry stays *live* while its prompt is neither measured again nor retired: `add` marks a prompt's previous
entry dead (prompt -1) when it enters the prompt again, and enters no retired prompt. So a live entry is the
prompt's current record, measured at the entry's step, and the records due are the live entries in the due
ranges of steps, read in order. Each entry also keeps what a halving's leaves are computed from and where they
are: the prompt's group count and signal sum (unchanged while the entry is live), its bucket and its slot in that
bucket's tree, so a halving reads its record from the calendar, in order, instead of from N-long arrays at
random.

``index`` lists the distinct steps of the entries with the position of each one's first entry (a few thousand
at most: one per feedback call in the last 30 ``stale_after`` steps), so finding a step is a binary search in
a small array that stays in cache, not in the long entry arrays.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .prompts import MAX_HALVINGS

DEAD = -1  # the prompt of an entry that went stale


COLUMNS = ("entries", "steps", "buckets", "slots", "groups", "signals")  # an entry's fields, one array each


@njit(cache=True, nogil=True)
def _first_after(size, index, distinct, value):
    """The first position of the entries (``size`` of them) holding a step > ``value``: a binary search over the
    ``distinct`` steps of ``index``."""
    lo, hi = 0, distinct
    while lo < hi:
        mid = (lo + hi) >> 1
        if index[mid, 0] <= value:
            lo = mid + 1
        else:
            hi = mid
    return index[lo, 1] if lo < distinct else size


@njit(cache=True, nogil=True)
def _due_ranges(size, index, distinct, since, now, stale_after):
    """The ranges of entry positions that may hold records halving in (since, now], as rows (start, stop), and
    whether each entry must also be checked for its next halving (a jump of the clock by ``stale_after`` or
    more: one range for all halvings)."""
    if now - since < stale_after:  # each halving's steps are one range, the ranges disjoint and in order
        ranges = np.empty((MAX_HALVINGS, 2), np.int64)
        for j in range(MAX_HALVINGS, 0, -1):
            ranges[MAX_HALVINGS - j, 0] = _first_after(size, index, distinct, since - j * stale_after)
            ranges[MAX_HALVINGS - j, 1] = _first_after(size, index, distinct, now - j * stale_after)
        return ranges, False
    ranges = np.empty((1, 2), np.int64)
    ranges[0, 0] = _first_after(size, index, distinct, since - MAX_HALVINGS * stale_after)
    ranges[0, 1] = _first_after(size, index, distinct, now - stale_after)
    return ranges, True


@njit(cache=True, nogil=True)
def due_between(entries, steps, size, index, distinct, since, now, stale_after):
    """The positions of the live entries whose record halves after step ``since`` and at or before ``now``: a
    record measured at m halves at m + j·stale_after for j = 1 .. MAX_HALVINGS (the last halving forgets it).
    Each position once, in order."""
    if now <= since:
        return np.empty(0, np.int64)
    ranges, jump = _due_ranges(size, index, distinct, since, now, stale_after)
    room = 0
    for r in range(ranges.shape[0]):
        room += ranges[r, 1] - ranges[r, 0]
    found = np.empty(room, np.int64)
    count = 0
    for r in range(ranges.shape[0]):
        for q in range(ranges[r, 0], ranges[r, 1]):
            if entries[q] == DEAD:
                continue
            if jump:  # the entry's first halving after `since`: is it by `now`, and not past the last?
                m = steps[q]
                halving = m + ((since - m) // stale_after + 1) * stale_after
                if halving > now or halving > m + MAX_HALVINGS * stale_after:
                    continue
            found[count] = q
            count += 1
    return found[:count]


@njit(cache=True, nogil=True)
def add(entries, steps, buckets, slots, groups_at, signals_at, size, index, distinct, entry_of, fed, now, retired,
        bucket_of, position, groups, signal_sum):
    """Enter the prompts ``fed`` (distinct), measured at ``now`` (no earlier than any entry), after ``size``
    entries (room is the caller's): each one's previous entry goes dead; a retired prompt gets none. Returns the
    new size and the new count of distinct steps."""
    for j in range(fed.shape[0]):
        i = fed[j]
        if entry_of[i] >= 0:
            entries[entry_of[i]] = DEAD
            entry_of[i] = -1
        if not retired[i]:
            if distinct == 0 or index[distinct - 1, 0] != now:
                index[distinct, 0] = now
                index[distinct, 1] = size
                distinct += 1
            entries[size], steps[size], buckets[size], slots[size] = i, now, bucket_of[i], position[i]
            groups_at[size], signals_at[size] = groups[i], signal_sum[i]
            entry_of[i] = size
            size += 1
    return size, distinct


@njit(cache=True, nogil=True)
def compact(entries, steps, buckets, slots, groups_at, signals_at, size, index, entry_of, since, stale_after):
    """Drop the entries that can no longer come due (dead, or all their halvings at or before ``since``, the
    last step whose halvings were read), keeping the order, each prompt's ``entry_of`` and the index of steps;
    returns the new size and count of distinct steps."""
    kept = 0
    distinct = 0
    for q in range(size):
        i = entries[q]
        if i == DEAD:
            continue
        if steps[q] + MAX_HALVINGS * stale_after <= since:
            entry_of[i] = -1
            continue
        if distinct == 0 or index[distinct - 1, 0] != steps[q]:
            index[distinct, 0] = steps[q]
            index[distinct, 1] = kept
            distinct += 1
        entries[kept], steps[kept], buckets[kept], slots[kept] = i, steps[q], buckets[q], slots[q]
        groups_at[kept], signals_at[kept] = groups_at[q], signals_at[q]
        entry_of[i] = kept
        kept += 1
    return kept, distinct


@njit(cache=True, nogil=True)
def index_steps(steps, size, index):
    """Fill ``index`` with the distinct steps of ``steps[:size]`` (sorted) and each one's first position; returns
    how many."""
    distinct = 0
    for q in range(size):
        if distinct == 0 or index[distinct - 1, 0] != steps[q]:
            index[distinct, 0] = steps[q]
            index[distinct, 1] = q
            distinct += 1
    return distinct
