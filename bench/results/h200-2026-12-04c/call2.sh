#!/usr/bin/env bash
# Twenty-eighth session, call 2 (bench/NOTES.md v30): call 1's table read PolyNorm's bf16 backward
# 10-20% slower than the twenty-seventh session's (16384 1.20 against 1.10, 262144 1.57 against 1.39)
# while the forward and fp32 matched. Was it the tree (fb28942) or the GPU? Both trees built side by
# side on one machine: main's c48cc6e (copied, untracked, into _orig/) and this tree; tune_rows'
# table on each, alternating, twice (this tree with --shared 1 too); the GPU's clocks and throttle
# reasons before and after.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04c/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi -q -d CLOCK,PERFORMANCE,POWER,TEMPERATURE > "$OUT/clocks_before.txt" 2>&1
(cd _orig && MAX_JOBS=8 python3 setup.py build_ext --inplace > "$OUT/build_orig.log" 2>&1; echo "orig build rc=$?") &
MAX_JOBS=8 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
wait
gzip -f "$OUT/build.log" "$OUT/build_orig.log"
stamp build
for pass in 1 2; do
  echo "## main c48cc6e (_orig), pass $pass"
  PYTHONPATH=$(pwd)/_orig timeout 50 python3 bench/tune_rows.py --table-only --aligned-only --H 16384 65536 131072 262144
  echo "## this tree, pass $pass"
  PYTHONPATH=$(pwd) timeout 50 python3 bench/tune_rows.py --table-only --aligned-only --shared 1 --H 16384 65536 131072 262144
done 2>&1 | tee "$OUT/ab.log"
stamp ab
nvidia-smi -q -d CLOCK,PERFORMANCE,POWER,TEMPERATURE > "$OUT/clocks_after.txt" 2>&1
grep -E "Graphics|SM  |Memory  |Active|Slowdown|Power Draw|GPU Current Temp" "$OUT/clocks_after.txt" | head -30
