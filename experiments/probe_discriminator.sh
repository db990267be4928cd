#!/usr/bin/env bash
# Does the discriminator learn, and is the task or the pipeline the limit? ELECTRA (tiny preset), STEPS steps,
# replacements from the generator vs drawn uniformly from the vocabulary (`--replacements uniform`), on the
# embedded python-docs corpus and on Wikipedia text (the corpus of results/tmr_vs_electra/*.md). Two runs at a
# time, one thread each (about 15 min for 1500 steps on 2 cores). A run whose summary.json exists is not redone.
# Then prints the ranking AUC over training and how each trained discriminator responds to a swapped word
# (experiments/probe_discriminator_summary.py; results/discriminator_probe/discriminator_probe.md).
#
#   bash experiments/probe_discriminator.sh                 # OUT=runs/probe_discriminator STEPS=1500
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

"$PY" -m experiments.probe_discriminator_summary "$OUT"
