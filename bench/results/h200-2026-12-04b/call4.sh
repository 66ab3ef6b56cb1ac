#!/usr/bin/env bash
# Twenty-seventh session, call 4 (bench/NOTES.md v29): call 3's suite failed 43 tests of
# tests/test_clusters.py in their own parser (`_launch_plan`'s new ` policy=N` after `cluster=N`),
# before any launch; the parser fixed, the cluster and launch-plan tests again, on the tree.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04b/call4.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
ls polynorm/_C*.so > /dev/null 2>&1 && echo "warm build" || { MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"; gzip -f "$OUT/build.log"; }
stamp build
timeout 120 python3 -m pytest tests/test_clusters.py tests/test_launch_plan.py -v -ra -p no:cacheprovider -n 16 \
  > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -10; tail -1 "$OUT/tests.log"; gzip -f "$OUT/tests.log"
stamp end
