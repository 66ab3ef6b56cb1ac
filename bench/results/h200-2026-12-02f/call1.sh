#!/usr/bin/env bash
# Seventeenth session, call 1 (issues 13, 15; bench/NOTES.md v19): where the one-CTA backward's
# time goes (exp_finish.py: the grid against how the dW / dB partials are finished, and the start
# in eighths; bench-only modes in an EXPERIMENT build), and the forward on a persistent, staggered
# grid against the table's block per R rows (tune_rows --persistent --stagger), PolyNorm and the
# fused op, bf16, M·H = 2^26.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02f/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
E="timeout 120 python3 bench/results/h200-2026-12-02f/exp_finish.py"
{
  $E --H 512 1024 4096 8192 16384
  $E --op poly_norm_mul --H 2048 4096 8192
} 2>&1 | tee "$OUT/finish.log"
stamp finish
T="timeout 100 python3 bench/tune_rows.py --table-only --aligned-only --persistent"
{
  $T --H 512 1024 4096 16384 32768 --stagger 750 1500 3000 1050076
  $T --op poly_norm_mul --H 4096 16384 --stagger 1500 3000
} 2>&1 | tee "$OUT/tune.log"
stamp tune
