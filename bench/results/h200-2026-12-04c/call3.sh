#!/usr/bin/env bash
# Twenty-eighth session, call 3 (bench/NOTES.md v30): call 2's cause fixed (a run-time test of
# ParamGrads::per_row at the aligned row kernel's end moved two of its row loads below its first math:
# bench/sass_load_order.py), and the shared-half kernel's loads all issued before its math (its
# `zero` dependency). Build; the shared-half tests; tune_rows' table (the register plan) against
# --shared 1, bf16 twice (aligned), once with the views; fp16 and fp32 once.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04c/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"; gzip -f "$OUT/build.log"
stamp build
timeout 90 python3 -m pytest tests/test_clusters.py -k "shared_half or long_rows" -q -p no:cacheprovider -n 8 > "$OUT/tests.log" 2>&1
echo "pytest rc=$?"; tail -2 "$OUT/tests.log"
stamp tests
for pass in 1 2; do
  timeout 50 python3 bench/tune_rows.py --table-only --aligned-only --shared 1 --H 16384 32768 65536 131072 262144
done 2>&1 | tee "$OUT/tune.log"
(timeout 40 python3 bench/tune_rows.py --table-only --shared 1 --H 131072 262144
 timeout 40 python3 bench/tune_rows.py --dtype float16 --table-only --aligned-only --shared 1 --H 65536 131072 262144
 timeout 40 python3 bench/tune_rows.py --dtype float32 --table-only --aligned-only --shared 1 --H 32768 65536 131072) 2>&1 | tee "$OUT/tune_more.log"
stamp tune
