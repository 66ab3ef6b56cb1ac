#!/usr/bin/env bash
# Twelfth session, call 2 (issues 13, 15): call 1's kernels (commit of call 1's script, unchanged
# csrc). racecheck over cluster_check.py with the oracle on the CPU (call 1's report was filled by
# torch's own reduce_kernel computing the oracle on the GPU), then the whole GPU suite.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02/call2.sh
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
timeout 60 compute-sanitizer --tool racecheck --racecheck-report hazard python3 $HERE/cluster_check.py > "$OUT/racecheck_clusters.log" 2>&1
echo "racecheck clusters rc=$?"; grep -E "eps|bad cases|SUMMARY" "$OUT/racecheck_clusters.log" | tail -14
stamp racecheck
/usr/bin/time -f "suite wall %e s" timeout -s INT 320 python3 -m pytest tests/test_pt2.py tests/test_grouped.py \
  tests/test_training.py tests -q -ra -p no:cacheprovider -n 16 --dist loadgroup --durations=15 > "$OUT/tests.log" 2>&1
echo "pytest rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|suite wall" "$OUT/tests.log" | head -40
stamp suite
