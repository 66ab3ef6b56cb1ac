#!/usr/bin/env bash
# Fourteenth session, call 5 (issues 13, 15): call 4's machine was taken back mid-call, leaving
# too little device time for the whole suite. The final table's kernel test files instead (the
# plan, the clusters, the parity matrix, the kernels' guarantees, the fused and grouped ops; their
# torch.compile cases left out), under a time limit, verbose.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02c/call5.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
timeout -s INT "${TESTS_TIMEOUT:-170}" python3 -m pytest tests/test_clusters.py tests/test_launch_plan.py tests/test_kernels.py \
  tests/test_parity.py tests/test_mul.py tests/test_grouped.py -k "not compile and not aoti" -v -ra -p no:cacheprovider \
  -n 16 --dist loadgroup > "$OUT/tests.log" 2>&1
echo "pytest rc=$?"
grep -E "\] (FAILED|ERROR) |^FAILED|^ERROR|passed|failed" "$OUT/tests.log" | head -20
grep -E "PASSED|SKIPPED|XFAIL|FAILED" "$OUT/tests.log" | sed -E 's/.*(PASSED|SKIPPED|XFAIL|FAILED).*/\1/' | sort | uniq -c
stamp tests
