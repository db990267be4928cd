#!/usr/bin/env python
"""The wide-node descent that issue 41 suggested, measured against the binary `descend` (a negative result).

    python -m bench.wide_descent                   # N = 1e4, 1e5, 1e6, 1e7; K = 128, 1024
    python -m bench.wide_descent --sizes 1e6 --ks 128

In the binary heap the four grandchildren of node i are rows 4i..4i+3, one 64-byte line when a row takes at
most 16 bytes (sum + min priority in float64, or float32). `descend_wide` below goes down two levels a step from
those four rows: the children's masses are recomputed as c0 + c1 and c2 + c3 in the tree's dtype, the very sums
the tree stores, so it returns exactly `descend`'s leaves (checked here). Above the first level whose nodes
take `wide_from` bytes it steps one level at a time (those levels sit in cache, where the binary step's fewer
operations win). It touches one line per two levels instead of two.

Timing: two trees with the same content (one per kernel, so neither warms the other's lines), the same targets,
each repetition calls both in alternating order; printed: the binary median µs and the median of the
per-repetition ratios wide / binary, for several `wide_from`. On the 2-core EPYC of results/bench_sumtree/bench_sumtree_wide.md
the ratios were 0.95-1.11: the K descents already go down together level by level, so their misses overlap and
the line count is not what bounds them. The kernel therefore stays out of the library.
"""
from __future__ import annotations

import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from replayloader.kernels.tree import descend  # noqa: E402
from replayloader.sumtree import SumTree  # noqa: E402


@njit(cache=True, nogil=True)
def descend_wide(nodes, n_leaves, targets, wide_from):
    """`descend`, leaf for leaf: one level a step until the level read has `wide_from` nodes, then two."""
    k = targets.shape[0]
    at = np.ones(k, np.int64)
    u = targets.copy()
    depth = 0
    while (np.int64(1) << depth) < n_leaves:
        depth += 1
    level = 0
    while level < depth and ((np.int64(2) << level) < wide_from or (depth - level) % 2 == 1):
        for j in range(k):
            left = 2 * at[j]
            mass_left = nodes[left, 0]
            go_right = ((u[j] >= mass_left) | (mass_left <= 0.0)) & (nodes[left + 1, 0] > 0.0)
            u[j] -= mass_left * go_right
            at[j] = left + go_right
        level += 1
    while level < depth:
        for j in range(k):
            b = 4 * at[j]
            c0, c1, c2, c3 = nodes[b, 0], nodes[b + 1, 0], nodes[b + 2, 0], nodes[b + 3, 0]
            mass_left = c0 + c1  # = nodes[2 * at[j], 0]
            mass_right = c2 + c3  # = nodes[2 * at[j] + 1, 0]
            uj = u[j]
            go_right = ((uj >= mass_left) | (mass_left <= 0.0)) & (mass_right > 0.0)
            uj -= mass_left * go_right
            q = b + 2 * go_right
            mass_left = nodes[q, 0]
            go_right = ((uj >= mass_left) | (mass_left <= 0.0)) & (nodes[q + 1, 0] > 0.0)
            u[j] = uj - mass_left * go_right
            at[j] = q + go_right
        level += 2
    return at - n_leaves


def paired(fa, fb, reps):
    for r in range(30):
        fa(r), fb(r)
    ta, tb = np.empty(reps), np.empty(reps)
    gc.disable()
    for r in range(reps):
        first, second = (fa, fb) if r % 2 else (fb, fa)
        t0 = time.perf_counter()
        first(r)
        t1 = time.perf_counter()
        second(r)
        t2 = time.perf_counter()
        (ta[r], tb[r]) = (t1 - t0, t2 - t1) if r % 2 else (t2 - t1, t1 - t0)
    gc.enable()
    return float(np.median(ta)) * 1e6, tb / ta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=lambda s: [int(float(x)) for x in s.split(",")],
                    default=[10_000, 100_000, 1_000_000, 10_000_000])
    ap.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[128, 1024])
    ap.add_argument("--reps", type=int, default=600)
    args = ap.parse_args()
    pool = 64
    print(f"load {os.getloadavg()}")
    for n in args.sizes:
        for dtype, minp in ((np.float64, True), (np.float64, False), (np.float32, True)):
            rng = np.random.default_rng(n)
            trees = [SumTree(n, dtype, min_priority=minp, min_key=False, raw_sum=False) for _ in range(2)]
            for t in trees:
                t.set(np.arange(n), rng.uniform(0.01, 1, n) if t is trees[0] else trees[0].get(np.arange(n)))
            a, b = trees
            row = a.nodes.shape[1] * a.nodes.itemsize
            for k in args.ks:
                targets = [(np.arange(k) + rng.random(k)) * a.total / k for _ in range(pool)]
                cells = []
                for kib in (64, 256, 1024, 4096):
                    wide_from = max(kib * 1024 // row, 2)
                    for t in targets[:4]:
                        assert np.array_equal(descend(a.nodes, a.n_leaves, t),
                                              descend_wide(b.nodes, b.n_leaves, t, wide_from))
                    us, q = paired(lambda r: descend(a.nodes, a.n_leaves, targets[r % pool]),
                                   lambda r: descend_wide(b.nodes, b.n_leaves, targets[r % pool], wide_from),
                                   args.reps)
                    cells.append(f"{kib} KiB: {np.median(q):.2f}")
                print(f"N={n:>8} row={row:>2} B K={k:>4}: binary {us:7.1f} µs; wide/binary by wide_from: "
                      + ", ".join(cells), flush=True)
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
