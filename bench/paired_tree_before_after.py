"""Paired before/after timing of the `SumTree` operations that `bench_sumtree.py` times (update K, sample K, and
the tree step: replace the K lowest at the mean, sample K, set the K sampled), old and new package imported side
by side in one process with their calls interleaved, so machine load hits both alike.

Set-up as in `paired_before_after.py` (DIR/replayloader_before, DIR/replayloader_after), then
`PYTHONPATH=DIR python -m bench.paired_tree_before_after N K`. Prints, per operation, the median µs of each and
the median of the per-pair ratios after/before with its interquartile range.
"""
import sys, time, gc, numpy as np
import replayloader_before as B, replayloader_after as A
n, k = int(float(sys.argv[1])), int(sys.argv[2])


def operations(mod):
    """The three timed operations on a full float64 tree keeping sums, min priorities and eviction keys."""
    rng = np.random.default_rng(0)
    tree = mod.SumTree(n, np.float64, min_priority=True, min_key=True, raw_sum=False)
    tree.set(np.arange(n), rng.uniform(0.01, 1, n))
    slots = [rng.integers(0, n, k) for _ in range(8)]
    priorities = [rng.uniform(0.01, 1, k) for _ in range(8)]
    uniforms = [np.sort(rng.random(k)) for _ in range(8)]

    def step(r):
        tree.replace_min(k, tree.total / n)
        tree.set(tree.sample(uniforms[r % 8], True), priorities[r % 8])
    return {"update": lambda r: tree.set(slots[r % 8], priorities[r % 8]),
            "sample": lambda r: tree.sample(uniforms[r % 8], True), "tree step": step}


before, after = operations(B), operations(A)
for name in before:
    for r in range(50):
        before[name](r), after[name](r)
    tb, ta = np.empty(4000), np.empty(4000)
    gc.disable()
    for r in range(4000):
        t0 = time.perf_counter(); before[name](r); t1 = time.perf_counter(); after[name](r); t2 = time.perf_counter()
        tb[r], ta[r] = t1 - t0, t2 - t1
    gc.enable()
    q = ta / tb
    print(f"{name} N={n} K={k}: before {np.median(tb) * 1e6:.2f} µs, after {np.median(ta) * 1e6:.2f} µs, median ratio "
          f"after/before {np.median(q):.3f} (IQR {np.percentile(q, 25):.3f}-{np.percentile(q, 75):.3f})")
