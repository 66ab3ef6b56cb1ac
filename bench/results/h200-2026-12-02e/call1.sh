#!/usr/bin/env bash
# Sixteenth session, call 1 (issues 13, 15): three bench-only switches of the row backward, timed
# side by side in one build (bench/tune_rows.py: --variant, --early, --stagger; bench/NOTES.md v18):
# the same-phase build's trimmed variant (b-v1), the blocks' partials published before their last
# outputs (b-e; bw0-e on a block per R rows), the persistent grid started in staggered quarters
# (b-s<N>); then ncu of the table's backward at H = 16384, 16385 and 5125, and the fused op's at 5125
# (warp states, stall samples by opcode: bench/ncu_sass_summary.py).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02e/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
T="timeout 100 python3 bench/tune_rows.py --table-only --aligned-only"
{
  $T --H 1024 4096 16384 65536 4097 5125 16385 --variant --early --stagger 1500 3000
  $T --op poly_norm_mul --H 4096 65536 5125 16385 --variant --early
} 2>&1 | tee "$OUT/tune.log"
stamp tune
mkdir -p "$OUT/ncu"
for spec in "16384 table" "16385 table" "5125 table" "5125 table mul"; do
  if (( $(date +%s) - t0 > 520 )); then echo "ncu $spec: skipped (time)"; continue; fi
  set -- $spec
  rep="$OUT/ncu/bwd_$1${3:+_$3}"
  timeout 90 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section SourceCounters --section LaunchStats -k regex:bwd_row_kernel -c 1 -f \
    -o "$rep" python3 bench/profile_rows.py $1 $2 ${3:-} > "$rep.log" 2>&1; echo "ncu $spec rc=$?"
  ncu --import "$rep.ncu-rep" --page details --print-details all > "$rep.txt" 2>&1
  ncu --import "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.sass.csv" 2>&1
  python3 bench/ncu_sass_summary.py "$rep.sass.csv" > "$rep.sass.txt" 2>&1
  rm -f "$rep.ncu-rep" "$rep.sass.csv"
  grep -E "^  +(Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Issued Warp Per Scheduler|Registers Per Thread)" "$rep.txt" | head -8
  stamp "ncu $spec"
done
tar czf "$OUT/ncu.tgz" -C "$OUT" ncu && rm -rf "$OUT/ncu"
