#!/usr/bin/env bash
# Eighth session, call 2 (issue 13): A (call 1's A, adopted; the shift cases removed) against
# C1 (the row kernels' chunk loads and stores cache-streaming, -DPOLYNORM_STREAMING=1), C2 (loads
# with L1::no_allocate and the L2 256-byte sector hint, -DPOLYNORM_STREAMING=2) and W (PolyNorm's
# forward of 2-byte odd rows on the wide build, -DPOLYNORM_ODD_FWD_WIDE: with slot_packs, 4097
# and 16385 leave no slot idle either way). tune_rows at the table's grid for each; then A with
# rows split past 128 and 64 threads a CTA (--cta) at the long rows, PolyNorm and the fused op.
# C1 and C2: call2_streaming.patch (the switch) and its flag; W: call2_odd_forward_wide.patch and its flag.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01d/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
declare -A FLAGS=([c1]=-DPOLYNORM_STREAMING=1 [c2]=-DPOLYNORM_STREAMING=2 [w]=-DPOLYNORM_ODD_FWD_WIDE)
(MAX_JOBS=4 python3 setup.py build_ext --inplace > "$OUT/build_a.log" 2>&1; echo "A rc=$?") &
for v in c1 c2 w; do
  rm -rf /tmp/$v && mkdir /tmp/$v && cp -r csrc polynorm setup.py pyproject.toml /tmp/$v/
  patch_=call2_streaming.patch; [ $v = w ] && patch_=call2_odd_forward_wide.patch
  (cd /tmp/$v/csrc && patch -p1 -s < "$ROOT/bench/results/h200-2026-12-01d/$patch_")
  (cd /tmp/$v && POLYNORM_NVCC_FLAGS=${FLAGS[$v]} MAX_JOBS=4 python3 setup.py build_ext --inplace \
    > "$OUT/build_$v.log" 2>&1; echo "$v rc=$?") &
done
wait
stamp builds
for v in a c1 c2 w; do
  dir=$ROOT; [ $v != a ] && dir=/tmp/$v
  echo "## $v" >> "$OUT/tune.log"
  (cd /tmp && PYTHONPATH=$dir timeout 60 python3 "$ROOT/bench/tune_rows.py" --table-only --aligned-only \
    --H 1024 4096 16384 32768 65536 4097 5125 16385 2>&1 | tee -a "$OUT/tune.log")
  stamp tune_$v
done
echo "## a, --cta" >> "$OUT/tune.log"
(cd /tmp && PYTHONPATH=$ROOT timeout 60 python3 "$ROOT/bench/tune_rows.py" --table-only --aligned-only --cta 128 64 \
  --H 16384 32768 65536 131072 2>&1 | tee -a "$OUT/tune.log")
(cd /tmp && PYTHONPATH=$ROOT timeout 60 python3 "$ROOT/bench/tune_rows.py" --op poly_norm_mul --table-only --aligned-only --cta 128 64 \
  --H 8192 16384 32768 65536 2>&1 | tee -a "$OUT/tune.log")
stamp cta
