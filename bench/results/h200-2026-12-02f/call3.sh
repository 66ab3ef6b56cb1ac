#!/usr/bin/env bash
# Seventeenth session, call 3 (issues 13, 15; bench/NOTES.md v19): the sum apart's threshold at
# small M (tune_rows --apart at M·H = 2^22 and 2^23), smoke tests, then the kernel tables
# (ops_timing: PolyNorm and the fused op in bf16; PolyNorm in fp16 and fp32).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02f/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
timeout 100 python3 -m pytest tests/test_kernels.py tests/test_launch_plan.py -q -ra -p no:cacheprovider -n 8 \
  -k "apart or graph or many_rows or tune_rows" > "$OUT/smoke.log" 2>&1
echo "smoke rc=$?"; tail -2 "$OUT/smoke.log"
stamp smoke
T="timeout 60 python3 bench/tune_rows.py --table-only --aligned-only"
{
  $T --apart 0 1 --elements 8388608 --H 1024 4096 8192 16384
  $T --apart 0 1 --elements 4194304 --H 1024 4096 8192 16384
  $T --op poly_norm_mul --elements 16777216 --H 8192 12288 16384 --persistent
} 2>&1 | tee "$OUT/tune.log"
stamp tune
timeout 60 python3 bench/ops_timing.py > "$OUT/ops_timing.log" 2>&1; echo "ops_timing rc=$?"
timeout 60 python3 bench/ops_timing.py --op poly_norm_mul > "$OUT/ops_timing_mul.log" 2>&1; echo "mul_timing rc=$?"
stamp timing
for dt in float16 float32; do
  timeout 45 python3 bench/ops_timing.py --dtype $dt --no-triton --no-seed-shapes > "$OUT/ops_timing_$dt.log" 2>&1
  echo "ops_timing $dt rc=$?"
done
stamp timing2
cat "$OUT/ops_timing.log" "$OUT/ops_timing_mul.log" "$OUT/ops_timing_float16.log" "$OUT/ops_timing_float32.log"
