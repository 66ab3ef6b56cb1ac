#!/usr/bin/env bash
# Fourteenth session, call 1 (issues 13, 15): the cluster rows on smaller CTAs (tune_rows --cta 128
# and 64 beside the table's), 65537 and 16385, the fused op from 8192; racecheck and memcheck over
# cluster rows that walk several rows each (cluster_rows_check.py; the __syncwarp before the
# st.async stores is in this build); ncu of the 131072 backward (the table's and on CTAs of 128).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02c/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
HERE=bench/results/h200-2026-12-02c
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
T="timeout 120 python3 bench/tune_rows.py --table-only --aligned-only --cta 128 64"
{
  $T --H 16384 32768 65536 131072 262144 16385 65537
  $T --op poly_norm_mul --H 8192 16384 32768 65536 131072
} 2>&1 | tee "$OUT/tune.log"
stamp tune
timeout 120 compute-sanitizer --tool racecheck --racecheck-report hazard python3 $HERE/cluster_rows_check.py > "$OUT/racecheck.log" 2>&1
echo "racecheck rc=$?"; grep -E "eps|bad cases|SUMMARY" "$OUT/racecheck.log" | tail -14
stamp racecheck
timeout 60 compute-sanitizer --tool memcheck python3 $HERE/cluster_rows_check.py > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -1 "$OUT/memcheck.log"
stamp memcheck
for tune in table cta_threads:128; do
  rep="$OUT/ncu_131072_${tune//[:,]/_}"
  args="131072"; [ "$tune" != table ] && args="131072 $tune"
  timeout 90 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section SourceCounters --section LaunchStats \
    -k regex:bwd_row_kernel -c 1 -f -o "$rep" python3 bench/profile_rows.py $args > "$rep.log" 2>&1; echo "ncu $tune rc=$?"
  ncu --import "$rep.ncu-rep" --page details --print-details all > "$rep.txt" 2>&1
  ncu --import "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.sass.csv" 2>&1
  grep -E "Duration|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|Registers Per|Block Size|Grid Size|Cluster Size" "$rep.txt" | head -12
done
tar czf "$OUT/ncu.tgz" -C "$OUT" $(cd "$OUT" && ls ncu_131072_*) && rm -f "$OUT"/ncu_131072_*
stamp ncu
