"""Paired before/after timing of one buffer step (N, K=128: add K x 128 tokens, sample K, update K): two copies
of the package imported side by side in one process, their steps interleaved, so machine load hits both alike.

Set-up: copy an old checkout's `replayloader/` to DIR/replayloader_before and this one's to DIR/replayloader_after,
then `PYTHONPATH=DIR python -m bench.paired_before_after VARIANT [x|-] [N]` (`x`: the old copy also gets ``loss=``
beside its own keyword, as the pretraining loop sent it before the redesign; `-`: both get their own keyword
only). Prints median µs of each and the median of the per-pair ratios after/before with its interquartile range.
`paired_tree_before_after.py` does the same for the `SumTree` operations of `bench_sumtree.py`.
"""
import sys, time, gc, numpy as np
import replayloader_before as B, replayloader_after as A
name, extra = sys.argv[1], len(sys.argv) > 2 and sys.argv[2] != "-"
key = {"loss_diff": "loss", "grad_norm": "grad_norm", "grad_bound": "grad_bound", "loss": "loss", "per": "weight"}[name]
n, k = int(float(sys.argv[3])) if len(sys.argv) > 3 else 1000, 128
def make(mod):
    rng = np.random.default_rng(0)
    strategy = mod.strategies.by_name(name)
    buf = mod.ReplayBuffer(n, alpha=1.0, beta=0.4, strategy=strategy, seed=0)
    toks = [{"input_ids": rng.integers(0, 4096, (k, 128), dtype=np.int64)} for _ in range(8)]
    sig = [rng.uniform(0.01, 1.0, k) for _ in range(8)]
    while len(buf) < n: buf.add(toks[0])
    def step(r, old):
        buf.add(toks[r % 8]); s = buf.sample(k)
        fb = {key: sig[r % 8]}
        if old and extra and key != "loss": fb["loss"] = sig[(r + 1) % 8]
        buf.feedback(s.ids, **fb)
    return step
sb, sa = make(B), make(A)
for r in range(50): sb(r, True); sa(r, False)
tb, ta = [], []
gc.disable()
for r in range(4000):
    t0 = time.perf_counter(); sb(r, True); t1 = time.perf_counter(); sa(r, False); t2 = time.perf_counter()
    tb.append(t1 - t0); ta.append(t2 - t1)
tb, ta = np.array(tb) * 1e6, np.array(ta) * 1e6
print(f"{name} N={n}{' (old: loss= too)' if extra else ''}: before {np.median(tb):.1f} µs, after {np.median(ta):.1f} µs, "
      f"median ratio after/before {np.median(ta / tb):.3f} (IQR {np.percentile(ta/tb, 25):.3f}-{np.percentile(ta/tb, 75):.3f})")
