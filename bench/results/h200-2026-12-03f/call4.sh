#!/usr/bin/env bash
# Twenty-third session, call 4 (issue 13, targets 1 and 2 in the other dtypes; bench/NOTES.md v25): the
# same csrc as calls 2 and 3: ops_timing.py --graph --no-triton for both ops in fp16 and fp32.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03f/call4.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
gzip -f "$OUT/build.log"
stamp build
for dt in float16 float32; do
  for op in poly_norm poly_norm_mul; do
    timeout 100 python3 bench/ops_timing.py --graph --no-triton --no-seed-shapes --dtype $dt --op $op \
      > "$OUT/ops_timing_graph_${op}_${dt}.log" 2>&1; echo "$op $dt rc=$?"
    cat "$OUT/ops_timing_graph_${op}_${dt}.log"
    stamp "$op $dt"
  done
done
