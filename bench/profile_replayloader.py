#!/usr/bin/env python
"""Where replayloader's time goes: public calls vs the work inside them, at the benchmark's grid points.

    python -m bench.profile_replayloader                  # timings + line profiles (needs line_profiler)
    python -m bench.profile_replayloader --no-lines       # timings only

1. Floors: a Numba call with 1 / 4 / 8 array arguments doing nothing, a K-row gather / scatter of 128 int64
   tokens, `Generator.random(K)`.
2. Tree: median µs of `SumTree.set / sample / replace_min` (public) and, with line_profiler, their per-line times
   (glue vs kernel calls).
3. Buffer: median µs of `add`, `sample`, `update` separately, and per-line times of each.
Only the public API is required; line profiles cover whatever the methods call at the time of the run.
"""
from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import time  # noqa: E402

import replayloader  # noqa: E402  (installed, or this checkout: run as python -m bench.profile_replayloader)

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402
from replayloader import ReplayBuffer
from replayloader.sumtree import SumTree
from replayloader.strategies import FIFO, EvictLowest, MaxWeight, MeanWeight, SetWeight, Strategy  # noqa: E402

try:
    from line_profiler import LineProfiler
except ImportError:
    LineProfiler = None


def median_us(f, reps=2000, warm=5):
    for _ in range(warm):
        f()
    ts = []
    gc.disable()
    try:
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            f()
            ts.append(time.perf_counter_ns() - t0)
    finally:
        gc.enable()
    return float(np.median(ts)) / 1e3


@njit(cache=True)
def _noop1(a):
    return 0


@njit(cache=True)
def _noop4(a, b, c, d):
    return 0


@njit(cache=True)
def _noop8(a, b, c, d, e, f, g, h):
    return 0


def floors(grid):
    a = np.zeros(4)
    print("## Floors (median µs)\n")
    print(f"- Numba call, no work: 1 array arg {median_us(lambda: _noop1(a)):.2f}, 4 args "
          f"{median_us(lambda: _noop4(a, a, a, a)):.2f}, 8 args {median_us(lambda: _noop8(a, a, a, a, a, a, a, a)):.2f}")
    rng = np.random.default_rng(0)
    print(f"- `rng.random(128)` {median_us(lambda: rng.random(128)):.2f}, `rng.random(1024)` "
          f"{median_us(lambda: rng.random(1024)):.2f}")
    for n, k in grid:
        tokens = rng.integers(0, 30522, (n, 128), dtype=np.int64)
        slots = [rng.integers(0, n, k) for _ in range(64)]
        batch = rng.integers(0, 30522, (k, 128), dtype=np.int64)
        it = iter(range(10**9))
        g = median_us(lambda: tokens[slots[next(it) % 64]], reps=500)
        out = np.empty((k, 128), np.int64)
        g2 = median_us(lambda: np.take(tokens, slots[next(it) % 64], axis=0, out=out), reps=500)

        def scatter():
            tokens[slots[next(it) % 64]] = batch
        s = median_us(scatter, reps=500)
        print(f"- N={n:,} K={k}: gather K rows `x[slots]` {g:.1f}, `np.take(..., out=)` {g2:.1f}, "
              f"scatter K rows {s:.1f}")
        del tokens
    print()


def tree_times(grid, dtype):
    print(f"## SumTree {np.dtype(dtype).name}: public calls (median µs)\n")
    print("| N | K | set(K) | sample(K) | replace_min(K, mean) | step = replace_min+sample+set |")
    print("|---|---|---|---|---|---|")
    for n, k in grid:
        rng = np.random.default_rng(0)
        t = SumTree(n, dtype)
        t.set(np.arange(n), rng.uniform(0.01, 1, n))
        sl = [rng.integers(0, n, k) for _ in range(64)]
        pr = [rng.uniform(0.01, 1, k).astype(dtype) for _ in range(64)]
        un = [rng.random(k) for _ in range(64)]
        it = iter(range(10**9))
        a = median_us(lambda: t.set(sl[next(it) % 64], pr[next(it) % 64]))
        b = median_us(lambda: t.sample(un[next(it) % 64]))
        c = median_us(lambda: t.replace_min(k, t.total / n), reps=500) if k <= n else float("nan")

        def step():
            i = next(it) % 64
            t.replace_min(k, t.total / n)
            t.set(t.sample(un[i]), pr[i])
        d = median_us(step, reps=500) if k <= n else float("nan")
        print(f"| {n:,} | {k} | {a:.1f} | {b:.1f} | {c:.1f} | {d:.1f} |")
    print()


def make_buffer(n, rng):
    buf = ReplayBuffer(n, alpha=1.0, beta=0.4, strategy=Strategy(MeanWeight(), SetWeight(), EvictLowest()), seed=0)
    chunk = rng.integers(0, 30522, (min(n, 65536), 128), dtype=np.int64)
    ids = [buf.add({"tokens": chunk[: min(n, s + 65536) - s].copy()}) for s in range(0, n, 65536)]
    buf.feedback(np.concatenate(ids), weight=rng.uniform(0.01, 1, n))
    return buf


def filled_buffer(n, k):
    """A full buffer of N, 8 batches of K x 128 tokens to add and 64 priority vectors to feed back."""
    rng = np.random.default_rng(0)
    buf = make_buffer(n, rng)
    toks = [{"tokens": rng.integers(0, 30522, (k, 128), dtype=np.int64)} for _ in range(8)]
    return buf, toks, [rng.uniform(0.01, 1, k) for _ in range(64)]


def buffer_times(grid):
    print("## ReplayBuffer (mean init, SetWeight, evict lowest, beta=0.4): parts of one step (median µs)\n")
    print("| N | K | add | sample | update | whole step |")
    print("|---|---|---|---|---|---|")
    for n, k in grid:
        if k > n:
            continue
        buf, toks, pr = filled_buffer(n, k)
        it = iter(range(10**9))
        reps = 2000 if n * k < 10**8 else 300
        a = median_us(lambda: buf.add(toks[next(it) % 8]), reps=reps)
        s = buf.sample(k)
        b = median_us(lambda: buf.sample(k), reps=reps)
        c = median_us(lambda: buf.feedback(s.ids, weight=pr[next(it) % 64]), reps=reps)

        def step():
            i = next(it)
            buf.add(toks[i % 8])
            x = buf.sample(k)
            buf.feedback(x.ids, weight=pr[i % 64])
        d = median_us(step, reps=reps)
        print(f"| {n:,} | {k} | {a:.1f} | {b:.1f} | {c:.1f} | {d:.1f} |")
        del buf
        gc.collect()
    print()


def step_floors(n, k):
    """One whole-buffer step three ways: the public API; the buffer's own kernels called directly (no argument
    checks or Python bookkeeping) with the data copies; the kernels alone. The gaps say where the time goes.

    Reaches into the buffer's internals (`replayloader.kernels.buffer`): a profiling aid, not an API.
    """
    from replayloader.kernels import buffer as K

    rng = np.random.default_rng(0)
    rows = []
    for label, strategy in (("mean init, evict lowest", Strategy(MeanWeight(), SetWeight(), EvictLowest())),
                            ("max init, FIFO", Strategy(MaxWeight(), SetWeight(), FIFO()))):
        buf = ReplayBuffer(n, alpha=1.0, beta=0.4, strategy=strategy, seed=0)
        ids = buf.add({"tokens": rng.integers(0, 30522, (n, 128), dtype=np.int64)})
        buf.feedback(ids, weight=rng.uniform(0.01, 1, n))
        toks = {"tokens": rng.integers(0, 30522, (k, 128), dtype=np.int64)}
        pr = rng.uniform(0.01, 1, k)
        tree, store, no_f = buf.tree, buf.storage.fields["tokens"], np.empty(0)
        evict = buf.strategy.evict
        state = {"serial": buf.next_serial, "calls": buf.counters["add_calls"], "epoch": 10**6}

        def kernels(with_data):
            victims = evict.choose(tree, k)
            slots, _ = K.place(n, n, k, victims)
            if with_data:
                store[slots] = toks["tokens"]
            evict.commit(tree, victims)
            K.commit_add(tree.nodes, tree.layout, buf.meta, buf.weights, slots, no_f, buf.mean_weight(), 1.0,
                         state["serial"], state["calls"], no_f)
            state["serial"] += k
            state["calls"] += 1
            sl, sampled_ids, *_ = K.draw_sample(tree.nodes, tree.layout, buf.meta, buf.rng_state, k, True, n, 0.4,
                                                state["calls"] - 1)
            if with_data:
                store.take(sl, axis=0)
            state["epoch"] += 1
            _, _, slots, values, *_ = K.resolve_ids(sampled_ids, pr, buf.max_weight, buf.meta, state["serial"],
                                                    state["epoch"], True)
            K.write_weights(tree.nodes, tree.layout, buf.weights, slots, values, 1.0)

        reps = 3000 if n * k < 10**8 else 300
        raw_data = median_us(lambda: kernels(True), reps=reps)
        raw = median_us(lambda: kernels(False), reps=reps)
        buf.next_serial, buf.counters["add_calls"] = state["serial"], state["calls"]

        def public():
            buf.add(toks)
            buf.feedback(buf.sample(k).ids, weight=pr)
        rows.append((label, median_us(public, reps=reps), raw_data, raw))
        del buf, store
        gc.collect()
    print(f"## Whole-buffer step N={n:,} K={k}: where the time goes (median µs)\n")
    print("| strategy | public API | kernels + data copies | kernels only |")
    print("|---|---|---|---|")
    for label, a, b, c in rows:
        print(f"| {label} | {a:.1f} | {b:.1f} | {c:.1f} |")
    print()


def _functions_of(obj_or_cls, names):
    out = []
    for name in names:
        f = getattr(obj_or_cls, name, None)
        f = getattr(f, "fget", f)  # properties
        if f is not None and hasattr(f, "__code__"):
            out.append(f)
    return out


def line_profiles(grid, reps):
    if LineProfiler is None:
        print("(line_profiler not installed: `pip install line_profiler` for per-line times)\n")
        return
    import replayloader.buffer.replay_buffer as B
    import replayloader.buffer.storage as S
    for n, k in grid:
        if k > n:
            continue
        buf, toks, pr = filled_buffer(n, k)
        lp = LineProfiler()
        funcs = (_functions_of(B.ReplayBuffer, ["add", "sample", "feedback", "_update_in_kernel", "_after_update",
                                                 "_set_weights", "mean_weight"])
                 + _functions_of(SumTree, ["set", "sample", "replace_min", "get", "total", "min_priority"])
                 + _functions_of(S.Storage, ["check_batch", "write", "gather"])
                 + _functions_of(type(buf.strategy.evict), ["choose"])
                 + _functions_of(type(buf.strategy.init), ["initial_weights"])
                 + _functions_of(type(buf.strategy.update), ["values", "compute", "on_add"]))
        for f in funcs:
            lp.add_function(f)
        for i in range(5):
            buf.add(toks[i % 8])
            buf.feedback(buf.sample(k).ids, weight=pr[i % 64])
        lp.enable_by_count()
        for i in range(reps):
            buf.add(toks[i % 8])
            x = buf.sample(k)
            buf.feedback(x.ids, weight=pr[i % 64])
        lp.disable_by_count()
        stream = io.StringIO()
        try:
            lp.print_stats(stream=stream, output_unit=1e-6, stripzeros=True)
        except Exception as exc:  # e.g. a source file edited since import: its lines cannot be shown
            stream.write(f"(could not print the line profile: {type(exc).__name__}: {exc})")
        print(f"## Line profile, N={n:,} K={k}, {reps} steps (µs; line_profiler adds ≈0.1 µs a line)\n")
        print("```")
        print(stream.getvalue())
        print("```\n")
        del buf
        gc.collect()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-lines", action="store_true")
    ap.add_argument("--reps", type=int, default=300, help="steps under the line profiler")
    args = ap.parse_args()
    grid = [(1000, 128), (100000, 1024), (1000000, 128), (1000000, 1024)]
    print(f"# replayloader profile (replayloader {replayloader.__version__}, {replayloader.__file__})\n")
    floors([(1000, 128), (1000000, 1024)])
    tree_times(grid, np.float64)
    tree_times(grid, np.float32)
    buffer_times([(1000, 128), (1000000, 1024)])
    step_floors(1000, 128)
    step_floors(1000000, 1024)
    if not args.no_lines:
        line_profiles([(1000, 128), (1000000, 1024)], args.reps)


if __name__ == "__main__":
    main()
