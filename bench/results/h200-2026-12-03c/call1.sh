#!/usr/bin/env bash
# Twentieth session, call 1 (issues 13, 15; bench/NOTES.md v22): the nineteenth session's csrc (2c72456),
# built here: the README's kernel tables (ops_timing, bf16 PolyNorm and the fused op), the seed
# shapes eager against a CUDA graph's replay (exp_small.py), ncu's durations and DRAM bytes at two
# seed shapes (ncu_small.py), and ncu's profile of the odd-H backward at 5125 against 4097 (plan item 3).
# The whole suite: call 2, on this build.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03c/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
D=bench/results/h200-2026-12-03c
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
gzip -f "$OUT/build.log"
stamp build
timeout 80 python3 bench/ops_timing.py > "$OUT/ops_timing.log" 2>&1; echo "ops_timing rc=$?"
timeout 80 python3 bench/ops_timing.py --op poly_norm_mul > "$OUT/ops_timing_mul.log" 2>&1; echo "mul_timing rc=$?"
cat "$OUT/ops_timing.log" "$OUT/ops_timing_mul.log"
stamp timing
timeout 90 python3 $D/exp_small.py 2>&1 | tee "$OUT/exp_small.log"
stamp small
M="gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size"
M="$M,launch__registers_per_thread,launch__waves_per_multiprocessor,sm__cycles_active.avg,gpc__cycles_elapsed.max"
M="$M,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed"
for H in 1024 4096; do
  timeout 45 ncu --profile-from-start off --clock-control none --csv --metrics "$M" \
    python3 $D/ncu_small.py 2048 $H > "$OUT/ncu_small_$H.csv" 2> "$OUT/ncu_small_$H.err"; echo "ncu small $H rc=$?"
done
stamp ncu_small
for H in 5125 4097; do
  timeout 60 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section InstructionStats --section SchedulerStats --section LaunchStats \
    -k regex:bwd_row_kernel -c 1 python3 bench/profile_rows.py $H > "$OUT/ncu_bwd$H.txt" 2>&1; echo "ncu bwd $H rc=$?"
  gzip -f "$OUT/ncu_bwd$H.txt"
done
stamp ncu_bwd
