#!/usr/bin/env bash
# Thirteenth session, call 1 (issues 13, 15): the cluster rows' exchange through mbarriers
# (_tune_rows' tx_exchange, reduce.cuh's ClusterStart / cluster_row_reduce) beside the cluster
# barrier, clusters of 16 for the longest rows, and the one-pack trim of half-idle odd rows for
# every op and dtype (row_packs; _tune_rows' trim_packs=False: without it), all in one build.
# Then racecheck and memcheck over cluster_check.py with the mbarrier exchange, and the plan's and
# the clusters' test files.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02b/call1.sh
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
T="timeout 100 python3 bench/tune_rows.py --table-only --aligned-only"
{
  $T --tx --cluster16 --H 32768 65536 131072 262144
  $T --op poly_norm_mul --tx --cluster16 --H 16384 32768 65536 131072 262144
} 2>&1 | tee "$OUT/tune_tx.log"
stamp tune_tx
{
  $T --no-trim --H 5125 3001 4097 16385
  $T --op poly_norm_mul --no-trim --H 5125 3001 4097 16385
  $T --dtype float32 --no-trim --H 5125 3001 4097 16385
  $T --op poly_norm_mul --dtype float32 --no-trim --H 5125 4097
} 2>&1 | tee "$OUT/tune_trim.log"
stamp tune_trim
timeout 60 compute-sanitizer --tool racecheck --racecheck-report hazard python3 $HERE/cluster_check.py --tx > "$OUT/racecheck_tx.log" 2>&1
echo "racecheck tx rc=$?"; grep -E "eps|bad cases|SUMMARY" "$OUT/racecheck_tx.log" | tail -14
timeout 40 compute-sanitizer --tool memcheck python3 $HERE/cluster_check.py --tx > "$OUT/memcheck_tx.log" 2>&1
echo "memcheck tx rc=$?"; tail -1 "$OUT/memcheck_tx.log"
stamp sanitizers
timeout 120 python3 -m pytest tests/test_launch_plan.py tests/test_clusters.py -q -ra -p no:cacheprovider -n 16 \
  > "$OUT/tests_plan_clusters.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR|passed|failed" "$OUT/tests_plan_clusters.log" | head -20
stamp tests
