#!/usr/bin/env bash
# Fourteenth session, call 4 (issues 13, 15): the final table (CTAs of 128 only where they hold no
# more threads than the one-tier plan): the rows whose plan moved since call 3 against the old
# table (--cta 512) in the same run, then the whole suite.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02c/call4.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
{
  timeout 40 python3 bench/tune_rows.py --table-only --aligned-only --cta 512 --H 9000 10240 12288 14336 16384 40960
  timeout 30 python3 bench/tune_rows.py --op poly_norm_mul --table-only --aligned-only --cta 512 --H 4608 5125 6144 16385
} 2>&1 | tee "$OUT/tune.log"
stamp tune
/usr/bin/time -f "suite wall %e s" timeout -s INT 320 python3 -m pytest tests/test_pt2.py tests/test_grouped.py \
  tests/test_training.py tests -v -ra -p no:cacheprovider -n 16 --dist loadgroup --durations=15 > "$OUT/tests.log" 2>&1
echo "pytest rc=$?"
grep -E "\] (FAILED|ERROR) |^FAILED|^ERROR|passed|failed|suite wall" "$OUT/tests.log" | head -20
grep -E "PASSED|SKIPPED|XFAIL" "$OUT/tests.log" | sed -E 's/.*(PASSED|SKIPPED|XFAIL).*/\1/' | sort | uniq -c
stamp suite
grep -E "\] (FAILED|ERROR) " "$OUT/tests.log" | sed -E 's/.*(FAILED|ERROR) //' | sort -u > "$OUT/failed.txt"
