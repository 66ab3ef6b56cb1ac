#!/usr/bin/env bash
# Thirtieth session, call 4 (issue 15; bench/NOTES.md v33), at the commit of call 3: the fused op through autograd,
# side by side (bench.py --op poly_norm_mul --quick: the README's table of the fused op), and ncu of the fused
# backward's kernel at 13094 x 5125 (the tail plan: one CTA of 160) and 16380 x 4097 (one CTA of 128).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04e/call4.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
D=$(pwd)/bench/results/h200-2026-12-04b
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
ls polynorm/_C*.so > /dev/null 2>&1 || { MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > /dev/null 2>&1; echo "build rc=$?"; }
stamp start
timeout 200 python3 bench/bench.py --op poly_norm_mul --quick --out "$OUT/bench_mul" > "$OUT/bench_mul.log" 2>&1
echo "bench rc=$?"; tail -3 "$OUT/bench_mul.log"; cat "$OUT/bench_mul/polynorm_mul_summary.md" 2>/dev/null | head -40
tar czf "$OUT/bench_mul.tgz" -C "$OUT" bench_mul && rm -rf "$OUT/bench_mul"
stamp bench
for case in "13094 5125" "16380 4097"; do
  set -- $case
  timeout 60 ncu --profile-from-start off --clock-control none -k regex:bwd_row_kernel -c 1 --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats \
    python3 $D/ncu_case.py $1 $2 mul_backward > "$OUT/ncu_mul_bwd_$2.txt" 2>&1; echo "ncu $2 rc=$?"
done
grep -E "Duration|Memory Throughput|DRAM Throughput|Executed Ipc|Registers Per|Achieved Occupancy|Theoretical Occ|Executed Instructions  |Block Size|Grid Size|Stall|Warp Cycles Per Issued" "$OUT"/ncu_mul_bwd_*.txt | head -40
stamp ncu
