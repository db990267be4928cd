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
  only before it is read, all of them at once;
* a draw's write stops climbing at the first ancestor whose value it does not change; a batch of writes
  (a feedback call's, the active tree's) writes all its leaves first, then recomputes their ancestors level
  by level, so that the cache misses of a level overlap (`_ascend_sums`).

Layouts: a tree over P leaves (P a power of two) is a 1-indexed heap, node i's children 2i and 2i + 1, the leaf
of slot s at P + s. The bucket trees lie one after another in one array: tree b's node i at
``prior_at[b, 0] + i`` with ``prior_at[b, 1]`` leaves. The active tree holds two columns per node: the count of
active prompts (a sum) and the retest key (a min; +inf: not judged). Which records decay at a feedback call is
read from a calendar (`kernels.calendar`), not from a tree.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .rng import fill_uniforms
from .tree import ascend_levels, argmin_in_column

MAX_HALVINGS = 30  # a record this many staleness periods old is forgotten (its decay is 0)
_BELOW_ONE = float(np.nextafter(1.0, 0.0))
_INF = np.inf
COUNT, KEY = 0, 1  # the active tree's columns (COUNT must be 0: the tree kernels' sum column, `_ascend_active`)


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
    return _descend(active[:, COUNT], 0, n_leaves, target)


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
    """`_ascend_sums` for the active tree: its count column is the sum column 0 and its key column a min column
    of the tree kernels' node layout, so their level-by-level ascent serves it."""
    ascend_levels(active, -1, -1, KEY, n_leaves, slots)


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
    return 1.0 / np.float64(1 << halvings) if halvings < MAX_HALVINGS else 0.0  # exact: a power of two


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


DATA, PRIOR, ACTIVE, READ = 0, 1, 2, 3  # a change set's counts: leaves of each tree; READ: see `_touch_decayed`


@njit(cache=True, nogil=True)
def _new_changes(capacity):
    """Room for the leaves a call changes: slots of the data tree, of the bucket trees (with each one's tree),
    of the active tree, and how many of each."""
    return (np.empty(capacity, np.int64), np.empty(capacity, np.int64), np.empty(capacity, np.int64),
            np.empty(capacity, np.int64), np.zeros(4, np.int64))


@njit(cache=True, nogil=True, inline="always")
def _set_data(i, a, data, n_leaves, data_slots, counts):
    if data[n_leaves + i] != a:
        data[n_leaves + i] = a
        data_slots[counts[DATA]] = i
        counts[DATA] += 1


@njit(cache=True, nogil=True, inline="always")
def _set_prior(b, slot, c, prior, prior_at, prior_slots, prior_trees, counts):
    at = prior_at[b, 0] + prior_at[b, 1] + slot
    if prior[at] != c:
        prior[at] = c
        prior_slots[counts[PRIOR]] = slot
        prior_trees[counts[PRIOR]] = b
        counts[PRIOR] += 1


@njit(cache=True, nogil=True, inline="always")
def _set_active(i, count, key, active, n_leaves, active_slots, counts):
    if active[n_leaves + i, COUNT] != count or active[n_leaves + i, KEY] != key:
        active[n_leaves + i, COUNT] = count
        active[n_leaves + i, KEY] = key
        active_slots[counts[ACTIVE]] = i
        counts[ACTIVE] += 1


@njit(cache=True, nogil=True)
def _write_leaves(indices, clock, strength, stale_after, groups, signal_sum, measured_at, last_tested, retired,
                  bucket_of, position, data, prior, prior_at, active, n_leaves, changes):
    """Write the leaves of the prompts ``indices`` (repeats allowed) from their records; note the changed ones
    in ``changes`` (`_new_changes`); their ancestors are left to `_ascend_changes`."""
    data_slots, prior_slots, prior_trees, active_slots, counts = changes
    for j in range(indices.shape[0]):
        i = indices[j]
        a, c, count, key = _leaf(i, clock, strength, stale_after, groups, signal_sum, measured_at, last_tested,
                                 retired)
        _set_data(i, a, data, n_leaves, data_slots, counts)
        _set_prior(bucket_of[i], position[i], c, prior, prior_at, prior_slots, prior_trees, counts)
        _set_active(i, count, key, active, n_leaves, active_slots, counts)


@njit(cache=True, nogil=True)
def _ascend_changes(data, prior, prior_at, active, n_leaves, changes):
    """Recompute the ancestors of every leaf noted in ``changes``, tree by tree."""
    data_slots, prior_slots, prior_trees, active_slots, counts = changes
    _ascend_sums(data, 0, n_leaves, data_slots[:counts[DATA]])
    _ascend_buckets(prior, prior_at, prior_trees[:counts[PRIOR]], prior_slots[:counts[PRIOR]])
    _ascend_active(active, n_leaves, active_slots[:counts[ACTIVE]])


@njit(cache=True, nogil=True)
def refresh(indices, clock, strength, stale_after, groups, signal_sum, measured_at, last_tested, retired,
            bucket_of, position, data, prior, prior_at, active, n_leaves):
    """Rewrite every tree's leaves of the prompts ``indices`` (repeats allowed) from their records: first every
    leaf, then the ancestors of the leaves that changed, tree by tree, level by level (`_ascend_sums`)."""
    changes = _new_changes(indices.shape[0])
    _write_leaves(indices, clock, strength, stale_after, groups, signal_sum, measured_at, last_tested, retired,
                  bucket_of, position, data, prior, prior_at, active, n_leaves, changes)
    _ascend_changes(data, prior, prior_at, active, n_leaves, changes)


@njit(cache=True, nogil=True)
def _touch_decayed(due, entries, buckets, slots, data, prior, prior_at, n_leaves):
    """Read the leaves `_write_decayed` will write, in a loop of loads only, so that their cache misses overlap
    (tens at a time) instead of waiting one by one inside the longer loop that computes and writes them. Returns
    how many are positive, which the caller stores, so that the compiler keeps the reads."""
    seen = 0
    for j in range(due.shape[0]):
        q = due[j]
        b = buckets[q]
        seen += (prior[prior_at[b, 0] + prior_at[b, 1] + slots[q]] + data[n_leaves + entries[q]]) > 0
    return seen


@njit(cache=True, nogil=True)
def _write_decayed(due, entries, steps, buckets, slots, groups_at, signals_at, clock, strength, stale_after,
                   last_tested, data, prior, prior_at, active, n_leaves, changes):
    """Write the leaves of the records that halved (calendar positions ``due``: `kernels.calendar`), reading
    only what a halving can change. A calendar entry is a prompt measured at its step, not measured since nor
    retired, with its group count and signal sum, so its leaves are `_leaf`'s with those, and of them:

    * c always changes (d·g does);
    * A is 0 before and after when the signal sum is 0, so that leaf is read only when it is not;
    * the retest key is +inf before and after while the decayed signal sum s is > 0 (it was larger before), so
      the active leaf is read only when s = 0 (a judged prompt, or a record the last halving forgot).
    A prompt also drawn since its leaves were written is rewritten by `_write_leaves` as well, to the same values.
    """
    data_slots, prior_slots, prior_trees, active_slots, counts = changes
    counts[READ] = _touch_decayed(due, entries, buckets, slots, data, prior, prior_at, n_leaves)
    for j in range(due.shape[0]):
        q = due[j]
        i = entries[q]
        d = _decay(clock, steps[q], stale_after)
        g = d * groups_at[q]
        s = d * signals_at[q]
        denominator = g + strength
        _set_prior(buckets[q], slots[q], strength / denominator, prior, prior_at, prior_slots, prior_trees, counts)
        if signals_at[q] != 0:
            _set_data(i, s / denominator, data, n_leaves, data_slots, counts)
        if s == 0:
            key = np.float64(last_tested[i]) if g > 0 else _INF
            _set_active(i, 1.0, key, active, n_leaves, active_slots, counts)


@njit(cache=True, nogil=True)
def refresh_fed(indices, due, entries, steps, buckets, slots, groups_at, signals_at, clock, strength, stale_after,
                groups, signal_sum, measured_at, last_tested, retired, bucket_of, position, data, prior, prior_at,
                active, n_leaves):
    """A feedback call's tree writes in one pass: the leaves of ``indices`` (the fed prompts and any drawn
    since the last write) and of the records that halved (calendar positions ``due``), then their ancestors."""
    changes = _new_changes(indices.shape[0] + due.shape[0])
    _write_leaves(indices, clock, strength, stale_after, groups, signal_sum, measured_at, last_tested, retired,
                  bucket_of, position, data, prior, prior_at, active, n_leaves, changes)
    _write_decayed(due, entries, steps, buckets, slots, groups_at, signals_at, clock, strength, stale_after,
                   last_tested, data, prior, prior_at, active, n_leaves, changes)
    _ascend_changes(data, prior, prior_at, active, n_leaves, changes)


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
    """Take the prompts ``out[start:stop]`` (distinct, all in the active tree) out of it, for exploration draws
    and retests: their leaves, then their ancestors level by level."""
    for j in range(start, stop):
        active[n_leaves + out[j], COUNT] = 0.0
        active[n_leaves + out[j], KEY] = _INF
    _ascend_active(active, n_leaves, out[start:stop])


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
        i = argmin_in_column(active, n_leaves, KEY)  # the smallest retest key, lowest slot among ties
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
