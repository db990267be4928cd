#!/usr/bin/env bash
# Prioritized vs uniform sampling on SST-2 through the finetune command's --sampling flag, at equal steps.
# A tiny ELECTRA-shaped model (hidden 64, 2 layers, WordPiece 4000 trained on SST-2 train sentences, random
# weights: no pretraining) is fine-tuned on a seeded 8,000-example subset for 1, 2 and 3 epochs (250 / 500 / 750
# steps, each budget its own run with its own LR schedule), seeds 0 1 2, and scored on the full dev set (872).
# Then experiments/prioritized_glue_summary.py writes results/prioritized_glue/prioritized_glue.md.
#   bash experiments/prioritized_glue.sh [OUT_DIR]     (one process at a time, 1 thread, nice; ~15 min on 2 cores)
#   EPOCHS="6" bash experiments/prioritized_glue.sh    (other budgets into the same OUT_DIR; the summary takes all)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/prioritized_glue}
GLUE=${GLUE_DIR:-../shared/data/glue}
SEEDS=${SEEDS:-"0 1 2"}
EPOCHS=${EPOCHS:-"1 2 3"}
export OMP_NUM_THREADS=1 PYTHONPATH=.
CKPT=$OUT/checkpoint
if [ ! -f "$CKPT/config.json" ]; then
  python - "$GLUE" "$CKPT" <<'PY'
import csv, sys
from tests.electra.tiny_checkpoint import build_tiny_checkpoint  # the tests' random tiny ELECTRA builder
with open(f"{sys.argv[1]}/SST-2/train.tsv", newline="") as handle:
    rows = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
    next(rows)
    lines = [row[0] for row in rows]
build_tiny_checkpoint(sys.argv[2], lines, hidden_size=64, num_layers=2, num_heads=2, vocab_size=4000,
                      max_positions=128, seed=0)
PY
fi
for epochs in $EPOCHS; do
  for sampling in uniform prioritized; do
    # shellcheck disable=SC2086
    nice -n 10 python examples/electra_tmr.py finetune --checkpoint "tiny=$CKPT" --task sst2 --glue-dir "$GLUE" \
      --max-train-examples 8000 --seeds $SEEDS --epochs "$epochs" --lr 1e-3 --max-length 64 --threads 1 \
      --no-progress --sampling "$sampling" --output-dir "$OUT/${sampling}_e${epochs}"
  done
done
python -m experiments.prioritized_glue_summary "$OUT" --command "EPOCHS=\"$EPOCHS\" bash experiments/prioritized_glue.sh $*" \
  --out results/prioritized_glue/prioritized_glue.md
