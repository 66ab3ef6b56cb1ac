#!/usr/bin/env bash
# Twenty-eighth session, call 1 (issue 13; bench/NOTES.md v30): the shared-half backward
# (csrc/cuda/backward.cuh poly_norm_bwd_shared_row_kernel; off in the table, on by _tune_rows(shared_half=1)).
# Build; its tests and the launch-plan tests; tune_rows' table (the register plan) against --shared 1 at
# PolyNorm's backward rows of clusters, bf16 twice, fp32 and fp16 once; racecheck over shared_check.py.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04c/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
grep -A2 "shared_row" "$OUT/build.log" | grep -E "registers|spill" | head -8; gzip -f "$OUT/build.log"
stamp build
timeout 120 python3 -m pytest tests/test_clusters.py -k shared_half tests/test_launch_plan.py -q -x -p no:cacheprovider \
  -n 8 > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"; tail -3 "$OUT/tests.log"
stamp tests
for pass in 1 2; do
  timeout 60 python3 bench/tune_rows.py --table-only --aligned-only --shared 1 --H 16384 32768 65536 131072 262144
done 2>&1 | tee "$OUT/tune.log"
(timeout 40 python3 bench/tune_rows.py --dtype float32 --table-only --aligned-only --shared 1 --H 16384 32768 65536 131072
 timeout 40 python3 bench/tune_rows.py --dtype float16 --table-only --aligned-only --shared 1 --H 65536 131072 262144) 2>&1 | tee "$OUT/tune_dtypes.log"
stamp tune
timeout 150 compute-sanitizer --tool racecheck --racecheck-report hazard python3 bench/results/h200-2026-12-04c/shared_check.py \
  > "$OUT/racecheck.log" 2>&1; echo "racecheck rc=$?"; tail -8 "$OUT/racecheck.log"
stamp racecheck
