#!/usr/bin/env bash
# Twenty-seventh session, call 3 (issues 13, 15; bench/NOTES.md v29): the tree (clusters of 16 CTAs
# launched with load balancing, csrc/launch_plan.h row_cluster_policy). Build; tune_rows' table
# against --policy 0 (the default policy everywhere) at the rows of 16 CTAs and beside them, twice;
# then the whole GPU suite.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04b/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"; gzip -f "$OUT/build.log"
stamp build
for pass in 1 2; do
  timeout 40 python3 bench/tune_rows.py --table-only --aligned-only --policy 0 --H 131072 262144
  timeout 40 python3 bench/tune_rows.py --op poly_norm_mul --table-only --aligned-only --policy 0 --H 65536 131072
done 2>&1 | tee "$OUT/tune.log"
stamp tune
/usr/bin/time -f "suite wall %e s" timeout -s INT 330 python3 -m pytest tests/test_pt2.py tests/test_grouped.py \
  tests/test_training.py tests -v -ra -p no:cacheprovider -n 16 --dist loadgroup --durations=15 > "$OUT/tests.log" 2>&1
echo "pytest rc=$?"
grep -E "\] (FAILED|ERROR) |^FAILED|^ERROR|passed|failed|suite wall" "$OUT/tests.log" | head -20
grep -E "\] (FAILED|ERROR) " "$OUT/tests.log" | sed -E 's/.*(FAILED|ERROR) //' | sort -u > "$OUT/failed.txt"
gzip -f "$OUT/tests.log"
stamp suite
