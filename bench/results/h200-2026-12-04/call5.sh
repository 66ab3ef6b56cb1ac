#!/usr/bin/env bash
# Twenty-sixth session, call 5 (bench/NOTES.md v28): the tree with the realigned rows' phase
# chosen by launch_plan.h's realign_phase (host code; the backward's cost rule of call 4). Build,
# then the misaligned, layout, stride and launch-plan tests.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04/call5.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
gzip -f "$OUT/build.log"
stamp build
timeout 80 python3 -m pytest tests/test_kernels.py tests/test_mul.py tests/test_grouped.py tests/test_clusters.py \
  tests/test_launch_plan.py -k "misaligned or layout or stride or realign" -q -ra -p no:cacheprovider -n 16 \
  > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -10
tail -1 "$OUT/tests.log"
gzip -f "$OUT/tests.log"
stamp end
