#!/usr/bin/env bash
# Thirteenth session, call 3 (issues 13, 15), on call 2's machine while warm (the build finds
# nothing to do): the whole suite, verbose, then every failed test again alone; then the kernels
# alone for the README's tables (bench/ops_timing.py, PolyNorm and the fused op).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02b/call3.sh
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
stamp suite
grep -E "\] (FAILED|ERROR) " "$OUT/tests.log" | sed -E 's/.*(FAILED|ERROR) //' | sort -u > "$OUT/failed.txt"
if [ -s "$OUT/failed.txt" ]; then
  timeout 60 python3 -m pytest $(cat "$OUT/failed.txt") -q -ra -p no:cacheprovider --tb=long > "$OUT/rerun.log" 2>&1
  echo "rerun rc=$?"; tail -40 "$OUT/rerun.log"
fi
stamp rerun
timeout 100 python3 bench/ops_timing.py > "$OUT/ops_timing.log" 2>&1; echo "ops_timing rc=$?"
timeout 80 python3 bench/ops_timing.py --op poly_norm_mul > "$OUT/ops_timing_mul.log" 2>&1; echo "ops_timing_mul rc=$?"
stamp timing
