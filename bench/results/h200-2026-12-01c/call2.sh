#!/usr/bin/env bash
# Seventh session, call 2 (issues 13, 15): main (call 1's b, mask_row_end without the idle skip,
# adopted; the backward's grid sized by one build for every layout; non-portable clusters allowed
# for the launched kernel) against e: the wide builds for every row, odd H included (16 packs of x
# forward, 8 each backward; the fused op 8 and 4), with a wide same-phase build
# (call2_wide_odd.patch; ptxas: 0 bytes of spills). The kernel tests at e (the candidate), then
# tune_rows (PolyNorm bf16 and fp32, the fused op) on both.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01c/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
rm -rf /tmp/e && mkdir /tmp/e && cp -r csrc polynorm setup.py pyproject.toml tests /tmp/e/
(cd /tmp/e/csrc && patch -p1 -s < "$ROOT/bench/results/h200-2026-12-01c/call2_wide_odd.patch" && echo "e patched")
(MAX_JOBS=8 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "main rc=$?") &
(cd /tmp/e && MAX_JOBS=8 python3 setup.py build_ext --inplace > "$OUT/build_e.log" 2>&1; echo "e rc=$?") &
wait
stamp builds
(cd /tmp/e && PYTHONPATH=/tmp/e timeout 170 python3 -m pytest tests/test_parity.py tests/test_kernels.py tests/test_clusters.py \
  tests/test_launch_plan.py tests/test_mul.py tests/test_grouped.py -q -ra -p no:cacheprovider -k "cuda or clusters or launch" -n 14 \
  > "$OUT/tests_kernels_e.log" 2>&1; echo "pytest kernels (e) rc=$?")
grep -E "^FAILED|^ERROR" "$OUT/tests_kernels_e.log" | head -20; tail -1 "$OUT/tests_kernels_e.log"
stamp tests
for v in main e; do
  dir=$ROOT; [ $v = e ] && dir=/tmp/e
  (cd /tmp && PYTHONPATH=$dir timeout 40 python3 "$ROOT/bench/tune_rows.py" --H 1024 8192 3000 4097 5125 16385 65537 2>&1 | tee "$OUT/tune_$v.log")
  (cd /tmp && PYTHONPATH=$dir timeout 30 python3 "$ROOT/bench/tune_rows.py" --dtype float32 --H 2048 4097 5125 16385 --aligned-only 2>&1 \
    | tee -a "$OUT/tune_$v.log")
  (cd /tmp && PYTHONPATH=$dir timeout 30 python3 "$ROOT/bench/tune_rows.py" --op poly_norm_mul --H 4096 4097 5125 16385 2>&1 \
    | tee -a "$OUT/tune_$v.log")
  stamp tune_$v
done
