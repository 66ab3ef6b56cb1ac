#!/usr/bin/env bash
# Thirtieth session, call 5 (issue 15; bench/NOTES.md v33), after the review: the fused op's misaligned-rows test at
# the tail plans it newly covers (2051: two rows a block; 16387: a cluster of 4; and fp16), against the float64
# oracle and bitwise between layouts. Fresh machine: builds first (the session's last device seconds).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04e/call5.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
ls polynorm/_C*.so > /dev/null 2>&1 || { MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > /dev/null 2>&1; echo "build rc=$?"; }
echo "[build at $(( $(date +%s) - t0 )) s]"
timeout 40 python3 -m pytest -q -p no:cacheprovider tests/test_mul.py -k "cuda_misaligned and (2051 or 16387 or float16)" \
  > "$OUT/tests.log" 2>&1; echo "tests rc=$?"; tail -3 "$OUT/tests.log"
