#!/usr/bin/env bash
# Twenty-sixth session, call 4 (issue 13 target 2; bench/NOTES.md v28): the realigned backward's
# phase. Two builds in parallel: t (the tree) and b (call4_b.patch: grad_x's phase always, so
# that inputs are realigned in and outputs never out; call 1 found an input realigned in cheaper
# than an output realigned out in the forward). The misaligned tests on b, then
# build_compare.py t b b t at the views.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04/call4.sh
set -uo pipefail
OUT="${OUT:-out}"
D=bench/results/h200-2026-12-04
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
rm -rf /tmp/b && mkdir /tmp/b && cp -r csrc polynorm setup.py pyproject.toml tests /tmp/b/
(cd /tmp/b && patch -p1 -s < "$ROOT/$D/call4_b.patch") || echo "patch b failed"
(MAX_JOBS=8 python3 setup.py build_ext --inplace > /tmp/build_t.log 2>&1; echo "t rc=$?") &
(cd /tmp/b && MAX_JOBS=8 python3 setup.py build_ext --inplace > /tmp/build_b.log 2>&1; echo "b rc=$?") &
wait
stamp builds
path_of() { if [ $1 = t ]; then echo $ROOT; else echo /tmp/$1; fi; }
{
  for v in t b b t; do
    (cd /tmp && PYTHONPATH=$(path_of $v) timeout 45 python3 "$ROOT/bench/build_compare.py" $v \
      4096 4097v 5125v 16385v 2001v 3000v 4097x 5125x)
  done
} 2>&1 | tee "$OUT/compare_tb.log"
stamp compare
(cd /tmp/b && PYTHONPATH=/tmp/b timeout 90 python3 -m pytest tests/test_kernels.py tests/test_mul.py \
  tests/test_grouped.py tests/test_clusters.py -k "misaligned or layout or stride" -q -ra -p no:cacheprovider -n 16 \
  > "$OUT/tests_b.log" 2>&1; echo "pytest b rc=$?")
grep -E "^FAILED|^ERROR" "$OUT/tests_b.log" | head -5
tail -1 "$OUT/tests_b.log"
gzip -f "$OUT/tests_b.log"
stamp end
