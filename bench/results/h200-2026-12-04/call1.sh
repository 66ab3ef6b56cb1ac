#!/usr/bin/env bash
# Twenty-sixth session, call 1 (issues 13 target 2, 15; bench/NOTES.md v28). Two builds in
# parallel: n (the tree: the backward's pack-realigned build for whole-pack views, the forward's
# realigned build in one phase a row, x's: y realigned out of it) and v (call1_v.patch applied:
# PolyNorm's forward in y's phase, x realigned into it). The misaligned GPU tests on each, then
# build_compare.py n v v n at 2^26: contiguous rows and the views (Hv: x, mul and grad_y one
# element in; Hx: x alone). Main's figures (c58eebb's csrc) are h200-2026-12-03h/call1's n.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
D=bench/results/h200-2026-12-04
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
rm -rf /tmp/v && mkdir /tmp/v && cp -r csrc polynorm setup.py pyproject.toml tests /tmp/v/
(cd /tmp/v && patch -p1 -s < "$ROOT/$D/call1_v.patch") || echo "patch v failed"
(MAX_JOBS=8 python3 setup.py build_ext --inplace > /tmp/build_n.log 2>&1; echo "n rc=$?") &
(cd /tmp/v && MAX_JOBS=8 python3 setup.py build_ext --inplace > /tmp/build_v.log 2>&1; echo "v rc=$?") &
wait
stamp builds
tar czf "$OUT/builds.tgz" -C /tmp build_n.log build_v.log
path_of() { if [ $1 = n ]; then echo $ROOT; else echo /tmp/$1; fi; }
(python3 bench/sass_load_order.py $(ls polynorm/_C*.so) > "$OUT/sass_load_order_n.log" 2>&1; echo "sass n rc=$?") &
for v in n v; do
  (cd $(path_of $v) && PYTHONPATH=$(path_of $v) timeout 110 python3 -m pytest tests/test_kernels.py tests/test_mul.py \
    tests/test_grouped.py tests/test_clusters.py -k "misaligned or layout or stride" -q -ra -p no:cacheprovider -n 16 \
    > "$OUT/tests_$v.log" 2>&1; echo "pytest $v rc=$?")
  grep -E "^FAILED|^ERROR" "$OUT/tests_$v.log" | head -10
  tail -1 "$OUT/tests_$v.log"
  gzip -f "$OUT/tests_$v.log"
done
stamp tests
{
  for v in n v v n; do
    (cd /tmp && PYTHONPATH=$(path_of $v) timeout 60 python3 "$ROOT/bench/build_compare.py" $v \
      4096 5125 4096v 4097v 5125v 16385v 2001v 4096x 4097x 5125x 16385x 2001x)
  done
} 2>&1 | tee "$OUT/compare_nv.log"
stamp compare
wait
tail -2 "$OUT/sass_load_order_n.log"
stamp end
