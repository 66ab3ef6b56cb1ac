#!/usr/bin/env bash
# Twenty-ninth session, call 4 (issue 13; bench/NOTES.md v32): the forward's cluster slots padded to four
# floats, read in one 16-byte load as the backward's are since call 1 (the same bits). Build, the tests
# that reach rows of clusters (test_clusters, test_launch_plan, test_kernels, test_mul), then tune_rows'
# table forward (and backward) at the long rows, bf16 and fp32, and the fused forward.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04d/call4.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"; gzip -f "$OUT/build.log"
stamp build
timeout -s INT 150 python3 -m pytest tests/test_clusters.py tests/test_launch_plan.py tests/test_kernels.py tests/test_mul.py \
  -q -ra -p no:cacheprovider -n 16 > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" "$OUT/tests.log" | tail -5; gzip -f "$OUT/tests.log"
stamp tests
timeout 40 python3 bench/tune_rows.py --table-only --aligned-only --H 32768 65536 131072 262144 2>&1 | tee "$OUT/tune.log"
timeout 30 python3 bench/tune_rows.py --dtype float32 --table-only --aligned-only --H 65536 131072 2>&1 | tee "$OUT/tune_fp32.log"
timeout 30 python3 bench/tune_rows.py --op poly_norm_mul --table-only --aligned-only --H 32768 65536 131072 2>&1 | tee "$OUT/tune_mul.log"
stamp tune
