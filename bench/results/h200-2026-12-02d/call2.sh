#!/usr/bin/env bash
# Fifteenth session, call 2 (issues 13, 14, 15): the whole GPU suite on this csrc (the build is a
# no-op on call 1's warm machine), then, if the time allows, ops_timing for both ops.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02d/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
/usr/bin/time -f "suite wall %e s" timeout -s INT 330 python3 -m pytest tests/test_pt2.py tests/test_grouped.py \
  tests/test_training.py tests -v -ra -p no:cacheprovider -n 16 --dist loadgroup --durations=15 > "$OUT/tests.log" 2>&1
echo "pytest rc=$?"
grep -E "\] (FAILED|ERROR) |^FAILED|^ERROR|passed|failed|suite wall" "$OUT/tests.log" | head -20
grep -E "PASSED|SKIPPED|XFAIL" "$OUT/tests.log" | sed -E 's/.*(PASSED|SKIPPED|XFAIL).*/\1/' | sort | uniq -c
grep -E "\] (FAILED|ERROR) " "$OUT/tests.log" | sed -E 's/.*(FAILED|ERROR) //' | sort -u > "$OUT/failed.txt"
stamp suite
if (( $(date +%s) - t0 < 350 )); then
  timeout 110 python3 bench/ops_timing.py > "$OUT/ops_timing.log" 2>&1; echo "ops_timing rc=$?"
  stamp ops_timing
fi
if (( $(date +%s) - t0 < 470 )); then
  timeout 100 python3 bench/ops_timing.py --op poly_norm_mul > "$OUT/ops_timing_mul.log" 2>&1; echo "mul_timing rc=$?"
  stamp mul_timing
fi
