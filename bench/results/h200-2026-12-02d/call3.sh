#!/usr/bin/env bash
# Fifteenth session, call 3 (issues 13, 15): the backward's sums in the class order (backward.cuh,
# class_sums: the same-phase build sums its chunks as loaded, no stage; every build adds element k
# of its packs slot by slot, then the classes in order). class_check.py (the same-phase build
# against the realigned one, bitwise) plain and under racecheck; tune_rows (odd H, views one
# element in, aligned rows: against the earlier runs' figures, this build's bits differ); the
# whole suite; ops_timing if the time allows.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02d/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
HERE=bench/results/h200-2026-12-02d
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
timeout 60 python3 $HERE/class_check.py 2>&1 | tee "$OUT/class_check.log" | tail -13
stamp class_check
T="timeout 45 python3 bench/tune_rows.py --table-only"
{
  $T --H 4096 16384 65536 3000 4097 5125 16385 65537
  $T --op poly_norm_mul --aligned-only --H 4096 16384 65536 3000 4097 5125 16385
  $T --dtype float32 --aligned-only --H 4096 5125 16385
} 2>&1 | tee "$OUT/tune.log"
stamp tune
/usr/bin/time -f "suite wall %e s" timeout -s INT 300 python3 -m pytest tests/test_pt2.py tests/test_grouped.py \
  tests/test_training.py tests -v -ra -p no:cacheprovider -n 16 --dist loadgroup --durations=15 > "$OUT/tests.log" 2>&1
echo "pytest rc=$?"
grep -E "\] (FAILED|ERROR) |^FAILED|^ERROR|passed|failed|suite wall" "$OUT/tests.log" | head -20
grep -E "\] (FAILED|ERROR) " "$OUT/tests.log" | sed -E 's/.*(FAILED|ERROR) //' | sort -u > "$OUT/failed.txt"
stamp suite
if (( $(date +%s) - t0 < 500 )); then
  timeout 40 python3 bench/ops_timing.py > "$OUT/ops_timing.log" 2>&1; echo "ops_timing rc=$?"
  stamp ops_timing
fi
if (( $(date +%s) - t0 < 540 )); then
  timeout 40 compute-sanitizer --tool racecheck --racecheck-report hazard python3 $HERE/class_check.py --racecheck > "$OUT/racecheck.log" 2>&1
  echo "racecheck rc=$?"; grep -E "bad cases|SUMMARY" "$OUT/racecheck.log" | tail -3
  stamp racecheck
fi
