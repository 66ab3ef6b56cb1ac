#!/usr/bin/env bash
# Nineteenth session, call 2, short form (issues 13, 15; bench/NOTES.md v21): the table's three changes of this
# session (launch_plan.h: the fused forward's rows of whole packs a quarter idle at 8 packs take 4;
# its rows past 128 threads take two CTAs of <= 128 where they hold no more threads; a grid of a
# block per R rows of more than 128 threads staggers its first wave by 3000 cycles, not 750), their
# A/B against the old choice in the same run (tune_rows: `--no-trim`, `--cta 256`, `--stagger 750`),
# then the kernel tests these changes touch (the device time left did not hold the whole suite).
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
T="timeout 30 python3 bench/tune_rows.py --table-only --aligned-only"
{
  $T --op poly_norm_mul --no-trim --cta 256 --H 2304 3000 3072 12288 16384
  $T --op poly_norm_mul --no-trim --cta 256 --dtype float32 --H 1500 8192
  $T --stagger 750 --H 16384 32768 16385
  $T --stagger 750 --dtype float16 --H 32768
  $T --stagger 750 --dtype float32 --H 16384
} 2>&1 | tee "$OUT/tune.log"
stamp tune
timeout -s INT 200 python3 -m pytest tests/test_mul.py tests/test_launch_plan.py tests/test_kernels.py tests/test_clusters.py \
  -q -p no:cacheprovider -n 16 -k "contiguous_small or misaligned_rows or every_mul_family or halves or stagger or layouts or two_ctas or boundaries or deterministic" > "$OUT/smoke.log" 2>&1
echo "smoke rc=$?"; tail -2 "$OUT/smoke.log"
stamp smoke
