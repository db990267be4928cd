#!/usr/bin/env bash
# The whole GPU check on a bare CUDA machine, from a copy of this working tree: nothing is installed there.
#
#   python bench/gpu_check.py --prepare     # first, here: fills .gpu_bundle/ (SST-2, Wikipedia text) and sizes it
#   bash bench/gpu_check.sh                 # there (the device call carries .gpu_bundle): about 8 minutes
#   bash bench/gpu_check.sh --dry-run       # here: the same command at toy sizes on the CPU
#
# The report (gpu_check.md), its numbers (gpu_check.json) and the whole log (gpu_check.log) go to $OUT when it is
# set (the device machine sets it and sends that folder back), else to results/. Extra arguments go to
# bench/gpu_check.py (--parts, --budget, --skip-tests, ...). PYTHON picks the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${OUT:-results}
mkdir -p "$dest"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -d .gpu_bundle ] || echo "warning: no .gpu_bundle here (run 'python bench/gpu_check.py --prepare' and carry it)" >&2
"${PYTHON:-python3}" bench/gpu_check.py --bundle .gpu_bundle --out "$dest/gpu_check.md" "$@" 2>&1 | tee "$dest/gpu_check.log"
exit "${PIPESTATUS[0]}"
