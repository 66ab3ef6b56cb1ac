#!/usr/bin/env bash
# Twenty-seventh session, call 1 (issues 13, 15; bench/NOTES.md v29): build main, then Nsight Compute
# details (SpeedOfLight, Occupancy, LaunchStats, WarpStateStats, SchedulerStats,
# MemoryWorkloadAnalysis) of the row kernels where the targets are missed: the long-row backward
# (65536 / 131072 / 262144), the forward at 65536, the fused backward at 5125 (and 4097 beside
# it), and the views at 5125 (forward and backward, with their contiguous rows), bf16, M·H = 2^26.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04b/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT/ncu"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
D=$(pwd)/bench/results/h200-2026-12-04b
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
ls polynorm/_C*.so > /dev/null 2>&1 && echo "warm build" || { MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"; gzip -f "$OUT/build.log"; }
stamp build
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
while read -r M H op; do
  k=bwd_row_kernel; case $op in *forward) k=fwd_row_kernel;; esac
  timeout 60 ncu --profile-from-start off --clock-control none -k regex:$k -c 1 $S \
    python3 $D/ncu_case.py $M $H $op > "$OUT/ncu/${op}_${H}.txt" 2>&1; echo "ncu $op $H rc=$?"
done <<'CASES'
256 262144 backward
512 131072 backward
1024 65536 backward
1024 65536 forward
16384 4096 forward
13094 5125 mul_backward
16380 4097 mul_backward
13094 5125 backward
13094 5125v backward
13094 5125v forward
CASES
stamp ncu
grep -H -E "^    (Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Block Size|Cluster Size|Grid Size|Waves Per SM|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Max Active Clusters|Active Warps Per Scheduler|Eligible Warps)" "$OUT"/ncu/*.txt | sed -E 's#.*/ncu/##; s/ +/ /g' > "$OUT/ncu_summary.txt"
tar czf "$OUT/ncu.tgz" -C "$OUT" ncu && rm -rf "$OUT/ncu"
stamp end
