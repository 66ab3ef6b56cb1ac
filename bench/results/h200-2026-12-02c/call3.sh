#!/usr/bin/env bash
# Fourteenth session, call 3 (issues 13, 15): the table after call 1 (rows split into CTAs of 128
# first; the mbarrier wait at CTA scope) against the old table in the same run (--cta 512: rows
# split past 256 threads wide, 512 narrow, over CTAs of that size, one tier: the geometry of
# before, with this build's wait) and against c128 alone; bf16 both ops, fp32 PolyNorm; the
# plan's and clusters' tests; racecheck over cluster_rows_check.py; ncu of the 131072 backward;
# ops_timing for both ops (the README's kernel tables).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02c/call3.sh
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
T="timeout 120 python3 bench/tune_rows.py --table-only --aligned-only --cta 512 128"
{
  $T --H 4096 8192 12288 16384 32768 65536 131072 262144 3000 4097 5125 9000 16385 65537
  $T --op poly_norm_mul --H 4096 6144 8192 16384 32768 65536 131072 3000 5125 16385
  $T --dtype float32 --H 4096 5125 6144 8192 16384 32768 65536
} 2>&1 | tee "$OUT/tune.log"
stamp tune
timeout 150 python3 -m pytest tests/test_launch_plan.py tests/test_clusters.py -q -ra -p no:cacheprovider -n 16 \
  > "$OUT/tests_plan_clusters.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR|passed|failed" "$OUT/tests_plan_clusters.log" | head -20
stamp tests
timeout 100 compute-sanitizer --tool racecheck --racecheck-report hazard python3 $HERE/cluster_rows_check.py > "$OUT/racecheck.log" 2>&1
echo "racecheck rc=$?"; grep -E "eps|bad cases|SUMMARY" "$OUT/racecheck.log" | tail -8
stamp racecheck
rep="$OUT/ncu_131072"
timeout 60 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SourceCounters \
  -k regex:bwd_row_kernel -c 1 -f -o "$rep" python3 bench/profile_rows.py 131072 > "$rep.log" 2>&1; echo "ncu rc=$?"
ncu --import "$rep.ncu-rep" --page details --print-details all > "$rep.txt" 2>&1
ncu --import "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.sass.csv" 2>&1
grep -E "Duration|DRAM Throughput|Warp Cycles Per Issued|Cluster Size|Block Size" "$rep.txt" | head -6
grep -c "CCTL" "$rep.sass.csv"
rm -f "$OUT"/ncu_131072.ncu-rep  # the text details and SASS table are kept: the report is 27 MB
tar czf "$OUT/ncu.tgz" -C "$OUT" $(cd "$OUT" && ls ncu_131072*) && rm -f "$OUT"/ncu_131072*
stamp ncu
timeout 110 python3 bench/ops_timing.py > "$OUT/ops_timing.log" 2>&1; echo "ops_timing rc=$?"
timeout 100 python3 bench/ops_timing.py --op poly_norm_mul > "$OUT/ops_timing_mul.log" 2>&1; echo "mul_timing rc=$?"
cat "$OUT/ops_timing.log" "$OUT/ops_timing_mul.log" | head -50
stamp timing
