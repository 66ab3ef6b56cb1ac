#!/usr/bin/env bash
# Nineteenth session, call 2 (issues 13, 15; bench/NOTES.md v21): the table's three changes of this
# session (launch_plan.h: the fused forward's rows of whole packs a quarter idle at 8 packs take 4;
# its rows past 128 threads take two CTAs of <= 128 where they hold no more threads; a grid of a
# block per R rows of more than 128 threads staggers its first wave by 3000 cycles, not 750), their
# A/B against the old choice in the same run (tune_rows: `--no-trim`, `--cta 256`, `--stagger 750`)
# and the bf16 kernel tables (ops_timing, PolyNorm and fused); the tests: call 3 (the whole suite).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03b/call2.sh
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
T="timeout 40 python3 bench/tune_rows.py --table-only --aligned-only"
{
  $T --op poly_norm_mul --no-trim --H 2304 3000 3072 4200 5125
  $T --op poly_norm_mul --no-trim --dtype float32 --H 1500 3000
  $T --op poly_norm_mul --cta 256 --H 12288 16384
  $T --op poly_norm_mul --cta 256 --dtype float32 --H 8192
  $T --stagger 750 --H 16384 20480 32768 16385
  $T --stagger 750 --dtype float16 --H 32768
  $T --stagger 750 --dtype float32 --H 16384
} 2>&1 | tee "$OUT/tune.log"
stamp tune
timeout 70 python3 bench/ops_timing.py > "$OUT/ops_timing.log" 2>&1; echo "ops_timing rc=$?"
timeout 70 python3 bench/ops_timing.py --op poly_norm_mul > "$OUT/ops_timing_mul.log" 2>&1; echo "mul_timing rc=$?"
stamp timing
cat "$OUT/ops_timing.log" "$OUT/ops_timing_mul.log"
