#!/usr/bin/env bash
# Fifteenth session, call 1 (issues 13, 15): the L2 prefetch bench switch (_tune_rows(l2_prefetch=d):
# the aligned row builds ask L2 for the row d group-steps ahead, right after this row's loads)
# against the table in the same build, bf16 both ops and fp32; then the A/B of the rows whose plan
# moved after the fourteenth session's call 3 (the lost call 4's) and the review's zig-zag H, against
# the old table's geometry (--cta 512).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02d/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
T="timeout 100 python3 bench/tune_rows.py --table-only --aligned-only --l2 1 2"
{
  $T --H 512 1024 2048 4096 8192 16384 32768 65536 131072 262144 3000
  $T --op poly_norm_mul --H 1024 4096 8192 16384 32768 65536 131072
  timeout 60 python3 bench/tune_rows.py --table-only --aligned-only --l2 1 --dtype float32 --H 1024 4096 16384 65536
} 2>&1 | tee "$OUT/tune_l2.log"
stamp tune_l2
{
  timeout 60 python3 bench/tune_rows.py --table-only --aligned-only --cta 512 --H 9000 10240 12288 14336 16384 20480 24576 28672 40960
  timeout 40 python3 bench/tune_rows.py --op poly_norm_mul --table-only --aligned-only --cta 512 --H 4608 5125 6144 16385
} 2>&1 | tee "$OUT/tune_ab.log"
stamp tune_ab
