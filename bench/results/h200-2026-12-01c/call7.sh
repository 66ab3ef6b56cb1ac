#!/usr/bin/env bash
# Seventh session, call 7 (issues 13, 15): the same-phase stores without a branch a chunk (whole
# chunks stored in the loop under a predicate; the row's two partial chunks after it, by the lanes
# that hold them: store_row_ends). The odd-H ratios first (tune_rows, PolyNorm bf16 and the fused
# op), then the CUDA kernel tests. In place, no pip install.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01c/call7.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
MAX_JOBS=16 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
timeout 25 python3 bench/tune_rows.py --H 4097 5125 16385 --aligned-only 2>&1 | tee "$OUT/tune.log"
timeout 15 python3 bench/tune_rows.py --op poly_norm_mul --H 5125 16385 --aligned-only 2>&1 | tee -a "$OUT/tune.log"
stamp tune
timeout 110 python3 -m pytest tests/test_parity.py tests/test_kernels.py tests/test_clusters.py tests/test_launch_plan.py \
  tests/test_mul.py tests/test_grouped.py -q -ra -p no:cacheprovider -k "cuda or clusters or launch" -n 14 \
  > "$OUT/tests_kernels.log" 2>&1; echo "pytest kernels rc=$?"
grep -E "^FAILED|^ERROR" "$OUT/tests_kernels.log" | head -20; tail -1 "$OUT/tests_kernels.log"
stamp tests
