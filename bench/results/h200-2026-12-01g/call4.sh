#!/usr/bin/env bash
# Eleventh session, call 4 (issues 13, 15): call 3's kernels (SASS unchanged) with the host fix
# (allow_smem raises a kernel's dynamic shared-memory limit whenever a launch takes any: the
# fused backward's same-phase build at H = 5125 took 46 KB of stage areas beside 2 KB static and
# failed to launch). Built in place: the test files of call 3's 19 failures whole (test_mul.py,
# test_launch_plan.py), racecheck and memcheck over stage_check.py, then the fused op's timing.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01g/call4.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
HERE=bench/results/h200-2026-12-01g
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
timeout 80 python3 -m pytest tests/test_mul.py tests/test_launch_plan.py -q -ra -p no:cacheprovider -n 16 \
  > "$OUT/tests_mul_plan.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR|passed|failed" "$OUT/tests_mul_plan.log" | head -20
stamp tests
timeout 40 compute-sanitizer --tool racecheck --racecheck-report hazard python3 $HERE/stage_check.py > "$OUT/racecheck.log" 2>&1
echo "racecheck rc=$?"; grep -E "bits|bad cases|SUMMARY" "$OUT/racecheck.log" | tail -15
timeout 30 compute-sanitizer --tool memcheck python3 $HERE/stage_check.py > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -1 "$OUT/memcheck.log"
stamp sanitizers
timeout 30 python3 bench/tune_rows.py --op poly_norm_mul --table-only --aligned-only --H 5125 16385 4097 2>&1 | tee "$OUT/tune_mul.log"
stamp tune_mul
