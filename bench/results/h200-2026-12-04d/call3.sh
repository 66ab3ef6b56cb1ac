#!/usr/bin/env bash
# Twenty-ninth session, call 3 (issues 13, 15; bench/NOTES.md v32), on call 2's warm machine and build (the
# same commit): ops_timing.py --graph for both ops in bf16 (the README's kernel tables; call 2 ran out of
# time before them), then tune_rows: the fused backward staged or not (--stage 0) in bf16, fp16 and fp32,
# PolyNorm's long rows in bf16 and fp16.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04d/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
ls polynorm/_C*.so > /dev/null 2>&1 || { MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"; }
stamp start
timeout 90 python3 bench/ops_timing.py --graph > "$OUT/ops_timing_graph.log" 2>&1; echo "graph rc=$?"
stamp graph
timeout 90 python3 bench/ops_timing.py --graph --op poly_norm_mul > "$OUT/ops_timing_graph_mul.log" 2>&1; echo "graph mul rc=$?"
stamp graph_mul
for dt in bfloat16 float16 float32; do
  timeout 45 python3 bench/tune_rows.py --op poly_norm_mul --dtype $dt --table-only --aligned-only --stage 0 --H 32768 65536 131072
done 2>&1 | tee "$OUT/tune_mul.log"
for dt in bfloat16 float16; do
  timeout 45 python3 bench/tune_rows.py --dtype $dt --table-only --aligned-only --H 32768 65536 131072 262144
done 2>&1 | tee "$OUT/tune.log"
stamp tune
