#!/usr/bin/env bash
# Twenty-ninth session, call 5 (bench/NOTES.md v32), on call 4's warm machine and build (92fa7b1, whose
# backward kernels are 0cc0648's): where PolyNorm's bf16 backward at 262144 (16 x 256) spends its time now
# that the slots are read four at a time: SpeedOfLight, MemoryWorkloadAnalysis, WarpStateStats and the
# stall samples by SASS line (`h200-2026-12-04b/ncu_case.py`), and the fused backward at 131072 (staged).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04d/call5.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
D=$(pwd)/bench/results/h200-2026-12-04b
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
ls polynorm/_C*.so > /dev/null 2>&1 || { MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > /dev/null 2>&1; echo "build rc=$?"; }
timeout 60 ncu --profile-from-start off --clock-control none -k regex:bwd_row_kernel -c 1 --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section WarpStateStats --section SourceCounters \
  python3 $D/ncu_case.py 256 262144 backward > "$OUT/details_262144.txt" 2>&1; echo "ncu details rc=$?"
timeout 60 ncu --profile-from-start off --clock-control none -k regex:bwd_row_kernel -c 1 \
  --section WarpStateStats --section SourceCounters --page source --print-source sass --csv \
  python3 $D/ncu_case.py 256 262144 backward > "$OUT/source_262144.csv" 2>&1; echo "ncu source rc=$?"; gzip -f "$OUT/source_262144.csv"
stamp ncu
