#!/usr/bin/env bash
# Eighteenth session, call 3 (issues 13, 15; bench/NOTES.md v20): the commit that takes call 2's
# outcomes (the sum kernel's loads batched, the row kernels' last-block sum as before; a block per
# R rows' first wave staggered by 750 cycles from two waves on). The stagger against none
# (tune_rows --stagger 0), the kernel tables (ops_timing: bf16 PolyNorm and the fused op, fp16,
# fp32), the kernel tests of the changed code. The whole suite: call 4.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03/call3.sh
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
timeout -s INT 120 python3 -m pytest tests/test_kernels.py tests/test_launch_plan.py -q -p no:cacheprovider -n 16 \
  -k "apart or graph or many_rows or stagger or tune_rows" > "$OUT/smoke.log" 2>&1
echo "smoke rc=$?"; tail -2 "$OUT/smoke.log"
stamp smoke
T="timeout 60 python3 bench/tune_rows.py --table-only --aligned-only --stagger 0"
{
  $T --H 512 1024 2048 4096 8192 16384
  $T --elements 33554432 --H 4096 16384
  $T --op poly_norm_mul --H 4096 8192
} 2>&1 | tee "$OUT/tune.log"
stamp tune
timeout 70 python3 bench/ops_timing.py > "$OUT/ops_timing.log" 2>&1; echo "ops_timing rc=$?"
timeout 70 python3 bench/ops_timing.py --op poly_norm_mul > "$OUT/ops_timing_mul.log" 2>&1; echo "mul_timing rc=$?"
stamp timing
for dt in float16 float32; do
  timeout 45 python3 bench/ops_timing.py --dtype $dt --no-triton --no-seed-shapes > "$OUT/ops_timing_$dt.log" 2>&1
  echo "ops_timing $dt rc=$?"
done
stamp timing2
cat "$OUT/ops_timing.log" "$OUT/ops_timing_mul.log" "$OUT/ops_timing_float16.log" "$OUT/ops_timing_float32.log"
