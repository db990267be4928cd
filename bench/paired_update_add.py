"""Paired before/after timing of `ReplayBuffer.add`, `ReplayBuffer.feedback(loss=)` and
`PrioritizedSampler.feedback(loss=)` alone (the calls whose feedback validation, eviction hook or w^alpha a change
touched): two copies of the package imported side by side in one
process, their calls interleaved, so machine load hits both alike.

Set-up: copy an old checkout's `replayloader/` to DIR/replayloader_before and this one's to DIR/replayloader_after,
then `OMP_NUM_THREADS=1 PYTHONPATH=DIR python -m bench.paired_update_add [N] [REPS]`. The buffer is the paper's
(`loss_diff`: mean init, loss difference, evict lowest), full, K = 128 examples of 128 tokens per call; the
sampler has N indices, batches of K, alpha 0.6, past its warm-up, default `LossValue`. Prints the
median µs of each call for each copy and the median of the per-pair ratios after/before with its interquartile
range.
"""
import gc
import sys
import time

import numpy as np
import replayloader_after as A
import replayloader_before as B

n = int(float(sys.argv[1])) if len(sys.argv) > 1 else 1000
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
k = 128


def make(mod):
    rng = np.random.default_rng(0)
    buf = mod.ReplayBuffer(n, alpha=1.0, beta=0.4, strategy=mod.strategies.by_name("loss_diff"), seed=0)
    toks = [{"input_ids": rng.integers(0, 4096, (k, 128), dtype=np.int64)} for _ in range(8)]
    losses = [rng.uniform(0.01, 1.0, k) for _ in range(8)]
    while len(buf) < n:
        buf.add(toks[0])
    ids = []

    def update(r):
        if not ids:  # sampled after the add phase, so the ids are live (not skipped as stale)
            ids.extend(buf.sample(k).ids for _ in range(8))
        buf.feedback(ids[r % 8], loss=losses[r % 8])

    return (lambda r: buf.add(toks[r % 8])), update


def paired(before, after):
    for r in range(50):
        before(r), after(r)
    tb, ta = np.empty(reps), np.empty(reps)
    gc.disable()
    for r in range(reps):
        t0 = time.perf_counter(); before(r); t1 = time.perf_counter(); after(r); t2 = time.perf_counter()
        tb[r], ta[r] = t1 - t0, t2 - t1
    gc.enable()
    return tb * 1e6, ta * 1e6


def make_sampler(mod):
    rng = np.random.default_rng(0)
    sampler = mod.PrioritizedSampler(n, k, alpha=0.6, beta=0.4, seed=0, warmup_epochs=0)
    batches = [sampler.next_batch() for _ in range(8)]
    losses = [rng.uniform(0.01, 1.0, k) for _ in range(8)]
    return lambda r: sampler.feedback(batches[r % 8], loss=losses[r % 8])


(add_b, update_b), (add_a, update_a) = make(B), make(A)
for label, (before, after) in (("add", (add_b, add_a)), ("update(loss=)", (update_b, update_a)),
                               ("PrioritizedSampler.feedback(loss=)", (make_sampler(B), make_sampler(A)))):
    tb, ta = paired(before, after)
    ratio = ta / tb
    print(f"{label} N={n} K={k}: before {np.median(tb):.2f} µs, after {np.median(ta):.2f} µs, median ratio "
          f"after/before {np.median(ratio):.3f} (IQR {np.percentile(ratio, 25):.3f}-{np.percentile(ratio, 75):.3f})")
