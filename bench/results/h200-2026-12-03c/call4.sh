#!/usr/bin/env bash
# Twentieth session, call 4 (issues 15, 13; bench/NOTES.md v22): the commit that staggers the first
# wave of a grid of a block per R rows of one to two waves (launch_plan.h, row_wave_stagger_cycles;
# call 3's finding). The kernel tests of the stagger and of graphs, the launch-plan tests; the new
# rule against no stagger (tune_rows --stagger 0) at the seed shapes it moves and at grids of about
# 1.4-1.5 waves elsewhere; the README's kernel tables (ops_timing, bf16 PolyNorm and the fused op).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03c/call4.sh
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
timeout -s INT 150 python3 -m pytest tests/test_kernels.py tests/test_launch_plan.py -q -p no:cacheprovider -n 16 \
  -k "stagger or graph or many_rows or launch_plan or plan" > "$OUT/smoke.log" 2>&1
echo "smoke rc=$?"; tail -2 "$OUT/smoke.log"
stamp smoke
T="timeout 40 python3 bench/tune_rows.py --table-only --aligned-only --stagger 0"
{
  # the seed shapes of 1.94 waves: the fused forward at 2048 x 4096, PolyNorm's at 2048 x 8192
  $T --op poly_norm_mul --elements 8388608 --H 4096
  $T --elements 16777216 --H 8192
  # grids of about 1.4-1.5 waves: 750 blocks of 528 resident (H = 1024, 4096), 400 of 264 (32768, 256 threads)
  $T --op poly_norm_mul --elements 6144000 --H 1024 4096
  $T --elements 12288000 --H 1024 4096
  $T --elements 13107200 --H 32768
} 2>&1 | tee "$OUT/tune.log"
stamp tune
timeout 80 python3 bench/ops_timing.py > "$OUT/ops_timing.log" 2>&1; echo "ops_timing rc=$?"
timeout 80 python3 bench/ops_timing.py --op poly_norm_mul > "$OUT/ops_timing_mul.log" 2>&1; echo "mul_timing rc=$?"
cat "$OUT/ops_timing.log" "$OUT/ops_timing_mul.log"
stamp timing
