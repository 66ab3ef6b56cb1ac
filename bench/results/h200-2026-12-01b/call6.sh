#!/usr/bin/env bash
# Sixth session, call 6 (issue 13): the wide realigning builds (views of whole-pack rows that start
# off a 16-byte boundary) at 128 registers, where they spill 100-230 bytes (a: the table's), against
# the same builds free to take 255 registers (b: -DPOLYNORM_WIDE_REALIGN_MIN_BLOCKS=1, no spills, 2
# CTAs of 128 threads an SM). Two in-place builds side by side (no pip install, so PYTHONPATH picks
# each), then tune_rows on aligned rows and views at H = 2048, 8192, 16384.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01b/call6.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
for v in a b; do rm -rf /tmp/$v && mkdir /tmp/$v && cp -r csrc polynorm setup.py pyproject.toml /tmp/$v/; done
(cd /tmp/a && MAX_JOBS=8 python3 setup.py build_ext --inplace > "$OUT/build_a.log" 2>&1; echo "a rc=$?") &
(cd /tmp/b && POLYNORM_NVCC_FLAGS=-DPOLYNORM_WIDE_REALIGN_MIN_BLOCKS=1 MAX_JOBS=8 python3 setup.py build_ext --inplace \
  > "$OUT/build_b.log" 2>&1; echo "b rc=$?") &
wait
echo "[builds at $(( $(date +%s) - t0 )) s]"
for v in a b; do
  echo "## $v"
  PYTHONPATH=/tmp/$v timeout 40 python3 "$ROOT/bench/tune_rows.py" --H 2048 8192 16384 2>&1 | tee "$OUT/tune_$v.log"
done
echo "[done at $(( $(date +%s) - t0 )) s]"
