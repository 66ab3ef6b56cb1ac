#!/usr/bin/env bash
# Twentieth session, call 3 (issues 15, 13, 14; bench/NOTES.md v22): the seed shapes (M = 2048) under
# first-wave staggers (_tune_rows(stagger=N) through tune_rows.py, no patch: the table's kernels;
# the table staggers no grid of less than two waves). Call 1 found the seed shapes' gap in the
# kernels themselves (ncu), a row read whole before any of it is written.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03c/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
gzip -f "$OUT/build.log"
stamp build
{
  for H in 1024 2048 4096 8192 16384; do
    E=$((2048 * H))
    timeout 45 python3 bench/tune_rows.py --op poly_norm_mul --elements $E --H $H --table-only --aligned-only \
      --stagger 0 250 500 1000 2000
    timeout 45 python3 bench/tune_rows.py --elements $E --H $H --table-only --aligned-only --stagger 0 250 500 1000 2000
  done
} 2>&1 | tee "$OUT/tune_seed.log"
stamp tune
timeout 60 ncu --profile-from-start off --clock-control none --section SpeedOfLight --section WarpStateStats \
  --section SchedulerStats -k regex:fwd_row_kernel python3 bench/results/h200-2026-12-03c/ncu_small.py 2048 1024 \
  > "$OUT/ncu_seed_stalls.txt" 2>&1; echo "ncu rc=$?"
gzip -f "$OUT/ncu_seed_stalls.txt"
stamp ncu
