#!/usr/bin/env bash
# Eighteenth session, call 1 (issues 13, 15; bench/NOTES.md v20): the EXPERIMENT build
# (call1_experiment.patch: the forward's block geometry from the environment) with the sum
# kernel's batched loads (the seventeenth session's next_sum_loads.patch). The forward's fixed
# cost (M·H 2^24-2^28) and block variants (exp_fwd.py); the sum apart (tune_rows --apart); ncu of
# the forward (table, blocks of 32) and of the sum kernel; the kernel tests the seventeenth
# session's review changed.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
D=bench/results/h200-2026-12-03
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
gzip -f "$OUT/build.log"
stamp build
timeout 120 python3 $D/exp_fwd.py 2>&1 | tee "$OUT/exp_fwd.log"
stamp exp_fwd
{
  timeout 40 python3 bench/tune_rows.py --table-only --apart 0 1 --H 512 1024 2048 4096 8192 16384 65536 3000
  timeout 25 python3 bench/tune_rows.py --op poly_norm_mul --table-only --aligned-only --apart 0 1 --H 4096 16384 65536
} 2>&1 | tee "$OUT/tune.log"
stamp tune
for v in table 32; do
  POLYNORM_EXP_FWD_BLOCK=$([ $v = table ] && echo 0 || echo $v) timeout 60 ncu --clock-control none \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
    -k regex:fwd_row_kernel -c 1 python3 bench/profile_rows.py 4096 > "$OUT/ncu_fwd4096_$v.txt" 2>&1; echo "ncu $v rc=$?"
done
timeout 60 ncu --clock-control none --section SpeedOfLight -k regex:param_sum -c 1 \
  python3 bench/profile_rows.py 4096 > "$OUT/ncu_param_sum4096.txt" 2>&1; echo "ncu sum rc=$?"
grep -E "Duration|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued" "$OUT"/ncu_*.txt
stamp ncu
timeout -s INT 150 python3 -m pytest tests/test_kernels.py tests/test_launch_plan.py -q -p no:cacheprovider -n 16 \
  -k "apart or graph or many_rows or stagger" > "$OUT/tests.log" 2>&1
echo "pytest rc=$?"; tail -3 "$OUT/tests.log"
stamp tests
