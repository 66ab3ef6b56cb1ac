#!/usr/bin/env bash
# Twenty-eighth session, call 5 (bench/NOTES.md, the next session's plan, item 1): main's csrc (as
# c48cc6e). Where a long row's round trip goes: Nsight Compute's warp stall sampling by SASS line
# (SourceCounters, `--page source --print-source sass --csv`) and WarpStateStats of PolyNorm's bf16
# backward at 262144 (16 x 256) and 65536 (8 x 128), M·H = 2^26 (`h200-2026-12-04b/ncu_case.py`).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04c/call5.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
D=$(pwd)/bench/results/h200-2026-12-04b
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"; gzip -f "$OUT/build.log"
stamp build
for case in "256 262144" "1024 65536"; do
  set -- $case
  timeout 45 ncu --profile-from-start off --clock-control none -k regex:bwd_row_kernel -c 1 \
    --section WarpStateStats --section SourceCounters python3 $D/ncu_case.py $1 $2 backward > "$OUT/stalls_$2.txt" 2>&1
  echo "ncu details $2 rc=$?"
  timeout 45 ncu --profile-from-start off --clock-control none -k regex:bwd_row_kernel -c 1 \
    --section WarpStateStats --section SourceCounters --page source --print-source sass --csv \
    python3 $D/ncu_case.py $1 $2 backward > "$OUT/source_$2.csv" 2>&1
  echo "ncu source $2 rc=$?"; gzip -f "$OUT/source_$2.csv"
  stamp "ncu $2"
done
