#!/usr/bin/env bash
# Does the discriminator learn, and is the task or the pipeline the limit? ELECTRA (tiny preset), STEPS steps,
# replacements from the generator vs drawn uniformly from the vocabulary (`--replacements uniform`), on the
# embedded python-docs corpus and on Wikipedia text (the corpus of results/tmr_vs_electra*.md). Two runs at a
# time, one thread each (about 15 min for 1500 steps on 2 cores). A run whose summary.json exists is not redone.
# Then prints the ranking AUC over training (results/discriminator_probe.md).
#
#   bash examples/probe_discriminator.sh                 # OUT=runs/probe_discriminator STEPS=1500
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${STEPS:-1500}
OUT=${OUT:-runs/probe_discriminator}
PY=${PY:-python}
DATA=${DATA:-../shared/data/wikipedia-squad}
WIKI="$DATA/squad-train-articles.part1of2.txt.gz,$DATA/squad-train-articles.part2of2.txt.gz"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

run() {  # name corpus cache replacements
  [ -f "$OUT/$1/summary.json" ] && return 0
  "$PY" examples/electra_tmr.py pretrain --variant electra --preset tiny --steps "$STEPS" --threads 1 \
    --corpus "$2" --cache-dir "$OUT/$3" --replacements "$4" --output-dir "$OUT/$1" --no-progress > "$OUT/$1.log" 2>&1
}
mkdir -p "$OUT"
# Separate caches: two processes must not build the same tokenizer cache at once.
run docs-generator python-docs cache-docs generator & run docs-uniform python-docs cache-docs2 uniform & wait
run wiki-generator "$WIKI" cache-wiki generator & run wiki-uniform "$WIKI" cache-wiki2 uniform & wait

"$PY" - "$OUT" <<'EOF'
import json, math, sys
from pathlib import Path

out = Path(sys.argv[1])
marks = [1, 100, 250, 500, 1000, 1500]

def window_mean(rows, key, step, half=25):
    """Mean over steps within ±half of `step` (step 1: that step alone): one batch's AUC is noisy."""
    vals = [r[key] for r in rows if (r["step"] == step if step == 1 else abs(r["step"] - step) <= half)
            and r.get(key) is not None and not math.isnan(r[key])]
    return sum(vals) / len(vals) if vals else float("nan")

def entropy(p):
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))

print("| run | " + " | ".join(f"AUC @ {m}" for m in marks) + " | L_D, last 100 | prior entropy H(replaced share) "
      "| replaced-token acc, last 100 |")
print("|---|" + "---|" * (len(marks) + 3))
for name in ["docs-generator", "docs-uniform", "wiki-generator", "wiki-uniform"]:
    path = out / name / "metrics.jsonl"
    if not path.exists():
        continue
    rows = [json.loads(line) for line in path.open()]
    steps = rows[-1]["step"]
    tail = rows[-100:]
    mean = lambda key: sum(r[key] for r in tail) / len(tail)
    aucs = [f"{window_mean(rows, 'replaced_auc', m):.3f}" if m <= steps else "—" for m in marks]
    print(f"| {name} | " + " | ".join(aucs) + f" | {mean('discriminator_loss'):.3f} | "
          f"{entropy(mean('replaced_fraction')):.3f} | {mean('replaced_accuracy'):.3f} |")
EOF
