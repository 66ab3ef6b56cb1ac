#!/usr/bin/env bash
# Twenty-seventh session, call 2 (issues 13, 15; bench/NOTES.md v29): the rows of clusters under each
# cluster scheduling policy preference (_tune_rows(cluster_policy=...), csrc/launch_plan.h
# row_cluster_policy): the grid each takes (grid_probe.py), then tune_rows' table against
# --policy 1 2 for PolyNorm and the fused op at the cluster rows, bf16, M·H = 2^26; the launch-plan
# and cluster tests.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04b/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
D=$(pwd)/bench/results/h200-2026-12-04b
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"; gzip -f "$OUT/build.log"
stamp build
timeout 60 python3 $D/grid_probe.py 2>&1 | tee "$OUT/grid_probe.log"
stamp probe
timeout 100 python3 bench/tune_rows.py --table-only --aligned-only --policy 1 2 --H 16384 32768 65536 131072 262144 \
  2>&1 | tee "$OUT/tune.log"
timeout 100 python3 bench/tune_rows.py --op poly_norm_mul --table-only --aligned-only --policy 1 2 \
  --H 16384 32768 65536 131072 2>&1 | tee "$OUT/tune_mul.log"
stamp tune
timeout 100 python3 -m pytest tests/test_launch_plan.py tests/test_clusters.py -q -ra -p no:cacheprovider -n 16 \
  > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"; tail -1 "$OUT/tests.log"; gzip -f "$OUT/tests.log"
stamp end
