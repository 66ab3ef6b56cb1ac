#!/usr/bin/env bash
# Nineteenth session, call 1 (issue 13; bench/NOTES.md v21): the eighteenth session's call 5 (never
# run), plus free tunings (tune_rows, no rebuild) of the stagger at 32768 / 65536 and of the odd-H
# backward's grids, and odd rows at other pack counts (exp_packs.py) on the experiment build
# (call1_experiment.patch on the commit of this script, applied in the tree the call ran). Call 5's part: the forward's fixed cost against the last wave's fill (exp_waves.py), the long rows' table (not timed since v18), the fused
# forward at 16384 on two CTAs of 128, and an
# attempt at ncu's PmSampling (DRAM throughput over time) of the forward and the copy at 4096.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03b/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
gzip -f "$OUT/build.log"
stamp build
timeout 150 python3 bench/results/h200-2026-12-03b/exp_packs.py 2>&1 | tee "$OUT/exp_packs.log"
stamp packs
timeout 60 python3 bench/results/h200-2026-12-03/exp_waves.py 2>&1 | tee "$OUT/exp_waves.log"
stamp waves
{
  timeout 30 python3 bench/tune_rows.py --table-only --aligned-only --H 131072 262144
  # the fused forward at 16384 (1.10: one CTA of 256, persistent) against two CTAs of 128 (--cta 128)
  timeout 30 python3 bench/tune_rows.py --op poly_norm_mul --table-only --aligned-only --cta 128 --H 16384 131072
  # free tunings (no rebuild): the stagger at 32768 (first wave) / 65536 (persistent, 7.75 rounds: under
  # kRowStaggerRounds, so not staggered by the table), two CTAs of 128 at 32768; the odd-H backward's grids
  timeout 40 python3 bench/tune_rows.py --table-only --aligned-only --stagger 750 1500 3000 --cta 128 --H 32768 65536
  timeout 40 python3 bench/tune_rows.py --op poly_norm_mul --table-only --aligned-only --stagger 750 1500 --H 32768 65536
  timeout 60 python3 bench/tune_rows.py --aligned-only --stagger 1500 --H 5125 16385
} 2>&1 | tee "$OUT/tune_long.log"
stamp long
