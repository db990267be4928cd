"""Numba kernels behind `ReplayBuffer.add / sample / update`: each does one call's generic bookkeeping.

Why compiled: a step of a prioritized buffer is a few dozen tiny operations (pick slots, stamp them, power the
weights, write the tree, draw uniforms, descend, compute probabilities and importance weights, decode ids, drop
stale feedback). As separate numpy calls each costs about a microsecond of interpreter overhead, which at the
paper's scale (N=1000, K=128) is most of the step. These kernels hold no strategy rule: a strategy part's rule
is its own kernel (in `replayloader.strategies`), which the buffer calls between them, or which a part's fused
update step calls between `resolve_ids` and `write_rule_result` (see `WeightUpdate.fused_step`).

Per-slot bookkeeping lives in one int64 row per slot, ``meta[slot] = [serial, added_at, visits, mark]``.
Kernels return a status code instead of raising; the buffer turns it into an error that names the argument.
The tree is passed as ``nodes, layout`` (see `kernels.tree`).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .rng import fill_uniforms
from .tree import N_LEAVES, C_MINP, descend, set_leaves, to_targets

SERIAL, ADDED_AT, VISITS, MARK = 0, 1, 2, 3
OK, BAD_VALUE, BAD_ID = 0, 1, 2  # statuses of `resolve_ids`


@njit(cache=True, nogil=True)
def first_invalid(values, limit):
    """Index of the first value that is NaN, negative or above ``limit`` (a finite bound, so inf fails too), or -1.
    The bound is the tree's `SumTree.max_weight` where the values become weights, else the largest float64."""
    for j in range(values.shape[0]):
        v = values[j]
        if not (v >= 0.0 and v <= limit):
            return j
    return -1


@njit(cache=True, nogil=True)
def tree_priorities(weights, alpha, nodes):
    """w^alpha for the sum tree, in its dtype (alpha 0: 1 for every positive weight). The one place alpha is
    applied, for the buffer (`write_weights`) and `PrioritizedSampler` alike."""
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
def write_weights(nodes, layout, weights, slots, new_weights, alpha):
    """Record raw weights and write the tree: priorities w^alpha, eviction keys and raw sums w."""
    for j in range(slots.shape[0]):
        weights[slots[j]] = new_weights[j]
    if alpha == 1.0 and nodes.itemsize == 8:  # a float64 tree takes the weights as they are: no copies
        set_leaves(nodes, layout, slots, new_weights, new_weights, new_weights)
        return
    priorities = tree_priorities(new_weights, alpha, nodes)
    tree_weights = new_weights.astype(nodes.dtype)
    set_leaves(nodes, layout, slots, priorities, tree_weights, tree_weights)


@njit(cache=True, nogil=True)
def write_rule_result(nodes, layout, weights, alpha, slots, changed, new_weights):
    """Write an update rule's answer: the slots flagged in `changed` get `new_weights`, in order. Returns them."""
    target = slots if new_weights.shape[0] == slots.shape[0] else slots[changed]  # all changed: no copy
    write_weights(nodes, layout, weights, target, new_weights, alpha)
    return target


@njit(cache=True, nogil=True)
def first_bad_victim(meta, size, victims, stamp):
    """Index of the first victim that lies outside the stored examples or repeats another, or -1.

    Repeats are found by stamping each victim's scratch mark with `stamp` (negative, new for every call, so never
    an update's epoch).
    """
    for j in range(victims.shape[0]):
        v = victims[j]
        if v < 0 or v >= size or meta[v, MARK] == stamp:
            return j
        meta[v, MARK] = stamp
    return -1


@njit(cache=True, nogil=True)
def place(capacity, size, n, victims):
    """Slots for n new examples: the free slots in order, then the eviction's victims (checked already, or
    distinct stored slots by construction, as many as the free slots fall short).

    Returns (slots, start of the run if the slots are consecutive else -1).
    """
    slots = np.empty(n, np.int64)
    n_free = min(n, capacity - size)
    for j in range(n_free):
        slots[j] = size + j
    for j in range(victims.shape[0]):
        slots[n_free + j] = victims[j]
    run_start = slots[0]
    for j in range(1, n):
        if slots[j] != slots[j - 1] + 1:
            run_start = -1
            break
    return slots, run_start


@njit(cache=True, nogil=True)
def forget(memory, slots):
    """Clear a strategy part's per-slot memory (e.g. a last loss) of refilled slots: NaN, nothing remembered."""
    for j in range(slots.shape[0]):
        memory[slots[j]] = np.nan


@njit(cache=True, nogil=True)
def commit_add(nodes, layout, meta, weights, slots, new_weights, new_weight, alpha, first_serial, add_call, memory):
    """Stamp the chosen slots (serial, add call, zero visits), `forget` them in `memory` (an update's per-slot
    memory, or empty) and write their weights (`new_weights`, or `new_weight` for all when that array is empty).

    Returns the new ids (serial * capacity + slot).
    """
    capacity = meta.shape[0]
    n = slots.shape[0]
    ids = np.empty(n, np.int64)
    for j in range(n):
        s = slots[j]
        meta[s, SERIAL] = first_serial + j
        meta[s, ADDED_AT] = add_call
        meta[s, VISITS] = 0
        ids[j] = (first_serial + j) * capacity + s
    if memory.shape[0]:
        forget(memory, slots)
    if new_weights.shape[0] != n:
        new_weights = np.full(n, new_weight)
    write_weights(nodes, layout, weights, slots, new_weights, alpha)
    return ids


@njit(cache=True, nogil=True)
def draw_sample(nodes, layout, meta, rng_state, k, stratified, size, beta, last_add_call):
    """Draw k slots by priority (uniform over the stored examples when every weight is 0).

    Returns (slots, ids, probabilities, importance weights (P_min/P_i)^beta or empty when beta < 0, ages,
    sum of ages).
    """
    capacity = meta.shape[0]
    n_leaves, c_minp = layout[N_LEAVES], layout[C_MINP]
    u = np.empty(k, np.float64)
    fill_uniforms(rng_state, u)
    total = np.float64(nodes[1, 0])
    probabilities = np.empty(k, np.float64)
    if total > 0.0:
        slots = descend(nodes, n_leaves, to_targets(u, total, stratified))
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
def resolve_ids(ids, values, limit, meta, next_serial, epoch, count_visits):
    """Check the values (`first_invalid` against ``limit``), decode ids to slots, drop stale ones, keep the last
    occurrence of duplicates, count visits, and pick each kept id's value.

    Returns (status, index of the bad entry or -1, slots, their values, stale count, first visits). Status is
    OK, BAD_VALUE (NaN, negative or above ``limit``) or BAD_ID (never issued: its serial is not yet given out, or
    its slot holds an older example than that serial, as a slot's serial only grows). Nothing is written unless every
    value and id passes. `values` may be empty (feedback that carries no value); the returned values are then
    empty too.
    """
    capacity = meta.shape[0]
    k = ids.shape[0]
    empty_i, empty_f = np.empty(0, np.int64), np.empty(0, np.float64)
    bad = first_invalid(values, limit)
    if bad >= 0:
        return BAD_VALUE, bad, empty_i, empty_f, 0, 0
    serials = np.empty(k, np.int64)
    slots = np.empty(k, np.int64)
    # Integer division costs tens of cycles; a float reciprocal gives the quotient to within one, then fix it.
    issued = next_serial * capacity  # every issued id lies below this
    inverse = 1.0 / capacity
    for j in range(k):
        i = ids[j]
        if i < 0 or i >= issued:
            return BAD_ID, j, empty_i, empty_f, 0, 0
        serial = np.int64(np.float64(i) * inverse)
        rest = i - serial * capacity
        while rest < 0:
            serial -= 1
            rest += capacity
        while rest >= capacity:
            serial += 1
            rest -= capacity
        if meta[rest, SERIAL] < serial:  # the slot never held this serial: its occupant is older (or none)
            return BAD_ID, j, empty_i, empty_f, 0, 0
        serials[j] = serial
        slots[j] = rest
    has_values = values.shape[0] > 0
    kept = np.empty(k, np.int64)
    kept_values = np.empty(k if has_values else 0, np.float64)
    start = k  # kept[start:] holds the kept slots, filled from the end so they come out in id order
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
            start -= 1
            kept[start] = slot
            if has_values:
                kept_values[start] = values[j]
    return OK, -1, kept[start:], kept_values[start:] if has_values else empty_f, stale, first
