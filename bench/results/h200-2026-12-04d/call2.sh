#!/usr/bin/env bash
# Twenty-ninth session, call 2 (issues 13, 15; bench/NOTES.md v32): main as committed (the commit named in
# this folder's README: the slots read four at a time, the fused backward's rows of clusters on CTAs of 256
# staged by the table): build, the whole GPU suite, then ops_timing.py --graph for both ops in bf16 (the
# README's kernel tables).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04d/call2.sh
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
/usr/bin/time -f "suite wall %e s" timeout -s INT 320 python3 -m pytest tests/test_pt2.py tests/test_grouped.py \
  tests/test_training.py tests -v -ra -p no:cacheprovider -n 16 --dist loadgroup --durations=15 > "$OUT/tests.log" 2>&1
echo "pytest rc=$?"
grep -E "\] (FAILED|ERROR) |^FAILED|^ERROR|passed|failed|suite wall" "$OUT/tests.log" | head -20
grep -E "test_staged_rows|fused_backward_rows_of_clusters" "$OUT/tests.log" | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //' | head -8
grep -E "\] (FAILED|ERROR) " "$OUT/tests.log" | sed -E 's/.*(FAILED|ERROR) //' | sort -u > "$OUT/failed.txt"
gzip -f "$OUT/tests.log"
stamp suite
timeout 80 python3 bench/ops_timing.py --graph > "$OUT/ops_timing_graph.log" 2>&1; echo "graph rc=$?"
stamp graph
timeout 80 python3 bench/ops_timing.py --graph --op poly_norm_mul > "$OUT/ops_timing_graph_mul.log" 2>&1
echo "graph mul rc=$?"; tail -14 "$OUT/ops_timing_graph.log"; tail -14 "$OUT/ops_timing_graph_mul.log"
stamp graph_mul
