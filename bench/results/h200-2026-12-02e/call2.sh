#!/usr/bin/env bash
# Sixteenth session, call 2 (issues 13, 15): the persistent row grids' staggered start alone
# (stagger_start; _tune_rows(stagger=N), off in the table), forward and backward, PolyNorm and the
# fused op, bf16, at M·H = 2^26 and 2^24 (bench/NOTES.md v18).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02e/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
T="timeout 150 python3 bench/tune_rows.py --table-only --aligned-only"
{
  $T --H 1024 4096 16384 32768 65536 131072 262144 5125 16385 65537 --stagger 1500 3000 4500
  $T --elements 16777216 --H 4096 16384 65536 131072 --stagger 1500 3000
  $T --op poly_norm_mul --H 4096 16384 32768 65536 131072 5125 16385 --stagger 1500 3000 4500
} 2>&1 | tee "$OUT/tune.log"
stamp tune
