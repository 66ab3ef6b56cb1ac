#!/usr/bin/env bash
# Twenty-second session, call 3 (issue 13; bench/NOTES.md v24): the aligned reference for call 1b's
# 5125 backward profile: ncu with SourceCounters of the row kernels at H = 16384 (bf16, 2^26) on
# main's build (bench/device_run.sh's ncu_rows stage), so that the odd row's extra instructions can
# be told apart by opcode.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03e/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > /tmp/build.log 2>&1; echo "build rc=$?"
stamp build
PYTHONPATH=$(pwd) NCU_H=16384 bash bench/device_run.sh ncu_rows > "$OUT/ncu_rows_run.log" 2>&1; echo "ncu_rows rc=$?"
stamp ncu_rows
