#!/usr/bin/env bash
# Twelfth session, call 1 (issues 13, 15): the cluster rows' start barrier (ClusterStart,
# reduce.cuh) and 7 packs a thread for PolyNorm's half-idle 2-byte odd rows (row_packs,
# launch_plan.h). Built in place: the kernels' timing first (PolyNorm at odd H and on clusters;
# the fused op on clusters and at 5125), then racecheck over cluster_check.py and stage_check.py,
# memcheck over cluster_check.py, and the plan's and the clusters' test files.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
HERE=bench/results/h200-2026-12-02
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
timeout 100 python3 bench/tune_rows.py --table-only --aligned-only --H 5125 3001 4097 16385 65537 32768 65536 131072 262144 2>&1 | tee "$OUT/tune.log"
stamp tune
timeout 60 python3 bench/tune_rows.py --op poly_norm_mul --table-only --aligned-only --H 16384 32768 65536 5125 2>&1 | tee "$OUT/tune_mul.log"
stamp tune_mul
timeout 60 compute-sanitizer --tool racecheck --racecheck-report hazard python3 $HERE/cluster_check.py > "$OUT/racecheck_clusters.log" 2>&1
echo "racecheck clusters rc=$?"; grep -E "eps|bad cases|SUMMARY" "$OUT/racecheck_clusters.log" | tail -14
timeout 45 compute-sanitizer --tool racecheck --racecheck-report hazard python3 bench/results/h200-2026-12-01g/stage_check.py > "$OUT/racecheck_stage.log" 2>&1
echo "racecheck stage rc=$?"; grep -E "bits|bad cases|SUMMARY" "$OUT/racecheck_stage.log" | tail -14
timeout 40 compute-sanitizer --tool memcheck python3 $HERE/cluster_check.py > "$OUT/memcheck_clusters.log" 2>&1
echo "memcheck rc=$?"; tail -1 "$OUT/memcheck_clusters.log"
stamp sanitizers
timeout 90 python3 -m pytest tests/test_launch_plan.py tests/test_clusters.py -q -ra -p no:cacheprovider -n 16 \
  > "$OUT/tests_plan_clusters.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR|passed|failed" "$OUT/tests_plan_clusters.log" | head -20
stamp tests
