#!/usr/bin/env bash
# Fifteenth session, call 4 (issues 13, 15): the kernels alone on call 3's csrc (the class-order
# backward), both ops: the README's kernel tables.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02d/call4.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
timeout 60 python3 bench/ops_timing.py > "$OUT/ops_timing.log" 2>&1; echo "ops_timing rc=$?"
timeout 60 python3 bench/ops_timing.py --op poly_norm_mul > "$OUT/ops_timing_mul.log" 2>&1; echo "mul_timing rc=$?"
cat "$OUT/ops_timing.log" "$OUT/ops_timing_mul.log"
stamp timing
