#!/usr/bin/env bash
# ELECTRA vs TMR(loss_diff) at CPU scale: tiny preset, real Wikipedia text (SQuAD *train* articles),
# 2 pretraining seeds per variant, then GLUE fine-tuning (CoLA, SST-2, MRPC, STS-B, RTE; 3 seeds each).
#
# Usage (from the repo root):
#   STEPS=2500 OUT=runs/tmr_cpu FT_TRAIN=2000 bash experiments/reproduce_tmr_cpu.sh
#
# Pretraining runs one after another. Fine-tuning of checkpoint k runs in the background while checkpoint k+1
# is pretrained (one fine-tuning job at a time, 1 thread each), so at most two of our processes run at once.
# Results: $OUT/<name>/ (pretraining runs), $OUT/ft/<name>/ (fine-tuning, results_runs.jsonl per checkpoint),
# $OUT/table.md (aggregated fine-tuning table), $OUT/*.log.
set -euo pipefail

STEPS=${STEPS:-2500}
OUT=${OUT:-runs/tmr_cpu}
FT_TRAIN=${FT_TRAIN:-2000}        # GLUE train subset size (subset seed 0); dev sets are used in full
FT_LR=${FT_LR:-1e-3}              # = integrations/electra/cli.py TINY_FINETUNE_LR["tiny"], same for every checkpoint
GLUE_DIR=${GLUE_DIR:-../shared/data/glue}
DATA=${DATA:-../shared/data/wikipedia-squad}
CORPUS="$DATA/squad-train-articles.part1of2.txt.gz,$DATA/squad-train-articles.part2of2.txt.gz"   # never squad-dev-articles
PY=${PY:-python}

# Single-threaded BLAS/OpenMP: multi-threaded OpenBLAS / torch intra-op threads thrash on a shared 2-core machine
# (measured: 2.1 s/step with torch's 2 threads vs 0.12 s/step with 1 thread while another job was running).
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

mkdir -p "$OUT/ft"
rm -f "$OUT"/*/.done                     # markers from an earlier run in the same OUT
RUNS=("electra:0" "tmr-loss_diff:0" "electra:1" "tmr-loss_diff:1")   # interleaved: a matched pair finishes first

name_of() { local v=${1%%:*} s=${1##*:}; echo "${v}-s${s}"; }

finetune_chain() {
  for r in "${RUNS[@]}"; do
    local n; n=$(name_of "$r")
    while [ ! -e "$OUT/$n/.done" ]; do sleep 5; done
    /usr/bin/time -f "finetune $n wall %e s" \
      "$PY" examples/electra_tmr.py finetune --checkpoint "$n=$OUT/$n/discriminator" \
        --task cola sst2 mrpc stsb rte --glue-dir "$GLUE_DIR" \
        --max-train-examples "$FT_TRAIN" --seeds 0 1 2 --lr "$FT_LR" --threads 1 \
        --output-dir "$OUT/ft/$n" --no-progress > "$OUT/ft-$n.log" 2>&1
  done
}

finetune_chain &
FT_PID=$!
trap 'kill "$FT_PID" 2>/dev/null || true' EXIT   # a failed pretraining run must not leave the chain waiting

for r in "${RUNS[@]}"; do
  v=${r%%:*}; s=${r##*:}; n=$(name_of "$r")
  /usr/bin/time -f "pretrain $n wall %e s" \
    "$PY" examples/electra_tmr.py pretrain --variant "$v" --preset tiny --steps "$STEPS" --seed "$s" \
      --corpus "$CORPUS" --cache-dir "$OUT/cache" --output-dir "$OUT/$n" \
      --checkpoint-every 0 --no-progress > "$OUT/pretrain-$n.log" 2>&1
  touch "$OUT/$n/.done"
done

wait "$FT_PID"

# Aggregate: per checkpoint and per variant (mean over pretraining seeds), mean ± std over fine-tuning seeds.
# Aggregate: per checkpoint, mean ± sample std over the fine-tuning seeds; per variant, mean over its pretraining
# seeds ± std over all (pretraining seed × fine-tuning seed) runs. Also the end-of-pretraining metrics and a plot.
"$PY" - "$OUT" > "$OUT/table.md" <<'PYEOF'
import json, math, sys
from pathlib import Path
out = Path(sys.argv[1])
names = ["electra-s0", "electra-s1", "tmr-loss_diff-s0", "tmr-loss_diff-s1"]
cols = [("cola", "mcc"), ("sst2", "accuracy"), ("mrpc", "accuracy"), ("mrpc", "f1"), ("stsb", "spearman"), ("rte", "accuracy")]
main = [("cola", "mcc"), ("sst2", "accuracy"), ("mrpc", "accuracy"), ("stsb", "spearman"), ("rte", "accuracy")]
def ms(v):
    m = sum(v) / len(v)
    s = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else float("nan")
    return m, s
def cell(v, k=100):
    m, s = ms([x * k for x in v]); return f"{m:.1f} ± {s:.1f}"
runs = {}
for n in names:
    f = out / "ft" / n / "results_runs.jsonl"
    if not f.exists():
        continue
    for r in map(json.loads, f.read_text().splitlines()):
        runs.setdefault(n, {}).setdefault(r["task"], {})[r["seed"]] = r
def values(n, t, m):
    return [runs[n][t][s][m] for s in sorted(runs[n][t])]
def avg5(n):
    seeds = sorted(set.intersection(*(set(runs[n][t]) for t, _ in main)))
    return [sum(runs[n][t][s][m] for t, m in main) / len(main) for s in seeds]
header = "| checkpoint | CoLA MCC | SST-2 acc | MRPC acc | MRPC F1 | STS-B Spearman | RTE acc | 5-task avg |"
print(header); print("|" + "---|" * 8)
done = [n for n in names if n in runs and all(t in runs[n] for t, _ in main)]
for n in done:
    print(f"| {n} | " + " | ".join(cell(values(n, t, m)) for t, m in cols) + f" | {cell(avg5(n))} |")
variant_avg = {}
for v in ("electra", "tmr-loss_diff"):
    ns = [n for n in done if n.startswith(v + "-s")]
    if not ns:
        continue
    row = []
    for t, m in cols + [("avg5", None)]:
        per = [avg5(n) if t == "avg5" else values(n, t, m) for n in ns]
        mean = sum(ms(p)[0] for p in per) / len(per) * 100
        sd = ms([x * 100 for p in per for x in p])[1]
        row.append(f"{mean:.1f} ± {sd:.1f}")
    variant_avg[v] = [ms(avg5(n))[0] * 100 for n in ns]
    print(f"| **{v} (mean of {len(ns)} pretraining seeds)** | " + " | ".join(row) + " |")
print()
for v, a in variant_avg.items():
    print(f"{v}: 5-task avg per pretraining seed = " + ", ".join(f"{x:.2f}" for x in a))
if len(variant_avg) == 2:
    e, t = (sum(variant_avg[v]) / len(variant_avg[v]) for v in ("electra", "tmr-loss_diff"))
    print(f"TMR - ELECTRA (5-task avg, points) = {t - e:+.2f}")
print()
print("| run | steps | wall s | s/step | L_D | disc acc | replaced acc | L_G | gen acc | changed (produced) | changed fresh | changed replayed | fresh fraction |")
print("|" + "---|" * 13)
for n in names:
    f = out / n / "summary.json"
    if not f.exists():
        continue
    s = json.loads(f.read_text())
    g = lambda k: "–" if s.get(k) is None else f"{s[k]:.3f}"
    print(f"| {n} | {s['steps']} | {s['wall_seconds_this_session']:.0f} | {s['seconds_per_step']:.3f} | {g('final_discriminator_loss')} | "
          f"{g('final_discriminator_accuracy')} | {g('final_replaced_accuracy')} | {g('final_generator_loss')} | {g('final_generator_accuracy')} | "
          f"{g('final_changed_fraction_produced')} | {g('final_changed_fraction_fresh')} | {g('final_changed_fraction_replayed')} | {g('final_fresh_fraction')} |")
try:
    import matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for n in names:
        f = out / n / "metrics.jsonl"
        if not f.exists():
            continue
        recs = [json.loads(l) for l in f.read_text().splitlines()]
        steps = [r["step"] for r in recs]
        for ax, key in zip(axes, ("discriminator_loss", "replaced_accuracy")):
            ys = [r[key] for r in recs]; w = 50
            sm = [sum(ys[max(0, i - w + 1):i + 1]) / len(ys[max(0, i - w + 1):i + 1]) for i in range(len(ys))]
            ax.plot(steps, sm, label=n, color="C0" if n.startswith("electra") else "C3", ls="-" if n.endswith("s0") else "--")
    for ax, title in zip(axes, ("discriminator loss (moving avg 50 steps)", "replaced-token accuracy (moving avg 50 steps)")):
        ax.set_title(title); ax.set_xlabel("step"); ax.legend(); ax.grid(alpha=.3)
    fig.tight_layout(); fig.savefig(out / "tmr_vs_electra.png", dpi=110)
except ImportError:
    pass
PYEOF
echo "done: $OUT"
