#!/usr/bin/env bash
# Eleventh session, call 1 (issues 13, 15): rows claimed at run time (RowClaims, the bench-only
# _tune_rows(claims=True)) against the table's grids. Built in place; tests/test_claims.py (every
# claim's rows bitwise the table's, dW / dB deterministic, the counter back at zero, capture);
# then tune_rows, PolyNorm and the fused op, bf16: f / fw1 / fc1 / fc2 and b / bc1 / bc2 (mf / mfw1
# / mfc1, mb / mbc1) side by side.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01g/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
timeout 150 python3 -m pytest tests/test_claims.py -q -ra -p no:cacheprovider -x > "$OUT/tests_claims.log" 2>&1
echo "pytest claims rc=$?"; tail -3 "$OUT/tests_claims.log"
stamp tests
H="1024 2048 4096 8192 16384 32768 65536 3000 5125 16385"
timeout 200 python3 bench/tune_rows.py --H $H 2>&1 | tee "$OUT/tune.log"
stamp tune
timeout 150 python3 bench/tune_rows.py --op poly_norm_mul --aligned-only --H 1024 4096 8192 16384 32768 5125 2>&1 | tee "$OUT/tune_mul.log"
stamp tune_mul
