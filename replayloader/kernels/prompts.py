"""Compiled steps of `PromptSampler`: a whole batch's draws, a whole feedback call's bookkeeping, and the trees
they read, each one pass over the batch instead of a numpy call (or a tree write) per drawn prompt.

Why here and not on `SumTree`: a batch of B prompts draws one place at a time (each place's prompt leaves the
trees before the next place is drawn, so the prompts are distinct), which from Python costs a handful of calls
per place; and a feedback call touches only its B prompts and the records that decayed since the last call, so
it needs no array of length N. The sampler's trees are plain arrays owned by `replayloader.prompts.trees`.

**Bit-identical to the per-place form they replace.** Every node of a sum tree is its two children's sum
(a min tree: their minimum), recomputed from them after each write, so a tree's values depend only on its leaves,
whatever the order of the writes; the leaves are the same functions of the records as before (`_leaf`), the
uniforms come from the same generator in the same order, and a draw walks the same comparisons. So the indices
drawn, the records and every tree value a draw reads are the same, bit for bit (tests/prompts/test_kernels.py
against the former form). That freedom of order is what the savings use:

* a drawn prompt's leaves are restored (refreshed) not at the end of `draw` but with the next feedback call's
  writes, at that call's clock (`PromptSampler` says why the values are the same);
* within a batch, the active tree (read only by exploration draws and retests) takes the drawn prompts out
  only before it is read;
* a draw's write stops climbing at the first ancestor whose value it does not change; a feedback call writes
  all its leaves first, then recomputes their ancestors level by level.

Layouts: a tree over P leaves (P a power of two) is a 1-indexed heap, node i's children 2i and 2i + 1, the leaf
of slot s at P + s. The bucket trees lie one after another in one array: tree b's node i at
``prior_at[b, 0] + i`` with ``prior_at[b, 1]`` leaves. The active tree holds two columns per node: the count of
active prompts (a sum) and the retest key (a min; +inf: not judged). Which records decay at a feedback call is
read from a calendar (`due_between`), not from a tree.
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
def _ascend_sums(sums, base, n_leaves, slots):
    """Recompute every ancestor of the leaves ``slots`` (already written) of the sum tree at ``sums[base:]``:
    level by level, each slot's node on the levels wider than the slots, then whole levels. The nodes of one
    level are independent, so their cache misses overlap (several times faster than one walk per slot at
    thousands of slots); a node shared by several slots is recomputed once per slot, each time to the same
    value."""
    m = slots.shape[0]
    if m == 0:
        return
    width = n_leaves >> 1  # the current level's nodes are [width, 2 * width)
    if width > m:
        up = np.empty(m, np.int64)
        for j in range(m):
            up[j] = (n_leaves + slots[j]) >> 1
        while width > m:
            for j in range(m):
                i = up[j]
                sums[base + i] = sums[base + 2 * i] + sums[base + 2 * i + 1]
                up[j] = i >> 1
            width >>= 1
    while width >= 1:
        for i in range(width, 2 * width):
            sums[base + i] = sums[base + 2 * i] + sums[base + 2 * i + 1]
        width >>= 1


@njit(cache=True, nogil=True)
def _ascend_buckets(prior, prior_at, trees, slots):
    """`_ascend_sums` for leaves spread over the bucket trees (leaf ``slots[j]`` of tree ``trees[j]``): the
    slots are grouped by tree, then each tree's ancestors recomputed."""
    k = prior_at.shape[0]
    if k == 1:
        _ascend_sums(prior, prior_at[0, 0], prior_at[0, 1], slots)
        return
    starts = np.zeros(k + 1, np.int64)
    for j in range(trees.shape[0]):
        starts[trees[j] + 1] += 1
    for b in range(k):
        starts[b + 1] += starts[b]
    grouped = np.empty(slots.shape[0], np.int64)
    fill = starts[:k].copy()
    for j in range(trees.shape[0]):
        grouped[fill[trees[j]]] = slots[j]
        fill[trees[j]] += 1
    for b in range(k):
        if starts[b + 1] > starts[b]:
            _ascend_sums(prior, prior_at[b, 0], prior_at[b, 1], grouped[starts[b]:starts[b + 1]])


@njit(cache=True, nogil=True)
def _ascend_active(active, n_leaves, slots):
    """`_ascend_sums` for the active tree: both columns (the count's sum, the key's minimum)."""
    m = slots.shape[0]
    if m == 0:
        return
    width = n_leaves >> 1
    if width > m:
        up = np.empty(m, np.int64)
        for j in range(m):
            up[j] = (n_leaves + slots[j]) >> 1
        while width > m:
            for j in range(m):
                i = up[j]
                active[i, COUNT] = active[2 * i, COUNT] + active[2 * i + 1, COUNT]
                active[i, KEY] = min(active[2 * i, KEY], active[2 * i + 1, KEY])
                up[j] = i >> 1
            width >>= 1
    while width >= 1:
        for i in range(width, 2 * width):
            active[i, COUNT] = active[2 * i, COUNT] + active[2 * i + 1, COUNT]
            active[i, KEY] = min(active[2 * i, KEY], active[2 * i + 1, KEY])
        width >>= 1


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
    """Prompt i's leaves from its record: A (data tree), c (its bucket's tree), active count (1/0) and retest
    key; the module doc of `prompts.sampler` says why."""
    d = _decay(clock, measured_at[i], stale_after)
    g = d * groups[i]
    s = d * signal_sum[i]
    denominator = g + strength
    if retired[i]:
        return 0.0, 0.0, 0.0, _INF
    key = np.float64(last_tested[i]) if g > 0 and s == 0 else _INF
    return s / denominator, strength / denominator, 1.0, key


@njit(cache=True, nogil=True)
def refresh(indices, clock, strength, stale_after, groups, signal_sum, measured_at, last_tested, retired,
            bucket_of, position, data, prior, prior_at, active, n_leaves):
    """Rewrite every tree's leaves of the prompts ``indices`` (repeats allowed) from their records: first every
    leaf, then the ancestors of the leaves that changed, tree by tree, level by level (`_ascend_sums`)."""
    m = indices.shape[0]
    data_slots = np.empty(m, np.int64)
    prior_slots = np.empty(m, np.int64)
    prior_trees = np.empty(m, np.int64)
    active_slots = np.empty(m, np.int64)
    n_data = n_prior = n_active = 0
    for j in range(m):
        i = indices[j]
        a, c, count, key = _leaf(i, clock, strength, stale_after, groups, signal_sum, measured_at, last_tested,
                                 retired)
        if data[n_leaves + i] != a:
            data[n_leaves + i] = a
            data_slots[n_data] = i
            n_data += 1
        b = bucket_of[i]
        at = prior_at[b, 0] + prior_at[b, 1] + position[i]
        if prior[at] != c:
            prior[at] = c
            prior_slots[n_prior] = position[i]
            prior_trees[n_prior] = b
            n_prior += 1
        if active[n_leaves + i, COUNT] != count or active[n_leaves + i, KEY] != key:
            active[n_leaves + i, COUNT] = count
            active[n_leaves + i, KEY] = key
            active_slots[n_active] = i
            n_active += 1
    _ascend_sums(data, 0, n_leaves, data_slots[:n_data])
    _ascend_buckets(prior, prior_at, prior_trees[:n_prior], prior_slots[:n_prior])
    _ascend_active(active, n_leaves, active_slots[:n_active])


@njit(cache=True, nogil=True)
def rebuild(clock, strength, stale_after, groups, signal_sum, measured_at, last_tested, retired, bucket_of,
            position, data, prior, prior_at, active, n_leaves):
    """Every tree from the records of all N prompts: the leaves, then every inner node bottom up (the same
    values as N single writes, in O(N))."""
    n = groups.shape[0]
    data[:] = 0.0
    prior[:] = 0.0
    active[:, COUNT] = 0.0
    active[:, KEY] = _INF
    for i in range(n):
        a, c, count, key = _leaf(i, clock, strength, stale_after, groups, signal_sum, measured_at, last_tested,
                                 retired)
        data[n_leaves + i] = a
        prior[prior_at[bucket_of[i], 0] + prior_at[bucket_of[i], 1] + position[i]] = c
        active[n_leaves + i, COUNT] = count
        active[n_leaves + i, KEY] = key
    _build_sums(data, 0, n_leaves)
    for b in range(prior_at.shape[0]):
        _build_sums(prior, prior_at[b, 0], prior_at[b, 1])
    for i in range(n_leaves - 1, 0, -1):
        active[i, COUNT] = active[2 * i, COUNT] + active[2 * i + 1, COUNT]
        active[i, KEY] = min(active[2 * i, KEY], active[2 * i + 1, KEY])


# ----------------------------------------------------------------------------------------------- draws
@njit(cache=True, nogil=True, inline="always")
def _hide_from_sums(i, bucket_of, position, data, prior, prior_at, n_leaves):
    """Take prompt i out of the draws by priority (its data and bucket leaves become 0)."""
    b = bucket_of[i]
    _write_sum(data, 0, n_leaves, i, 0.0)
    _write_sum(prior, prior_at[b, 0], prior_at[b, 1], position[i], 0.0)


@njit(cache=True, nogil=True)
def _hide_from_active(out, start, stop, active, n_leaves):
    """Take the prompts ``out[start:stop]`` out of the active tree (exploration draws and retests)."""
    for j in range(start, stop):
        _write_active(active, n_leaves, out[j], 0.0, _INF)


@njit(cache=True, nogil=True)
def _fill_masses(priors, masses, data, prior, prior_at):
    """Each tree's mass (the data tree's total, then each bucket's prior × its tree's total) into ``masses``;
    returns their sum, added in that order."""
    total = data[1]
    masses[0] = total
    for b in range(priors.shape[0]):
        masses[b + 1] = priors[b] * prior[prior_at[b, 0] + 1]
        total += masses[b + 1]
    return total


@njit(cache=True, nogil=True)
def _draw_by_priority(u_pick, masses, total, data, prior, prior_at, members, member_start, n_leaves):
    """One prompt by priority: the tree whose share of ``total`` holds ``u_pick``, then the leaf within it."""
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
        return _descend(data, 0, n_leaves, fraction * data[1])
    b = part - 1
    slot = _descend(prior, prior_at[b, 0], prior_at[b, 1], fraction * prior[prior_at[b, 0] + 1])
    return members[member_start[b] + slot]


@njit(cache=True, nogil=True)
def draw(rng_state, retest_places, exploration, priors, out, clock, step, last_tested, last_drawn, bucket_of,
         position, members, member_start, data, prior, prior_at, active, n_leaves):
    """Fill ``out`` (k places) with distinct prompts: up to ``retest_places`` retests first (the smallest retest
    keys, oldest test first), then, from two uniforms per place, a draw by priority, or with probability ε (or
    when no priority is left) uniformly among the active prompts; marks them drawn at ``step`` (retests as
    tested at ``clock``). Returns (retests, exploration draws).

    The drawn prompts are left out of the trees (their data and bucket leaves 0; in the active tree, all up to
    the last exploration draw): the caller refreshes their leaves before the trees are read again."""
    k = out.shape[0]
    retests = 0
    while retests < retest_places and active[1, KEY] < _INF:
        i = _argmin_key(active, n_leaves)
        out[retests] = i
        _hide_from_sums(i, bucket_of, position, data, prior, prior_at, n_leaves)
        _hide_from_active(out, retests, retests + 1, active, n_leaves)
        retests += 1
    u = np.empty(2 * (k - retests), np.float64)
    fill_uniforms(rng_state, u)
    masses = np.empty(priors.shape[0] + 1, np.float64)
    explored = 0
    in_active = retests  # out[:in_active] are out of the active tree
    for j in range(retests, k):
        u_mix, u_pick = u[2 * (j - retests)], u[2 * (j - retests) + 1]
        total = _fill_masses(priors, masses, data, prior, prior_at)
        if u_mix < exploration or not total > 0:
            _hide_from_active(out, in_active, j, active, n_leaves)  # the active tree is read: bring it up to date
            in_active = j
            i = _descend_active(active, n_leaves, u_pick * active[1, COUNT])
            explored += 1
        else:
            i = _draw_by_priority(u_pick, masses, total, data, prior, prior_at, members, member_start, n_leaves)
        out[j] = i
        _hide_from_sums(i, bucket_of, position, data, prior, prior_at, n_leaves)
    for j in range(retests):
        last_tested[out[j]] = clock
    for j in range(k):
        last_drawn[out[j]] = step
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


@njit(cache=True, nogil=True, inline="always")
def _current(i, step, measured_at, retired):
    """Whether a calendar entry (prompt i measured at ``step``) is still prompt i's record: not measured since,
    nor retired."""
    return measured_at[i] == step and not retired[i]


@njit(cache=True, nogil=True)
def due_between(prompts, steps, size, since, now, stale_after, measured_at, retired):
    """The prompts whose record halves after policy step ``since`` and at or before ``now``: those measured at
    m with m + j·stale_after in (since, now] for some j in 1 .. MAX_HALVINGS (the j-th halving; the last one
    forgets the record). ``prompts[:size]``, ``steps[:size]`` is the calendar: each feedback's prompts with the
    step they were measured at, in step order; an entry whose prompt was measured again or retired since is
    skipped. A prompt may be named twice when the clock jumped by more than ``stale_after``."""
    found = np.empty(64, np.int64)
    count = 0
    if now - since < stale_after:  # each halving's window is one range of steps
        for j in range(1, MAX_HALVINGS + 1):
            lo = _first_after(steps, size, since - j * stale_after)
            hi = _first_after(steps, size, now - j * stale_after)
            for q in range(lo, hi):
                i = prompts[q]
                if _current(i, steps[q], measured_at, retired):
                    if count == found.shape[0]:
                        found = np.concatenate((found, np.empty(count, np.int64)))
                    found[count] = i
                    count += 1
        return found[:count]
    lo = _first_after(steps, size, since - MAX_HALVINGS * stale_after)
    hi = _first_after(steps, size, now - stale_after)
    for q in range(lo, hi):  # a jump: every entry whose next halving after `since` is at or before `now`
        m = steps[q]
        halving = m + (max(since - m, 0) // stale_after + 1) * stale_after
        if halving <= now and halving <= m + MAX_HALVINGS * stale_after and _current(prompts[q], m, measured_at,
                                                                                    retired):
            if count == found.shape[0]:
                found = np.concatenate((found, np.empty(count, np.int64)))
            found[count] = prompts[q]
            count += 1
    return found[:count]


@njit(cache=True, nogil=True)
def compact_calendar(prompts, steps, size, now, stale_after, measured_at, retired):
    """Drop the calendar entries that can no longer come due (their prompt measured again or retired, or all
    their halvings at or before ``now``), keeping the order; returns the new size."""
    kept = 0
    for q in range(size):
        i, m = prompts[q], steps[q]
        if m + MAX_HALVINGS * stale_after > now and _current(i, m, measured_at, retired):
            prompts[kept] = i
            steps[kept] = m
            kept += 1
    return kept
