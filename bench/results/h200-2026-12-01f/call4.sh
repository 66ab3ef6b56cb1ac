#!/usr/bin/env bash
# Tenth session, call 4 (issues 13, 15): main's kernels as they land (the warp-vote expert search
# on by default in the aligned grouped builds; the bench flags R and S removed; the row kernels'
# SASS otherwise identical to the measured ones), built in place: the whole GPU suite (on a
# 2 x H200 machine when lent: the 2-GPU cases run too), then grouped_timing (the README's
# grouped table).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01f/call4.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
/usr/bin/time -f "suite wall %e s" timeout -s INT 330 python3 -m pytest tests/test_pt2.py \
  tests/test_grouped.py tests/test_training.py tests -q -ra -p no:cacheprovider \
  -n 16 --dist loadgroup --durations=15 > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR|passed|failed|suite wall" "$OUT/tests.log" | head -40
stamp suite
(cd /tmp && timeout 150 python3 "$ROOT/bench/grouped_timing.py" --out "$OUT/grouped_timing.json" 2>&1 | tee "$OUT/grouped_timing.log")
stamp grouped
