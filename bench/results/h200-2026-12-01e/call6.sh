#!/usr/bin/env bash
# Ninth session, call 6 (issue 13's targets 1-3 at main's kernels, beyond bf16's ops_timing):
# ops_timing in fp16 and fp32 (PolyNorm and the fused op, CUDA only), and tune_rows (bf16, the
# table's grid) at H = 1024 and 8192 with views one element in, and the long rows 131072, 262144.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01e/call6.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
MAX_JOBS=16 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
for dt in float16 float32; do
  timeout 60 python3 bench/ops_timing.py --dtype $dt --no-triton --no-seed-shapes 2>&1 | tee -a "$OUT/ops_timing_dtypes.log"
  timeout 60 python3 bench/ops_timing.py --op poly_norm_mul --dtype $dt --no-triton --no-seed-shapes 2>&1 | tee -a "$OUT/ops_timing_dtypes.log"
  stamp $dt
done
(cd /tmp && timeout 60 python3 "$ROOT/bench/tune_rows.py" --table-only --H 1024 8192 131072 262144 2>&1 | tee "$OUT/tune.log")
stamp tune
