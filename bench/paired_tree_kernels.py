#!/usr/bin/env python
"""Old vs new sum-tree kernels vs cpprb vs the memory floor, paired call by call in one process (issue 41).

    python -m bench.paired_tree_kernels                       # N = 1e3, 1e5, 1e6, 1e7; K = 128, 1024
    python -m bench.paired_tree_kernels --sizes 1e3,1e6 --ks 128 --reps 300

"old" is `SumTree(kernels="walks")` (the original walk-by-walk ascent) sampled as `SumTree.sample` did before
issue 41 (`to_targets` on a copy, then `descend`: two calls), "new" is `SumTree(kernels="levels")` (the
default: level by level across the batch) and today's `SumTree.sample` (`sample_leaves`: one call). Both hold the same array, bit for bit (checked after every
cell), so the draws are the same too. Each cell builds a separate tree per implementation with the same
content, and every repetition calls every implementation once, in an order that rotates from one repetition to
the next, so machine load and cache state hit all alike. Printed per cell: the median µs of each and the
median (interquartile range) of the per-repetition ratios new / old and new / cpprb.

Operations, as in `bench_sumtree.py`: trees start full, priorities uniform in [0.01, 1], 64 input sets cycled.
* update K: `set` K random slots (a tree keeping sums and the min priority, what a PER sampler keeps);
  cpprb: `PrioritizedReplayBuffer.update_priorities`.
* sample K: K stratified draws, uniforms drawn beforehand; cpprb: `PrioritizedReplayBuffer.sample(K)` (its only
  API; it also gathers one float32 field and computes importance weights).
* tree step: `replace_min(K, mean)` + `sample` + `set` on a tree that also keeps eviction keys (cpprb: FIFO
  only, no such step).
* buffer step (N <= 1e6): `ReplayBuffer` with data (add K x 128 int64 tokens, sample K, feedback K), default
  configuration (mean init, evict lowest), old kernels vs new; cpprb's PRB (FIFO, max init), as in
  bench_sumtree.py.
* floor (sample, update): the same number of random cache-line reads as a descent (dependent, one per level,
  K chains interleaved level by level as `descend` does, each read in a region of the size of that tree level)
  and as an ascent (one read-modify-write per level on each of the K walks, independent); see `_floor_*`.
"""
from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from replayloader import ReplayBuffer  # noqa: E402
from replayloader.kernels.tree import KERNELS, WALKS, descend, to_targets  # noqa: E402
from replayloader.strategies import EvictLowest, MeanWeight, SetWeight, Strategy  # noqa: E402
from replayloader.sumtree import SumTree  # noqa: E402

from bench import peers  # noqa: E402

POOL = 64
TOKENS = 128
VOCAB = 30522


# ---------------------------------------------------------------------------------------------- memory floor
@njit(cache=True, nogil=True)
def _floor_sample(lines, n_leaves, row, seeds):
    """K chains of dependent reads, one per tree level, interleaved level by level like `descend`: on the level
    of width w (rows [w, 2w) of a tree with `row` bytes a row) chain j reads one float64 at a random row whose
    index depends on the value read on the level above. `lines` holds that tree's bytes as float64 (random
    values). The work besides the load is one multiply-add and a mask, so this is the cost of the reads."""
    k = seeds.shape[0]
    per_row = row // 8
    at = seeds.copy()
    acc = 0.0
    width = 1
    while width < n_leaves:
        width <<= 1
        for j in range(k):
            x = lines[(width + (at[j] & (width - 1))) * per_row]
            at[j] = at[j] * 6364136223846793005 + 1442695040888963407 + np.int64(x * 1024.0)
    for j in range(k):
        acc += at[j]
    return acc


@njit(cache=True, nogil=True)
def _floor_update(lines, n_leaves, row, slots):
    """K walks from leaves to root, level by level: one read-modify-write of a float64 in each ancestor's row
    (addresses known ahead, as in an ascent); the levels of at most K nodes are swept whole, as the ascent does."""
    k = slots.shape[0]
    per_row = row // 8
    up = slots + n_leaves
    width = n_leaves
    while width > k:
        for j in range(k):
            i = up[j]
            lines[i * per_row] += 1.0
            up[j] = i >> 1
        width >>= 1
    while width >= 1:
        for i in range(width, 2 * width):
            lines[i * per_row] += 1.0
        width >>= 1


def old_sample(tree, uniforms):
    """`SumTree.sample` as it was before issue 41 (stratified)."""
    total = float(tree.sums[1])
    if not total > 0:
        raise ValueError("cannot sample: the total priority is 0")
    return descend(tree.nodes, tree.n_leaves, to_targets(np.array(uniforms, np.float64), total, True))


# ---------------------------------------------------------------------------------------------- timing
def paired(calls, reps):
    """calls: {name: f(r)}; every repetition calls each once, the order rotating. -> {name: array of seconds}."""
    names = list(calls)
    for r in range(20):
        for name in names:
            calls[name](r)
    out = {name: np.empty(reps) for name in names}
    gc.collect()
    gc.disable()
    try:
        for r in range(reps):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                f = calls[name]
                t0 = time.perf_counter()
                f(r)
                out[name][r] = time.perf_counter() - t0
    finally:
        gc.enable()
    return out


def summary(times, extra_ratio=("new", "cpprb")):
    med = {name: float(np.median(t)) * 1e6 for name, t in times.items()}

    def ratio(a, b):
        q = times[a] / times[b]
        return f"{np.median(q):.2f} ({np.percentile(q, 25):.2f}-{np.percentile(q, 75):.2f})"
    ratios = {"new/old": ratio("new", "old")}
    if extra_ratio[1] in times:
        ratios[f"new/{extra_ratio[1]}"] = ratio(*extra_ratio)
    if "floor" in times:
        ratios["new/floor"] = ratio("new", "floor")
    return med, ratios


def tree_pair(n, priorities, **columns):
    trees = {}
    for name, kernels in (("old", "walks"), ("new", "levels")):
        t = SumTree(n, np.float64, kernels=kernels, **columns)
        t.set(np.arange(n, dtype=np.int64), priorities)
        trees[name] = t
    return trees


def buffer(n, priorities, chunk, old):
    buf = ReplayBuffer(n, alpha=1.0, beta=peers.BETA, strategy=Strategy(MeanWeight(), SetWeight(), EvictLowest()),
                       seed=0)
    if old:
        buf.tree.layout[KERNELS] = WALKS  # the same tree, written by the original kernels
        buf.tree.kernels = "walks"
    ids = [buf.add({"tokens": chunk[: min(n, s + peers.FILL_CHUNK) - s].copy()})
           for s in range(0, n, peers.FILL_CHUNK)]
    buf.feedback(np.concatenate(ids), weight=priorities)
    return buf


def run(sizes, ks, reps, log):
    rows = []
    for n in sizes:
        rng = np.random.default_rng([n, 41])
        priorities = rng.uniform(0.01, 1.0, n)
        small = tree_pair(n, priorities, min_priority=True, min_key=False, raw_sum=False)
        step = tree_pair(n, priorities, min_priority=True, min_key=True, raw_sum=False)
        cp = None if peers.CPPRB_ERROR else peers.CpprbTree(n, priorities)
        n_leaves = small["new"].n_leaves
        floor_s = rng.random(small["new"].nodes.size)  # the sample/update tree's bytes, as float64
        floor_row = small["new"].nodes.shape[1] * 8
        bufs = None
        if n <= 1_000_000:
            chunk = rng.integers(0, VOCAB, (min(n, peers.FILL_CHUNK), TOKENS), dtype=np.int64)
            bufs = {"old": buffer(n, priorities, chunk, True), "new": buffer(n, priorities, chunk, False)}
            if cp is not None:
                bufs["cpprb"] = peers.CpprbBuffer(n, priorities, lambda a, b: chunk[: b - a].copy())
        for k in ks:
            slots = [rng.integers(0, n, k, dtype=np.int64) for _ in range(POOL)]
            new_p = [rng.uniform(0.01, 1.0, k) for _ in range(POOL)]
            new_p32 = [p.astype(np.float32) for p in new_p]
            unif = [rng.random(k) for _ in range(POOL)]
            seeds = [rng.integers(0, 2**62, k, dtype=np.int64) for _ in range(POOL)]
            cells = {
                "update": {"old": lambda r: small["old"].set(slots[r % POOL], new_p[r % POOL]),
                           "new": lambda r: small["new"].set(slots[r % POOL], new_p[r % POOL]),
                           "floor": lambda r: _floor_update(floor_s, n_leaves, floor_row, slots[r % POOL])},
                "sample": {"old": lambda r: old_sample(small["old"], unif[r % POOL]),
                           "new": lambda r: small["new"].sample(unif[r % POOL]),
                           "floor": lambda r: _floor_sample(floor_s, n_leaves, floor_row, seeds[r % POOL])},
            }
            if cp is not None:
                cells["update"]["cpprb"] = lambda r: cp.update(slots[r % POOL], new_p32[r % POOL])
                cells["sample"]["cpprb"] = lambda r: cp.sample(unif[r % POOL])
            if k <= n:
                def tree_step(t, draw):
                    def f(r):
                        t.replace_min(k, t.total / n)
                        t.set(draw(t, unif[r % POOL]), new_p[r % POOL])
                    return f
                cells["tree step"] = {"old": tree_step(step["old"], old_sample),
                                      "new": tree_step(step["new"], SumTree.sample)}
                if bufs is not None:
                    tokens = [rng.integers(0, VOCAB, (k, TOKENS), dtype=np.int64) for _ in range(8)]

                    def buf_step(b):
                        def f(r):
                            b.add({"tokens": tokens[r % 8]})
                            s = b.sample(k)
                            b.feedback(s.ids, weight=new_p[r % POOL])
                        return f
                    cells["buffer step"] = {"old": buf_step(bufs["old"]), "new": buf_step(bufs["new"])}
                    if "cpprb" in bufs:
                        cells["buffer step"]["cpprb"] = lambda r: bufs["cpprb"].step(tokens[r % 8], new_p32[r % POOL])
            for op, calls in cells.items():
                t0 = time.perf_counter()
                times = paired(calls, reps if op != "buffer step" else max(reps // 3, 30))
                med, ratios = summary(times)
                rows.append((op, n, k, med, ratios))
                log(f"{op:>11} N={n:>8} K={k:>4}: " + ", ".join(f"{nm} {v:.2f}" for nm, v in med.items())
                    + " µs; " + ", ".join(f"{nm} {v}" for nm, v in ratios.items())
                    + f"  [{time.perf_counter() - t0:.1f}s, load {os.getloadavg()[0]:.1f}]")
            for pair in (small, step):
                assert np.array_equal(pair["old"].nodes, pair["new"].nodes), "old and new trees differ"
                assert np.array_equal(old_sample(pair["old"], unif[0]), pair["new"].sample(unif[0]))
            if bufs is not None:
                assert np.array_equal(bufs["old"].tree.nodes, bufs["new"].tree.nodes), "old and new buffers differ"
        del small, step, cp, bufs, floor_s
        gc.collect()
    return rows


def table(rows):
    out = ["| op | N | K | old µs | new µs | cpprb µs | floor µs | new/old (IQR) | new/cpprb (IQR) | new/floor (IQR) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for op, n, k, med, ratios in rows:
        def f(x):
            return "—" if x is None else (f"{x:.2f}" if x < 100 else f"{x:,.0f}")
        out.append(f"| {op} | {n:,} | {k} | {f(med.get('old'))} | {f(med.get('new'))} | {f(med.get('cpprb'))} | "
                   f"{f(med.get('floor'))} | {ratios['new/old']} | {ratios.get('new/cpprb', '—')} | "
                   f"{ratios.get('new/floor', '—')} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=lambda s: [int(float(x)) for x in s.split(",")],
                    default=[1000, 100000, 1000000, 10000000])
    ap.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[128, 1024])
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args(argv)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    head = subprocess.run(["git", "-C", os.path.dirname(HERE), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    from importlib.metadata import version
    meta = (f"python {platform.python_version()}, numpy {np.__version__}, numba {numba.__version__}, "
            f"cpprb {version('cpprb') if peers.CPPRB_ERROR is None else 'n/a'}, git {head}; "
            f"{os.cpu_count()} CPUs; load before {os.getloadavg()}")
    log(meta)
    t0 = time.perf_counter()
    rows = run(args.sizes, args.ks, args.reps, log)
    text = (f"Command: `python {' '.join(sys.argv)}`\n\n{meta}; load after {os.getloadavg()}; "
            f"{time.perf_counter() - t0:.0f} s\n\n{table(rows)}\n")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
