#!/usr/bin/env bash
# Seventeenth session, call 2 (issues 13, 15; bench/NOTES.md v19): the backward's dW / dB
# partials summed apart (param_sum_kernel, a programmatic dependent launch) and PolyNorm's one-CTA
# rows then on a block per R rows, against the last block's sum on the persistent grid
# (tune_rows --apart), at M·H = 2^26, 2^25 and 2^24; the fused forward persistent; smoke tests.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02f/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
timeout 150 python3 -m pytest tests/test_kernels.py tests/test_clusters.py tests/test_launch_plan.py -q -ra \
  -p no:cacheprovider -n 8 -k "apart or graph or determin or stagger or many_rows or tune_rows" > "$OUT/smoke.log" 2>&1
echo "smoke rc=$?"; tail -3 "$OUT/smoke.log"
stamp smoke
T="timeout 120 python3 bench/tune_rows.py --table-only --aligned-only"
{
  $T --apart 0 1 2 --H 512 1024 2048 4096 8192 16384 65536
  $T --apart 0 1 --elements 33554432 --H 1024 4096 8192
  $T --apart 0 1 --elements 16777216 --H 1024 4096 8192
  $T --op poly_norm_mul --apart 0 1 --persistent --H 2048 4096 8192 12288 16384 65536
} 2>&1 | tee "$OUT/tune.log"
stamp tune
