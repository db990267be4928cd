#!/usr/bin/env bash
# The whole GPU check on a bare CUDA machine, from a copy of this working tree: nothing is installed there.
#
#   python -m checks.gpu_check --prepare   # first, here: fills .gpu_bundle/ (SST-2, Wikipedia text) and sizes it
#   bash checks/gpu_check.sh               # there (the device call carries .gpu_bundle): about 8 minutes
#   bash checks/gpu_check.sh --dry-run     # here: the same command at toy sizes on the CPU
#
# The report (gpu_check.md), its numbers (gpu_check.json) and the whole log (gpu_check.log) go to $OUT when it is
# set (the device machine sets it and sends that folder back), else to results/gpu_check/. Extra arguments go to
# checks/gpu_check.py (--parts, --budget, --skip-tests, ...). PYTHON picks the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${OUT:-results/gpu_check}
mkdir -p "$dest"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -d .gpu_bundle ] || echo "warning: no .gpu_bundle here (run 'python -m checks.gpu_check --prepare' and carry it)" >&2
"${PYTHON:-python3}" -m checks.gpu_check --bundle .gpu_bundle --out "$dest/gpu_check.md" "$@" 2>&1 | tee "$dest/gpu_check.log"
exit "${PIPESTATUS[0]}"
