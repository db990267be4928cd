"""Compiled steps of `PromptSampler`: a whole batch's draws, a whole feedback call's bookkeeping, and the trees
they read, each one pass over the batch instead of a numpy call (or a tree write) per drawn prompt.

Why here and not on `SumTree`: a batch of B prompts draws one place at a time (each place's prompt leaves the
trees before the next place is drawn, so the prompts are distinct), which from Python costs a handful of calls
per place; and a feedback call touches only its B prompts and the records that decayed since the last call, so
it needs no array of length N. The sampler's trees are plain arrays owned by `replayloader.prompts.trees`.

**Bit-identical to the per-place form they replace.** Every node of a sum tree is its two children's sum
(a min tree: their minimum), recomputed from them after each write, so a tree's values depend only on its leaves;
the leaves are the same functions of the records as before (`_leaf`), the uniforms come from the same generator
in the same order, and a draw walks the same comparisons. So the indices drawn, the records and every tree value
are the same, bit for bit (tests/prompts/test_kernels.py against the former form).

Layouts: a tree over P leaves (P a power of two) is a 1-indexed heap, node i's children 2i and 2i + 1, the leaf
of slot s at P + s. The bucket trees lie one after another in one array: tree b's node i at
``prior_at[b, 0] + i`` with ``prior_at[b, 1]`` leaves. The active tree holds two columns per node: the count of
active prompts (a sum) and the retest key (a min; +inf: not judged). The decay tree holds only keys: the policy
step at which each record next halves (+inf: never).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .rng import fill_uniforms

MAX_HALVINGS = 30  # a record this many staleness periods old is forgotten (its decay is 0)
_BELOW_ONE = float(np.nextafter(1.0, 0.0))
_INF = np.inf
COUNT, KEY = 0, 1  # the active tree's columns


# ----------------------------------------------------------------------------------------------- trees
@njit(cache=True, nogil=True, inline="always")
def _write_sum(sums, base, n_leaves, slot, value):
    """Set one leaf of the sum tree at ``sums[base:]`` and recompute its ancestors, stopping at the first one
    whose value does not change (everything above it is then unchanged too)."""
    i = n_leaves + slot
    if sums[base + i] == value:
        return
    sums[base + i] = value
    i >>= 1
    while i >= 1:
        total = sums[base + 2 * i] + sums[base + 2 * i + 1]
        if sums[base + i] == total:
            return
        sums[base + i] = total
        i >>= 1


@njit(cache=True, nogil=True, inline="always")
def _write_key(keys, n_leaves, slot, key):
    """Set one leaf of a min tree and recompute its ancestors, up to the first that keeps its value."""
    i = n_leaves + slot
    if keys[i] == key:
        return
    keys[i] = key
    i >>= 1
    while i >= 1:
        low = min(keys[2 * i], keys[2 * i + 1])
        if keys[i] == low:
            return
        keys[i] = low
        i >>= 1


@njit(cache=True, nogil=True, inline="always")
def _write_active(active, n_leaves, slot, count, key):
    """Set one leaf of the active tree (count and key) and recompute its ancestors, up to the first that keeps
    both values."""
    i = n_leaves + slot
    if active[i, COUNT] == count and active[i, KEY] == key:
        return
    active[i, COUNT] = count
    active[i, KEY] = key
    i >>= 1
    while i >= 1:
        total = active[2 * i, COUNT] + active[2 * i + 1, COUNT]
        low = min(active[2 * i, KEY], active[2 * i + 1, KEY])
        if active[i, COUNT] == total and active[i, KEY] == low:
            return
        active[i, COUNT] = total
        active[i, KEY] = low
        i >>= 1


@njit(cache=True, nogil=True)
def _descend(sums, base, n_leaves, target):
    """The slot whose cumulative range holds ``target``, never entering a subtree of zero mass: the walk of
    `kernels.tree.descend`, for one target, comparison for comparison."""
    at = 1
    u = target
    while at < n_leaves:
        left = 2 * at
        mass_left = sums[base + left]
        go_right = (u >= mass_left or mass_left <= 0.0) and sums[base + left + 1] > 0.0
        if go_right:
            u -= mass_left
            at = left + 1
        else:
            at = left
    return at - n_leaves


@njit(cache=True, nogil=True)
def _descend_active(active, n_leaves, target):
    """`_descend` over the active tree's counts (an exploration draw)."""
    at = 1
    u = target
    while at < n_leaves:
        left = 2 * at
        mass_left = active[left, COUNT]
        go_right = (u >= mass_left or mass_left <= 0.0) and active[left + 1, COUNT] > 0.0
        if go_right:
            u -= mass_left
            at = left + 1
        else:
            at = left
    return at - n_leaves


@njit(cache=True, nogil=True)
def _argmin_key(active, n_leaves):
    """The slot of the smallest retest key, the lowest slot among ties."""
    i = 1
    while i < n_leaves:
        left = 2 * i
        i = left if active[left, KEY] <= active[left + 1, KEY] else left + 1
    return i - n_leaves


@njit(cache=True, nogil=True)
def _build_sums(sums, base, n_leaves):
    """Every inner node of the sum tree at ``sums[base:]`` from its children, bottom up."""
    for i in range(n_leaves - 1, 0, -1):
        sums[base + i] = sums[base + 2 * i] + sums[base + 2 * i + 1]


# ----------------------------------------------------------------------------------------------- leaves
@njit(cache=True, nogil=True, inline="always")
def _decay(clock, measured_at, stale_after):
    """d of a record measured at ``measured_at``: 1 without staleness (``stale_after`` 0), else
    2^-⌊age / stale_after⌋, 0 once forgotten."""
    if stale_after <= 0:
        return 1.0
    halvings = max(clock - measured_at, 0) // stale_after
    return math.ldexp(1.0, -halvings) if halvings < MAX_HALVINGS else 0.0


@njit(cache=True, nogil=True, inline="always")
def _leaf(i, clock, strength, stale_after, groups, signal_sum, measured_at, last_tested, retired):
    """Prompt i's leaves from its record: A (data tree), c (its bucket's tree), active count (1/0), retest key,
    next decay step; the module doc of `prompts.sampler` says why."""
    d = _decay(clock, measured_at[i], stale_after)
    g = d * groups[i]
    s = d * signal_sum[i]
    denominator = g + strength
    if retired[i]:
        return 0.0, 0.0, 0.0, _INF, _INF
    key = np.float64(last_tested[i]) if g > 0 and s == 0 else _INF
    due = _INF
    if stale_after > 0 and measured_at[i] >= 0:
        halvings = max(clock - measured_at[i], 0) // stale_after
        if halvings < MAX_HALVINGS:
            due = np.float64(measured_at[i] + stale_after * (halvings + 1))
    return s / denominator, strength / denominator, 1.0, key, due


@njit(cache=True, nogil=True)
def _refresh_one(i, clock, strength, stale_after, groups, signal_sum, measured_at, last_tested, retired,
                 bucket_of, position, data, prior, prior_at, active, due, n_leaves):
    """Rewrite every tree's leaf of prompt i from its record."""
    a, c, count, key, next_decay = _leaf(i, clock, strength, stale_after, groups, signal_sum, measured_at,
                                         last_tested, retired)
    b = bucket_of[i]
    _write_sum(data, 0, n_leaves, i, a)
    _write_sum(prior, prior_at[b, 0], prior_at[b, 1], position[i], c)
    _write_active(active, n_leaves, i, count, key)
    if stale_after > 0:
        _write_key(due, n_leaves, i, next_decay)


@njit(cache=True, nogil=True)
def refresh(indices, clock, strength, stale_after, groups, signal_sum, measured_at, last_tested, retired,
            bucket_of, position, data, prior, prior_at, active, due, n_leaves):
    """Rewrite every tree's leaves of the prompts ``indices`` from their records."""
    for j in range(indices.shape[0]):
        _refresh_one(indices[j], clock, strength, stale_after, groups, signal_sum, measured_at, last_tested,
                     retired, bucket_of, position, data, prior, prior_at, active, due, n_leaves)


@njit(cache=True, nogil=True)
def rebuild(clock, strength, stale_after, groups, signal_sum, measured_at, last_tested, retired, bucket_of,
            position, data, prior, prior_at, active, due, n_leaves):
    """Every tree from the records of all N prompts: the leaves, then every inner node bottom up (the same
    values as N single writes, in O(N))."""
    n = groups.shape[0]
    data[:] = 0.0
    prior[:] = 0.0
    active[:, COUNT] = 0.0
    active[:, KEY] = _INF
    due[:] = _INF
    for i in range(n):
        a, c, count, key, next_decay = _leaf(i, clock, strength, stale_after, groups, signal_sum, measured_at,
                                             last_tested, retired)
        b = bucket_of[i]
        data[n_leaves + i] = a
        prior[prior_at[b, 0] + prior_at[b, 1] + position[i]] = c
        active[n_leaves + i, COUNT] = count
        active[n_leaves + i, KEY] = key
        if stale_after > 0:
            due[n_leaves + i] = next_decay
    _build_sums(data, 0, n_leaves)
    for b in range(prior_at.shape[0]):
        _build_sums(prior, prior_at[b, 0], prior_at[b, 1])
    for i in range(n_leaves - 1, 0, -1):
        active[i, COUNT] = active[2 * i, COUNT] + active[2 * i + 1, COUNT]
        active[i, KEY] = min(active[2 * i, KEY], active[2 * i + 1, KEY])
    if stale_after > 0:
        for i in range(n_leaves - 1, 0, -1):
            due[i] = min(due[2 * i], due[2 * i + 1])


# ----------------------------------------------------------------------------------------------- draws
@njit(cache=True, nogil=True, inline="always")
def _hide(i, bucket_of, position, data, prior, prior_at, active, n_leaves):
    """Take prompt i out of every draw until its leaves are refreshed (a batch's prompts are distinct)."""
    b = bucket_of[i]
    _write_sum(data, 0, n_leaves, i, 0.0)
    _write_sum(prior, prior_at[b, 0], prior_at[b, 1], position[i], 0.0)
    _write_active(active, n_leaves, i, 0.0, _INF)


@njit(cache=True, nogil=True)
def _draw_one(u_mix, u_pick, exploration, priors, masses, data, prior, prior_at, members, member_start, active,
              n_leaves):
    """One place drawn by priority (or, with probability ε or when no mass is left, uniformly among active
    prompts): a tree is picked by its mass (the data tree's total, then each bucket's prior × its tree's total,
    summed in that order), then descended. Returns (prompt, whether the draw was an exploration draw)."""
    total = data[1]
    masses[0] = total
    for b in range(priors.shape[0]):
        masses[b + 1] = priors[b] * prior[prior_at[b, 0] + 1]
        total += masses[b + 1]
    if u_mix < exploration or not total > 0:
        return _descend_active(active, n_leaves, u_pick * active[1, COUNT]), True
    target = u_pick * total
    last = 0
    for j in range(masses.shape[0]):
        if masses[j] > 0:
            last = j  # rounding never walks past the last mass
    part = 0
    while part < last and (masses[part] <= 0 or target >= masses[part]):
        target -= masses[part]
        part += 1
    fraction = min(max(target / masses[part], 0.0), _BELOW_ONE)
    if part == 0:
        return _descend(data, 0, n_leaves, fraction * data[1]), False
    b = part - 1
    slot = _descend(prior, prior_at[b, 0], prior_at[b, 1], fraction * prior[prior_at[b, 0] + 1])
    return members[member_start[b] + slot], False


@njit(cache=True, nogil=True)
def draw(rng_state, retest_places, exploration, priors, out, clock, step, strength, stale_after, groups,
         signal_sum, measured_at, last_tested, last_drawn, retired, bucket_of, position, members, member_start,
         data, prior, prior_at, active, due, n_leaves):
    """Fill ``out`` (k places) with distinct prompts: up to ``retest_places`` retests first (the smallest retest
    keys, oldest test first), then draws by priority from two uniforms per place; marks them drawn at ``step``
    (retests as tested at ``clock``) and refreshes their leaves. Returns (retests, exploration draws)."""
    k = out.shape[0]
    retests = 0
    while retests < retest_places and active[1, KEY] < _INF:
        i = _argmin_key(active, n_leaves)
        out[retests] = i
        _hide(i, bucket_of, position, data, prior, prior_at, active, n_leaves)
        retests += 1
    u = np.empty(2 * (k - retests), np.float64)
    fill_uniforms(rng_state, u)
    masses = np.empty(priors.shape[0] + 1, np.float64)
    explored = 0
    for j in range(k - retests):
        i, uniform = _draw_one(u[2 * j], u[2 * j + 1], exploration, priors, masses, data, prior, prior_at,
                               members, member_start, active, n_leaves)
        out[retests + j] = i
        explored += uniform
        _hide(i, bucket_of, position, data, prior, prior_at, active, n_leaves)
    for j in range(retests):
        last_tested[out[j]] = clock
    for j in range(k):
        last_drawn[out[j]] = step
    refresh(out, clock, strength, stale_after, groups, signal_sum, measured_at, last_tested, retired, bucket_of,
            position, data, prior, prior_at, active, due, n_leaves)
    return retests, explored


# ----------------------------------------------------------------------------------------------- feedback
@njit(cache=True, nogil=True)
def record_groups(indices, sizes, reward_sums, signals, solved, clock, stale_after, retire_after, groups,
                  attempts, successes, signal_sum, measured_at, last_tested, streak, retired):
    """Add one group to each prompt's record (``indices`` distinct, checked by the caller): decay the record to
    ``clock``, add the group's completions, reward sum and signal, stamp it measured, and extend or end its run of
    solved groups. Returns how many prompts this retired (``retire_after`` 0: none)."""
    newly = 0
    for j in range(indices.shape[0]):
        i = indices[j]
        d = _decay(clock, measured_at[i], stale_after)
        groups[i] = groups[i] * d + 1.0
        attempts[i] = attempts[i] * d + sizes
        successes[i] = successes[i] * d + reward_sums[j]
        signal_sum[i] = signal_sum[i] * d + signals[j]
        measured_at[i] = clock
        last_tested[i] = clock
        streak[i] = streak[i] + 1 if solved[j] else 0
        if retire_after > 0 and streak[i] >= retire_after and not retired[i]:
            retired[i] = True
            newly += 1
    return newly


@njit(cache=True, nogil=True)
def learn_priors(buckets, signals, memory, bucket_sum, bucket_weight):
    """Each bucket named in ``buckets`` keeps ``memory`` of its running sums, then gains its groups' signals in
    call order (what ``np.add.at`` adds, in the same order)."""
    present = np.zeros(bucket_sum.shape[0], np.bool_)
    for j in range(buckets.shape[0]):
        present[buckets[j]] = True
    for b in range(bucket_sum.shape[0]):
        if present[b]:
            bucket_sum[b] *= memory
            bucket_weight[b] *= memory
    for j in range(buckets.shape[0]):
        bucket_sum[buckets[j]] += signals[j]
        bucket_weight[buckets[j]] += 1.0


@njit(cache=True, nogil=True)
def decayed(due, n_leaves, clock):
    """The prompts whose record halves at or before ``clock`` (decay key <= clock), in slot order: a walk of
    the min tree that enters only subtrees whose minimum is due."""
    found = np.empty(16, np.int64)
    count = 0
    if not due[1] <= clock:
        return found[:0]
    stack = np.empty(64, np.int64)
    stack[0] = 1
    top = 1
    while top > 0:
        top -= 1
        i = stack[top]
        if i >= n_leaves:
            if count == found.shape[0]:
                found = np.concatenate((found, np.empty(count, np.int64)))
            found[count] = i - n_leaves
            count += 1
            continue
        for child in (2 * i + 1, 2 * i):  # the right child first, so the left one is taken first
            if due[child] <= clock:
                stack[top] = child
                top += 1
    return found[:count]
