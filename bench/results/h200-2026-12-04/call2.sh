#!/usr/bin/env bash
# Twenty-sixth session, call 2 (issues 13 target 2, 15; bench/NOTES.md v28): the tree (call 1's
# v, landed, and the narrow builds' aligned rows on the pack-realigned build: call 1's n and v
# launched the fused forward's aligned 4-pack rows on the staged realigned build without its
# stage, an illegal address). Build, the misaligned GPU tests, build_compare.py twice at the
# views, sass_load_order.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04/call2.sh
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
(python3 bench/sass_load_order.py $(ls polynorm/_C*.so) > "$OUT/sass_load_order.log" 2>&1; echo "sass rc=$?") &
timeout 150 python3 -m pytest tests/test_kernels.py tests/test_mul.py tests/test_grouped.py tests/test_clusters.py \
  -k "misaligned or layout or stride" -q -ra -p no:cacheprovider -n 16 > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -10
tail -1 "$OUT/tests.log"
gzip -f "$OUT/tests.log"
stamp tests
for v in t t; do
  (cd /tmp && timeout 60 python3 "$PYTHONPATH/bench/build_compare.py" $v \
    4096 5125 3000 4096v 4097v 5125v 16385v 2001v 3000v 4096x 4097x 5125x 16385x 2001x)
done 2>&1 | tee "$OUT/compare.log"
stamp compare
wait
tail -2 "$OUT/sass_load_order.log"
stamp end
