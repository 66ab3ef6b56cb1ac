#!/usr/bin/env bash
# Thirteenth session, call 2 (issues 13, 15): the table after call 1 (the mbarrier exchange as the
# only one, clusters of up to 16 CTAs, the trim for every op but the fused backward): the long rows
# with clusters of at most 8 beside (-k8: tiled where the table takes 16), racecheck and memcheck
# over cluster_check.py, the plan's and the clusters' test files.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02b/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
HERE=bench/results/h200-2026-12-02b
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
T="timeout 100 python3 bench/tune_rows.py --table-only --aligned-only --cluster8"
{
  $T --H 32768 65536 131072 262144
  $T --op poly_norm_mul --H 16384 32768 65536 131072 262144
} 2>&1 | tee "$OUT/tune.log"
stamp tune
timeout 60 compute-sanitizer --tool racecheck --racecheck-report hazard python3 $HERE/cluster_check.py > "$OUT/racecheck.log" 2>&1
echo "racecheck rc=$?"; grep -E "eps|bad cases|SUMMARY" "$OUT/racecheck.log" | tail -14
timeout 40 compute-sanitizer --tool memcheck python3 $HERE/cluster_check.py > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -1 "$OUT/memcheck.log"
stamp sanitizers
timeout 120 python3 -m pytest tests/test_launch_plan.py tests/test_clusters.py -q -ra -p no:cacheprovider -n 16 \
  > "$OUT/tests_plan_clusters.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR|passed|failed" "$OUT/tests_plan_clusters.log" | head -20
stamp tests
