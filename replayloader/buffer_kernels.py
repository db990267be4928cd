"""Numba kernels behind `ReplayBuffer.add / sample / update`: one compiled call does each call's bookkeeping.

Why fused: a step of a prioritized buffer is a few dozen tiny operations (pick slots, stamp them, power the
weights, write four trees, draw uniforms, descend, compute probabilities and importance weights, decode ids,
drop stale feedback, apply the update rule). As separate numpy calls each costs about a microsecond of
interpreter overhead, which at the paper's scale (N=1000, K=128) is most of the step. Here each public call
validates its arguments in Python, then makes one kernel call (two for `add`: choose slots, write storage,
commit, so a failing storage write leaves the buffer untouched).

Per-slot bookkeeping lives in one int64 row per slot, ``meta[slot] = [serial, added_at, visits, mark]``.
Kernels return a status code instead of raising; the buffer turns it into an error that names the argument.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .rng import fill_uniforms
from .sumtree import _descend, _set_leaves, select_lowest, to_targets

SERIAL, ADDED_AT, VISITS, MARK = 0, 1, 2, 3

# Eviction modes the kernels implement themselves; anything else chooses its victims in Python.
EVICT_GIVEN, EVICT_LOWEST, EVICT_FIFO = 0, 1, 2
# Update rules the kernels implement: weight = max(value, floor), or the loss difference from the 2nd visit on.
UPDATE_VALUE, UPDATE_LOSS_DIFF_ABS, UPDATE_LOSS_DIFF_DECREASE = 0, 1, 2
# Statuses returned by `apply_feedback`.
OK, BAD_ID, BAD_VALUE = 0, 1, 2


@njit(cache=True, nogil=True)
def first_invalid(values):
    """Index of the first NaN, inf or negative value, or -1."""
    for j in range(values.shape[0]):
        v = values[j]
        if not (v >= 0.0 and v < np.inf):
            return j
    return -1


@njit(cache=True, nogil=True)
def _tree_priorities(weights, alpha, nodes):
    """w^alpha for the sum tree, in its dtype (alpha 0: 1 for every positive weight)."""
    out = np.empty(weights.shape[0], nodes.dtype)
    for j in range(weights.shape[0]):
        w = weights[j]
        if alpha == 1.0:
            out[j] = w
        elif w <= 0.0:
            out[j] = 0.0
        elif alpha == 0.0:
            out[j] = 1.0
        else:
            out[j] = w ** alpha
    return out


@njit(cache=True, nogil=True)
def write_weights(nodes, c_raw, c_minp, c_keys, n_leaves, weights, slots, new_weights, alpha):
    """Record raw weights and write the tree: priorities w^alpha, eviction keys and raw sums w."""
    for j in range(slots.shape[0]):
        weights[slots[j]] = new_weights[j]
    priorities = _tree_priorities(new_weights, alpha, nodes)
    tree_weights = new_weights.astype(nodes.dtype)
    _set_leaves(nodes, c_raw, c_minp, c_keys, n_leaves, slots, priorities, tree_weights, tree_weights)


@njit(cache=True, nogil=True)
def choose_slots(nodes, c_keys, n_leaves, size, capacity, n, evict_mode, fifo_next, victims):
    """Slots for n new examples: free slots in order, then victims (lowest keys, a FIFO ring, or given).

    Reads only; returns (slots, n_evicted, start of the run if the slots are consecutive else -1).
    """
    slots = np.empty(n, np.int64)
    n_free = min(n, capacity - size)
    for j in range(n_free):
        slots[j] = size + j
    m = n - n_free
    if m > 0:
        if evict_mode == EVICT_LOWEST:
            slots[n_free:] = select_lowest(nodes, c_keys, n_leaves, m)
        elif evict_mode == EVICT_FIFO:
            for j in range(m):
                slots[n_free + j] = (fifo_next + j) % capacity
        else:
            slots[n_free:] = victims
    run_start = slots[0]
    for j in range(1, n):
        if slots[j] != slots[j - 1] + 1:
            run_start = -1
            break
    return slots, m, run_start


@njit(cache=True, nogil=True)
def commit_add(nodes, c_raw, c_minp, c_keys, n_leaves, meta, weights, last_loss, slots, new_weights, new_weight, alpha,
               first_serial, add_call):
    """Stamp the chosen slots (serial, add call, zero visits), forget their old losses, write their weights
    (`new_weights`, or `new_weight` for all when that array is empty).

    Returns the new ids (serial * capacity + slot).
    """
    capacity = meta.shape[0]
    n = slots.shape[0]
    ids = np.empty(n, np.int64)
    track_loss = last_loss.shape[0] > 0
    for j in range(n):
        s = slots[j]
        meta[s, SERIAL] = first_serial + j
        meta[s, ADDED_AT] = add_call
        meta[s, VISITS] = 0
        if track_loss:
            last_loss[s] = np.nan
        ids[j] = (first_serial + j) * capacity + s
    if new_weights.shape[0] != n:
        new_weights = np.full(n, new_weight)
    write_weights(nodes, c_raw, c_minp, c_keys, n_leaves, weights, slots, new_weights, alpha)
    return ids


@njit(cache=True, nogil=True)
def draw_sample(nodes, c_minp, n_leaves, meta, rng_state, k, stratified, size, beta, last_add_call):
    """Draw k slots by priority (uniform over the stored examples when every weight is 0).

    Returns (slots, ids, probabilities, importance weights (P_min/P_i)^beta or empty when beta < 0, ages,
    sum of ages).
    """
    capacity = meta.shape[0]
    u = np.empty(k, np.float64)
    fill_uniforms(rng_state, u)
    total = np.float64(nodes[1, 0])
    probabilities = np.empty(k, np.float64)
    if total > 0.0:
        slots = _descend(nodes, n_leaves, to_targets(u, total, stratified))
        for j in range(k):
            probabilities[j] = np.float64(nodes[n_leaves + slots[j], 0]) / total
        p_min = np.float64(nodes[1, c_minp]) / total if c_minp >= 0 else 0.0
    else:
        slots = np.empty(k, np.int64)
        for j in range(k):
            slots[j] = min(np.int64(u[j] * size), size - 1)
            probabilities[j] = 1.0 / size
        p_min = 1.0 / size
    is_weights = np.empty(k if beta >= 0.0 else 0, np.float64)
    for j in range(is_weights.shape[0]):
        is_weights[j] = (p_min / probabilities[j]) ** beta
    ids = np.empty(k, np.int64)
    ages = np.empty(k, np.int64)
    age_sum = 0
    for j in range(k):
        s = slots[j]
        ids[j] = meta[s, SERIAL] * capacity + s
        ages[j] = last_add_call - meta[s, ADDED_AT]
        age_sum += ages[j]
    return slots, ids, probabilities, is_weights, ages, age_sum


@njit(cache=True, nogil=True)
def resolve_ids(ids, meta, next_serial, epoch, count_visits):
    """Decode ids to slots, drop stale ones, keep the last occurrence of duplicates, count visits.

    Returns (slots, positions in `ids`, stale count, first visits, index of the first never-issued id or -1).
    An id is never-issued when its serial is not yet given out, or when its slot holds an older example than
    that serial (a slot's serial only grows). Nothing is written unless every id passes.
    """
    capacity = meta.shape[0]
    k = ids.shape[0]
    serials = np.empty(k, np.int64)
    slots = np.empty(k, np.int64)
    # Integer division costs tens of cycles; a float reciprocal gives the quotient to within one, then fix it.
    limit = next_serial * capacity  # every issued id lies below this
    inverse = 1.0 / capacity
    for j in range(k):
        i = ids[j]
        if i < 0 or i >= limit:
            return np.empty(0, np.int64), np.empty(0, np.int64), 0, 0, j
        serial = np.int64(np.float64(i) * inverse)
        rest = i - serial * capacity
        while rest < 0:
            serial -= 1
            rest += capacity
        while rest >= capacity:
            serial += 1
            rest -= capacity
        if meta[rest, SERIAL] < serial:  # the slot never held this serial: its occupant is older (or none)
            return np.empty(0, np.int64), np.empty(0, np.int64), 0, 0, j
        serials[j] = serial
        slots[j] = rest
    kept = np.empty(k, np.int64)
    pos = np.empty(k, np.int64)
    n = 0
    stale = 0
    first = 0
    for j in range(k - 1, -1, -1):  # backwards, so the first occurrence met is the last write
        slot = slots[j]
        if meta[slot, SERIAL] != serials[j]:
            stale += 1
        elif meta[slot, MARK] != epoch:
            meta[slot, MARK] = epoch
            if count_visits:
                meta[slot, VISITS] += 1
                if meta[slot, VISITS] == 1:
                    first += 1
            kept[n] = slot
            pos[n] = j
            n += 1
    out_slots = np.empty(n, np.int64)
    out_pos = np.empty(n, np.int64)
    for j in range(n):
        out_slots[j] = kept[n - 1 - j]
        out_pos[j] = pos[n - 1 - j]
    return out_slots, out_pos, stale, first, -1


@njit(cache=True, nogil=True)
def apply_feedback(nodes, c_raw, c_minp, c_keys, n_leaves, meta, weights, last_loss, ids, values, next_serial, epoch,
                   rule, floor, alpha):
    """Validate ids and values, resolve ids, apply a built-in update rule and write the new weights.

    Returns (status, index of the bad entry, stale count, first visits, updated slots, their new weights).
    On a bad id or value nothing is written.
    """
    empty_i, empty_f = np.empty(0, np.int64), np.empty(0, np.float64)
    bad = first_invalid(values)
    if bad >= 0:
        return BAD_VALUE, bad, 0, 0, empty_i, empty_f
    slots, pos, stale, first, bad = resolve_ids(ids, meta, next_serial, epoch, True)
    if bad >= 0:
        return BAD_ID, bad, 0, 0, empty_i, empty_f
    n = slots.shape[0]
    target = np.empty(n, np.int64)
    new_weights = np.empty(n, np.float64)
    m = 0
    for j in range(n):
        s, v = slots[j], values[pos[j]]
        if rule == UPDATE_VALUE:
            w = v
        else:
            previous = last_loss[s]
            last_loss[s] = v
            if np.isnan(previous):  # first visit: only remember the loss
                continue
            w = abs(previous - v) if rule == UPDATE_LOSS_DIFF_ABS else previous - v
        target[m] = s
        new_weights[m] = w if w > floor else floor
        m += 1
    target, new_weights = target[:m], new_weights[:m]
    if m:
        write_weights(nodes, c_raw, c_minp, c_keys, n_leaves, weights, target, new_weights, alpha)
    return OK, -1, stale, first, target, new_weights
