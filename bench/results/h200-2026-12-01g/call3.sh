#!/usr/bin/env bash
# Eleventh session, call 3 (issues 13, 15): the same-phase sums' realigned packs read from a
# shared-memory stage (packs.cuh stage_row / staged_pack) instead of a shuffle and selects a pack.
# Built in place: tune_rows at odd H (and 4096, untouched, as a control), PolyNorm and the fused
# op; compute-sanitizer racecheck and memcheck over stage_check.py; then the whole GPU suite.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01g/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
HERE=bench/results/h200-2026-12-01g
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
grep -E "bytes spill" "$OUT/build.log" | grep -v " 0 bytes spill stores" | wc -l
stamp build
timeout 100 python3 bench/tune_rows.py --H 4096 4097 5125 16385 65537 2>&1 | tee "$OUT/tune.log"
stamp tune
timeout 60 python3 bench/tune_rows.py --op poly_norm_mul --table-only --H 4096 4097 5125 16385 2>&1 | tee "$OUT/tune_mul.log"
stamp tune_mul
timeout 60 compute-sanitizer --tool racecheck --racecheck-report hazard python3 $HERE/stage_check.py > "$OUT/racecheck.log" 2>&1
echo "racecheck rc=$?"; tail -3 "$OUT/racecheck.log"
timeout 60 compute-sanitizer --tool memcheck python3 $HERE/stage_check.py > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -2 "$OUT/memcheck.log"
stamp sanitizers
/usr/bin/time -f "suite wall %e s" timeout -s INT 300 python3 -m pytest tests/test_pt2.py \
  tests/test_grouped.py tests/test_training.py tests -q -ra -p no:cacheprovider \
  -n 16 --dist loadgroup --durations=15 > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR|passed|failed|suite wall" "$OUT/tests.log" | head -30
stamp suite
