#!/usr/bin/env bash
# Twenty-third session, call 3 (issues 13, 15; bench/NOTES.md v25): main after call 2 (the same csrc):
# ops_timing.py --graph for both ops, the README's kernel tables.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03f/call3.sh
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
timeout 150 python3 bench/ops_timing.py --graph > "$OUT/ops_timing_graph.log" 2>&1; echo "graph rc=$?"
cat "$OUT/ops_timing_graph.log"
stamp graph
timeout 150 python3 bench/ops_timing.py --graph --op poly_norm_mul > "$OUT/ops_timing_graph_mul.log" 2>&1
echo "graph mul rc=$?"; cat "$OUT/ops_timing_graph_mul.log"
stamp graph_mul
