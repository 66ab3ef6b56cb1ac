#!/usr/bin/env bash
# Sixteenth session, call 3 (issues 13, 15): the staggered start in the table (launch_plan.h,
# row_stagger_cycles: 1500 cycles between quarters for persistent grids of 8 rounds or more). The
# whole suite (its new test: tests/test_kernels.py test_staggered_start_changes_no_bit); the kernels
# alone for the README (ops_timing, both ops); then the table's stagger against none and others.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02e/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
/usr/bin/time -f "suite wall %e s" timeout -s INT 300 python3 -m pytest tests/test_pt2.py tests/test_grouped.py \
  tests/test_training.py tests -v -ra -p no:cacheprovider -n 16 --dist loadgroup --durations=15 > "$OUT/tests.log" 2>&1
echo "pytest rc=$?"
grep -E "\] (FAILED|ERROR) |^FAILED|^ERROR|passed|failed|suite wall" "$OUT/tests.log" | head -20
grep -E "\] (FAILED|ERROR) " "$OUT/tests.log" | sed -E 's/.*(FAILED|ERROR) //' | sort -u > "$OUT/failed.txt"
grep -c "test_staggered_start_changes_no_bit.* PASSED" "$OUT/tests.log"
gzip -f "$OUT/tests.log"
stamp suite
if (( $(date +%s) - t0 < 470 )); then
  timeout 45 python3 bench/ops_timing.py > "$OUT/ops_timing.log" 2>&1; echo "ops_timing rc=$?"
  timeout 45 python3 bench/ops_timing.py --op poly_norm_mul > "$OUT/ops_timing_mul.log" 2>&1; echo "mul_timing rc=$?"
  stamp timing
fi
if (( $(date +%s) - t0 < 540 )); then
  T="timeout 30 python3 bench/tune_rows.py --table-only --aligned-only --stagger 0 750 2000"
  { $T --H 16384 65536 131072 262144 5125; $T --op poly_norm_mul --H 16384 32768 65536; } 2>&1 | tee "$OUT/tune.log"
  stamp tune
fi
