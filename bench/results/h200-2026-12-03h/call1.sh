#!/usr/bin/env bash
# Twenty-fifth session, call 1 (issue 13 target 2, issue 15; bench/NOTES.md v27). Two builds in
# parallel: n (the tree: the realigned backward works in one phase a row, realigning only the
# tensors not in it) and m (call1_csrc.patch reversed: main before it). build_compare.py m n n m
# at 2^26: contiguous rows, views of x, mul and grad_y (Hv) and of x alone (Hx); the GPU tests
# of every misaligned and CUDA case of the kernels, the fused op, the grouped op and the
# clusters on n; sass_load_order on n.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03h/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
D=bench/results/h200-2026-12-03h
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
rm -rf /tmp/m && mkdir /tmp/m && cp -r csrc polynorm setup.py pyproject.toml /tmp/m/
(cd /tmp/m && patch -R -p1 -s < "$ROOT/$D/call1_csrc.patch") || echo "patch m failed"
(MAX_JOBS=8 python3 setup.py build_ext --inplace > /tmp/build_n.log 2>&1; echo "n rc=$?") &
(cd /tmp/m && MAX_JOBS=8 python3 setup.py build_ext --inplace > /tmp/build_m.log 2>&1; echo "m rc=$?") &
wait
stamp builds
tar czf "$OUT/builds.tgz" -C /tmp build_n.log build_m.log
path_of() { if [ $1 = n ]; then echo $ROOT; else echo /tmp/$1; fi; }
(python3 bench/sass_load_order.py $(ls polynorm/_C*.so) > "$OUT/sass_load_order_n.log" 2>&1; echo "sass n rc=$?") &
export PYTHONPATH=$ROOT
timeout 240 python3 -m pytest tests/test_kernels.py tests/test_mul.py tests/test_grouped.py tests/test_clusters.py \
  -k "cuda or misaligned or gpu or layouts" -q -ra -p no:cacheprovider -n 16 > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20
tail -3 "$OUT/tests.log"
gzip -f "$OUT/tests.log"
stamp tests
{
  for v in m n n m; do
    (cd /tmp && PYTHONPATH=$(path_of $v) timeout 75 python3 "$ROOT/bench/build_compare.py" $v \
      4096 5125 4097 16385 1001 4096v 4097v 5125v 16385v 2001v 4096x 4097x 5125x 16385x 2001x)
  done
} 2>&1 | tee "$OUT/compare_mn.log"
stamp compare
wait
tail -2 "$OUT/sass_load_order_n.log"
stamp end
