#!/usr/bin/env bash
# Tenth session, call 5 (issue 13; the eleventh session's plan item 0, with the device time
# left): why the forward on a persistent grid is slower than on a block per R rows, and how the
# backward does on a block per R rows. tune_rows (bf16, aligned, every grid column, bw0 new)
# at H = 1024, 4096, 16384; then ncu of the four row launches of grid_profile.py at 16384 x 4096.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01f/call5.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
ROOT=$(pwd)
HERE=$ROOT/bench/results/h200-2026-12-01f
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
MAX_JOBS=16 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
(cd /tmp && timeout 40 python3 "$ROOT/bench/tune_rows.py" --aligned-only --H 1024 4096 16384 2>&1 | tee "$OUT/tune.log")
stamp tune
rep="$OUT/ncu_grid"
(cd /tmp && timeout 90 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
  --section WarpStateStats --section LaunchStats --section SchedulerStats \
  -k regex:row_kernel --launch-skip 5 -c 4 -f -o "$rep" python3 "$HERE/grid_profile.py" 16384 4096 > "$rep.log" 2>&1)
echo "ncu rc=$?"
ncu --import "$rep.ncu-rep" --page details --print-details all > "$rep.txt" 2>&1
grep -E "^  poly_norm|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Grid Size|Block Size|Issued Warp|No Eligible|Stall|Eligible Warps" "$rep.txt" | head -120
tar czf "$OUT/ncu_grid.tgz" -C "$OUT" ncu_grid.log ncu_grid.ncu-rep ncu_grid.txt && rm -f "$OUT"/ncu_grid.{log,ncu-rep,txt}
stamp ncu
