"""The k smallest leaves of a min tree, in (key, slot) order, without modifying the tree.

Layout (as in `sumtree`): a 1-indexed binary heap over ``P`` leaves (``P`` a power of two); node ``i`` has
children ``2i`` and ``2i+1``, the leaf of slot ``s`` is node ``P + s``, and every internal node holds the min of
its two children. Empty leaves hold +inf and are never selected.

The search goes down level by level with a frontier (in slot order) of the nodes that may still hold one of the
k winners, and a bound ``bkey`` such that at least k leaves are <= bkey: a node whose min is above it holds none.

* It starts on the level of ~4k nodes (~2k on shallow trees), whose minima are the slice ``keys[m:2m]``; their
  k-th smallest is the first bkey (each of those k subtrees holds a leaf no larger), and ~k nodes survive it.
* It descends two levels at a time (a node's four grandchildren are contiguous) and keeps the nodes <= bkey. A
  node below bkey always has a descendant below it, so on random keys the frontier grows only to the ~1.15k
  leaves below bkey.
* Ties: n nodes below bkey vouch for n leaves below it, so only the first k - n nodes at bkey (in slot order)
  are kept, since the lowest slots win among equal keys. Half the keys tied at the minimum cost no more.
* Many small keys side by side (a cluster, keys rising with the slot) can still grow the frontier; past 2k nodes
  it is cut back to ~1.3k by a bkey read off a sample (or to k by the k-th smallest (min, rightmost slot)).

So the search touches O(k log(N / k)) nodes whatever the keys, instead of k argmin descents that each set a key
to +inf and re-ascend. At the bottom the candidate leaves (at most 2k, in slot order) are bucket sorted by key,
stably, and the first k returned.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# Tuning (timed at N = 1e3..1e6, k = 128..1024): start on the level of ~_START * k nodes (the levels above would
# all survive anyway), descend _JUMP levels a pass, cut the frontier back when it exceeds _CAP * k nodes.
_START = 4
_CAP = 2
_JUMP = 2
_CUT_SLACK = 1.3
_SMALL = 16  # sort ranges up to this size are left to the final insertion sort
_MAX_PASSES = 6  # bucket passes on nested ranges before a merge sort takes over
_MAX_FINITE = np.finfo(np.float64).max
_U1 = np.uint64(1)
_U0 = np.uint64(0)


@njit(cache=True, nogil=True)
def _quickselect(a, n, t):
    """The t-th smallest (0-based) of a[:n], partially reordering a. Hoare partition, so runs of equal values
    split evenly instead of degrading to O(n^2)."""
    lo, hi = 0, n - 1
    while hi - lo > 16:
        mid = (lo + hi) >> 1
        x, y, z = a[lo], a[mid], a[hi]  # median of three as pivot
        if x > y:
            x, y = y, x
        if y > z:
            y = z if x <= z else x
        pivot = y
        i, j = lo, hi
        while i <= j:
            while a[i] < pivot:
                i += 1
            while a[j] > pivot:
                j -= 1
            if i <= j:
                a[i], a[j] = a[j], a[i]
                i += 1
                j -= 1
        if t <= j:
            hi = j
        elif t >= i:
            lo = i
        else:
            return a[t]  # j < t < i: a[t] equals the pivot
    for i in range(lo + 1, hi + 1):  # short range: insertion sort
        v = a[i]
        j = i - 1
        while j >= lo and a[j] > v:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = v
    return a[t]


@njit(cache=True, nogil=True)
def _kth_smallest(a, n, t, band):
    """The t-th smallest (0-based) of a[:n], reordering a; band is scratch of size n + 256. Large inputs: two
    pivots from a sample bracket the answer (Floyd-Rivest), and one branch-free pass counts the values below and
    keeps those in between, so the quickselect runs on ~n / 6 values instead of n."""
    if n < 1024:
        return _quickselect(a, n, t)
    s = 256
    step = n // s
    sample = band[n:n + s]
    for i in range(s):
        sample[i] = a[i * step]
    r = t * s // n
    delta = int(2.5 * np.sqrt(s * (t + 1.0) / n * (1.0 - t / n))) + 3
    r1, r2 = max(r - delta, 0), min(r + delta, s - 1)
    lo = _quickselect(sample, s, r1)
    hi = _quickselect(sample[r1:], s - r1, r2 - r1)  # sample[r1:] now holds the values >= lo
    below = 0
    c = 0
    if lo == hi:  # a heavily repeated value: count it instead of copying it around
        for i in range(n):
            v = a[i]
            below += v < lo
            c += v == lo
        if below <= t < below + c:
            return lo
    else:
        for i in range(n):
            v = a[i]
            band[c] = v
            below += v < lo
            c += (v >= lo) & (v <= hi)
        if below <= t < below + c:
            return _quickselect(band, c, t - below)
    return _quickselect(a, n, t)  # the sample missed (rare): plain selection


@njit(cache=True, nogil=True)
def _count_below(vals, f, bkey):
    """How many of vals[:f] are < bkey, and the index of the last one (-1 if none)."""
    n_lt = 0
    last = -1
    for j in range(f):
        lt = vals[j] < bkey
        n_lt += lt
        last = j if lt else last
    return n_lt, last


@njit(cache=True, nogil=True)
def _descend(keys, nodes, f, d, bkey, quota, ties, last_lt, out_nodes, out_vals):
    """Replace each frontier node by its 2**d descendants d levels down (contiguous), keeping those that may hold a
    winner: below bkey, or at bkey among the first `quota` in slot order. That count is serial from one child to
    the next, so it is only kept with `ties`; without, every child at bkey is kept (looser, still correct). With
    ties, once the quota is met only nodes below bkey (none past index last_lt) can add anything.
    Returns (kept, kept below bkey, index of the last kept below bkey or an upper bound of it). Unsigned
    indices: no negative-index wraparound code in the hot loop."""
    span = _U1 << np.uint64(d)
    ud = np.uint64(d)
    g = _U0
    if ties:
        seen = 0
        for j in range(f):
            if seen >= quota and j > last_lt:
                break
            base = np.uint64(nodes[j]) << ud
            for t in range(span):
                c = base + np.uint64(t)
                v = np.float64(keys[c])
                lt = v < bkey
                keep = lt | ((v == bkey) & (seen < quota))
                out_nodes[g] = c
                out_vals[g] = v
                seen += keep ^ lt
                g += _U1 if keep else _U0
    else:
        n_lt = 0
        for j in range(f):
            base = np.uint64(nodes[j]) << ud
            for t in range(span):
                c = base + np.uint64(t)
                v = np.float64(keys[c])
                out_nodes[g] = c
                out_vals[g] = v
                n_lt += v < bkey
                g += _U1 if v <= bkey else _U0
        return np.int64(g), n_lt, np.int64(g) - 1  # the last index: an upper bound is enough
    kept = np.int64(g)
    n_lt, last = _count_below(out_vals, kept, bkey)
    return kept, n_lt, last


@njit(cache=True, nogil=True)
def _cut(nodes, vals, f, k, cap, bkey, scratch):
    """Cheap version of _tighten for a frontier much larger than k (f >= 2k): a new bkey from a sample, at about
    the _CUT_SLACK * k-th smallest min, accepted if k to cap minima are <= it (k nodes each hold a leaf <= it).
    Returns (kept, bkey), or (0, bkey) if the sample missed (the caller then runs _tighten)."""
    s = min(f, 256)
    step = f // s
    for i in range(s):
        scratch[i] = vals[i * step]
    r = min(int(_CUT_SLACK * k * s / f) + 1, s - 1)
    t = _quickselect(scratch, s, r)
    if not t < bkey:
        return 0, bkey
    c = 0
    for j in range(f):
        c += vals[j] <= t
    if c < k or c > cap:
        return 0, bkey
    kept = 0
    for j in range(f):
        v = vals[j]
        nodes[kept] = nodes[j]
        vals[kept] = v
        kept += v <= t
    return kept, t


@njit(cache=True, nogil=True)
def _tighten(nodes, vals, f, k, width, shift, bkey, scratch, band):
    """Cut the frontier (nodes[:f] in slot order, their minima vals[:f] all <= bkey, f > k) down to the nodes <=
    the k-th smallest (min, rightmost slot), B: each of those k nodes holds a leaf <= B. At most k remain.
    Returns (f, bkey, how many kept minima are < bkey, index of the last of them)."""
    c_lt = 0
    for j in range(f):
        c_lt += vals[j] < bkey
    if c_lt >= k:  # the k-th smallest min lies strictly below bkey: select it
        c = 0
        for j in range(f):
            v = vals[j]
            scratch[c] = v
            c += v < bkey
        bkey = _kth_smallest(scratch, c_lt, k - 1, band)
        c_lt = 0
        for j in range(f):
            c_lt += vals[j] < bkey
    # else bkey is still the k-th smallest min (ties): only the slot can cut.
    need = k - c_lt  # B is (bkey, rightmost slot of the need-th node whose min is bkey)
    bslot = np.int64(0)
    for j in range(f):
        if vals[j] == bkey:
            need -= 1
            if need == 0:
                bslot = ((nodes[j] - width + 1) << shift) - 1
                break
    kept = 0
    for j in range(f):
        v = vals[j]
        nodes[kept] = nodes[j]
        vals[kept] = v
        kept += (v < bkey) | ((v == bkey) & (((nodes[j] - width) << shift) <= bslot))
    c_lt, last = _count_below(vals, kept, bkey)
    return kept, bkey, c_lt, last


@njit(cache=True, nogil=True)
def _shrink(nodes, vals, f, k, cap, width, shift, bkey, scratch, band):
    """Cut the frontier back to at most cap nodes (about k): _cut if it is large and the sample works, else
    _tighten (at most k)."""
    if f >= 2 * k:
        kept, t = _cut(nodes, vals, f, k, cap, bkey, scratch)
        if kept > 0:
            n_lt, last = _count_below(vals, kept, t)
            return kept, t, n_lt, last
    return _tighten(nodes, vals, f, k, width, shift, bkey, scratch, band)


@njit(cache=True, nogil=True)
def _bit_bucket_counts(va, lo, hi, counts, bidx):
    """Bucket va[lo:hi] by the top bits of order-preserving integer images of the floats (piecewise linear in
    log2 of the value): fill bidx and counts, return the bucket count. The smallest and the largest value land
    in different buckets, so every pass makes progress."""
    bits = va.view(np.int64)
    mn = np.int64(0x7FFFFFFFFFFFFFFF)
    mx = -mn - 1
    for i in range(lo, hi):
        x = va[i]
        b = bits[i]
        if x == 0.0:
            b = 0  # -0.0 ties with 0.0 by value: same image
        elif b < 0:
            b ^= 0x7FFFFFFFFFFFFFFF  # negative floats: reverse their order, stay negative
        bidx[i] = b
        mn = min(mn, b)
        mx = max(mx, b)
    span = mx - mn  # wraps past 2**63 for keys of both signs: then read as unsigned, 64 bits
    width = 64
    if span >= 0:
        width = 0
        while width < 63 and (span >> width) != 0:
            width += 1
    lb = 0
    while (np.int64(2) << lb) <= hi - lo:
        lb += 1
    nb = np.int64(1) << lb  # (hi - lo) / 2 .. hi - lo buckets
    s = max(width - lb, 0)
    counts[:nb] = 0
    for i in range(lo, hi):
        b = ((bidx[i] - mn) >> s) & (nb - 1)  # the span's top lb bits
        bidx[i] = b
        counts[b] += 1
    return nb


@njit(cache=True, nogil=True)
def _bucket_pass(va, sa, lo, hi, vb, sb, counts, bidx, k, copy_back):
    """Spread va[lo:hi] (slots sa alongside) stably over ~hi - lo buckets by linear position in [min, max], into
    vb, sb (and back into va, sa with copy_back). Leaves counts[b] = end of bucket b (relative to lo) and returns
    (buckets, largest bucket, end of the bucket holding position k - 1); (0, ...) if the range holds one value
    (already in order), (-1, ...) if it cannot be split (the span is beyond float precision)."""
    n = hi - lo
    m0 = m1 = x0 = x1 = va[lo]
    i = lo + 1
    while i + 1 < hi:  # two independent chains: latency, not throughput, bounds a min/max loop
        a, b = va[i], va[i + 1]
        m0 = a if a < m0 else m0
        x0 = a if a > x0 else x0
        m1 = b if b < m1 else m1
        x1 = b if b > x1 else x1
        i += 2
    if i < hi:
        a = va[i]
        m0 = a if a < m0 else m0
        x0 = a if a > x0 else x0
    mn = min(m0, m1)
    mx = max(x0, x1)
    if mn == mx:
        return 0, n, hi
    nb = max(n // 2, 2)  # ~2 values a bucket: fewer buckets to count, few moves left for the insertion sort
    half_mn = mn * 0.5
    scale = (nb - 1) / (mx * 0.5 - half_mn)  # halves: the span of finite floats cannot overflow
    if not (scale > 0.0 and scale < np.inf):  # a subnormal span, or a -inf key
        return -1, n, hi
    counts[:nb] = 0
    for i in range(lo, hi):
        b = np.int64((va[i] * 0.5 - half_mn) * scale)  # monotone in the value: equal keys share a bucket
        bidx[i] = b
        counts[b] += 1
    largest = 0
    for b in range(nb):
        largest = max(largest, counts[b])
    if largest > n // 2:  # keys spread over orders of magnitude: bucket by float bits (exponent first) instead
        nb = _bit_bucket_counts(va, lo, hi, counts, bidx)
    acc = 0
    largest = 0
    end_k = hi
    for b in range(nb):  # exclusive prefix sums, the largest bucket, and the bucket that holds position k - 1
        c = counts[b]
        counts[b] = acc
        largest = max(largest, c)
        if acc < k - lo <= acc + c:
            end_k = lo + acc + c
        acc += c
    for i in range(lo, hi):
        b = bidx[i]
        p = lo + counts[b]
        counts[b] += 1
        vb[p] = va[i]
        sb[p] = sa[i]
    if copy_back:
        va[lo:hi] = vb[lo:hi]
        sa[lo:hi] = sb[lo:hi]
    return nb, largest, end_k


@njit(cache=True, nogil=True)
def _sort_head(va, sa, n, k, out, vb, iw):
    """Write to out the first k of sa[:n] stably sorted by va[:n] (sa ascends, so ties stay in slot order); va and
    sa are reordered. A bucket pass puts every value in a bucket of its own or a few (keys of a smooth spread); a
    bucket still larger than _SMALL that reaches into the first k gets a pass of its own; one insertion sort then
    finishes inside the buckets. A range of one value is already in order (ties are free).
    vb: float64 scratch of n; iw: int64 scratch of 5n + 8. Geometric keys (1, 1/2, 1/4, ...) would peel off
    a few values a pass: after _MAX_PASSES passes a range is merge sorted instead, so the worst case is
    O(n log n)."""
    sb, counts, bidx, stack = iw[:n], iw[n:2 * n], iw[2 * n:3 * n], iw[3 * n:]
    limit = n  # everything at or past limit is >= everything before it
    top = 0
    if n > _SMALL:
        stack[0], stack[1], stack[2] = 0, n, 0
        top = 3
    while top > 0:  # pending ranges (lo, hi, passes so far) are disjoint and longer than _SMALL
        top -= 3
        lo, hi, depth = stack[top], stack[top + 1], stack[top + 2]
        whole = hi - lo == n  # the first range: spread into vb, sb and swap instead of copying back
        nb = -1
        largest = end_k = 0
        if depth < _MAX_PASSES:
            nb, largest, end_k = _bucket_pass(va, sa, lo, hi, vb, sb, counts, bidx, k, not whole)
        if nb < 0:  # cannot split by value, or keys spread over many orders of magnitude: stable merge sort
            order = np.argsort(va[lo:hi], kind="mergesort")
            vb[lo:hi] = va[lo:hi][order]
            sb[lo:hi] = sa[lo:hi][order]
            va[lo:hi] = vb[lo:hi]
            sa[lo:hi] = sb[lo:hi]
            continue
        if nb == 0:
            continue
        if whole:
            va, vb = vb, va
            sa, sb = sb, sa
        if lo < k <= hi:
            limit = min(limit, end_k)
        if largest <= _SMALL:
            continue
        start = lo
        for b in range(nb):
            end = lo + counts[b]
            if start >= k:
                break
            if end - start > _SMALL:
                stack[top], stack[top + 1], stack[top + 2] = start, end, depth + 1
                top += 3
            start = end
    for i in range(1, limit):  # stable insertion sort; moves stay inside buckets
        v = va[i]
        s_ = sa[i]
        j = i - 1
        while j >= 0 and va[j] > v:
            va[j + 1] = va[j]
            sa[j + 1] = sa[j]
            j -= 1
        va[j + 1] = v
        sa[j + 1] = s_
    out[:k] = sa[:k]


@njit(cache=True, nogil=True)
def select_min_keys(keys, n_leaves, k):
    """The k slots with the smallest finite keys, sorted by (key, slot); `keys` is not modified.

    `keys` (float64 or float32, length 2 * n_leaves, n_leaves a power of two; may be a strided view, such as a
    column of a 2-D array) is a min tree as in `sumtree`. The caller guarantees at least k finite leaves
    (ValueError otherwise). Keys must not be NaN; -inf, if present, counts as the smallest key.
    """
    if k <= 0:
        return np.empty(0, np.int64)
    log_n = 0
    while (np.int64(1) << log_n) < n_leaves:
        log_n += 1
    # Start on the level of ~_START * k nodes (~2k if fewer than 3 levels would lie below it: a shallow tree has
    # few levels to repay a tighter start; the whole leaf level for small trees).
    start = _START if (np.int64(_START * k) << 3) <= n_leaves else 2
    depth = 0
    while (np.int64(1) << depth) < start * k and depth < log_n:
        depth += 1
    width = np.int64(1) << depth
    cap = _CAP * k
    size = max(width, cap << _JUMP) + 2
    iw = np.empty(2 * size + 5 * cap + 8, np.int64)  # frontier x2, then the sort's scratch
    fw = np.empty(5 * size + 256, np.float64)
    nodes, nodes2 = iw[:size], iw[size:2 * size]
    vals, vals2, scratch, band = fw[:size], fw[size:2 * size], fw[2 * size:3 * size], fw[3 * size:]

    # Start level: its minima are the contiguous keys[width:2 * width]; bkey = their k-th smallest (or, with k
    # or fewer finite ones, the largest finite float, which keeps exactly the finite nodes).
    bkey = _MAX_FINITE
    n_lt = 0
    n_eq = 0
    for j in range(width):
        v = np.float64(keys[width + j])
        scratch[j] = v
        n_lt += v < bkey
        n_eq += v == bkey
    if n_lt + n_eq > k:
        bkey = _kth_smallest(scratch, width, k - 1, band)
        n_lt = 0
        n_eq = 0
        for j in range(width):
            v = scratch[j]
            n_lt += v < bkey
            n_eq += v == bkey

    # Invariant: at least k leaves are <= bkey (or tie with it at a low enough slot), and the frontier holds
    # every node that may contain one. n_lt nodes below bkey vouch for n_lt leaves below it, so only the first
    # k - n_lt nodes at bkey are needed; that serial count is only paid when ties are present.
    nodes[0] = 1
    f, n_lt, last_lt = _descend(keys, nodes, 1, depth, bkey, k - n_lt, n_eq > 1, 0, nodes2, vals2)
    nodes, nodes2 = nodes2, nodes
    vals, vals2 = vals2, vals
    shift = log_n - depth  # levels below the frontier
    while shift > 0:
        if f > cap:  # many small keys side by side: cut back to ~k
            f, bkey, n_lt, last_lt = _shrink(nodes, vals, f, k, cap, width, shift, bkey, scratch, band)
        d = min(shift, _JUMP)
        shift -= d
        width <<= d
        f, n_lt, last_lt = _descend(keys, nodes, f, d, bkey, k - n_lt, f - n_lt > 1, last_lt, nodes2, vals2)
        nodes, nodes2 = nodes2, nodes
        vals, vals2 = vals2, vals
    if f > cap:
        f, bkey, n_lt, last_lt = _shrink(nodes, vals, f, k, cap, width, shift, bkey, scratch, band)

    # Leaf level: f >= k candidate leaves in slot order (fewer only if the caller's guarantee was broken).
    if f < k:
        raise ValueError("select_min_keys: fewer than k finite keys")
    for j in range(f):
        nodes[j] -= n_leaves
    out = np.empty(k, np.int64)
    _sort_head(vals, nodes, f, k, out, scratch, iw[2 * size:])
    return out
