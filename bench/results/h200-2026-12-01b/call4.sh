#!/usr/bin/env bash
# Sixth session, call 4 (issues 13, 15): the wide builds for rows of whole packs (PolyNorm forward 16
# packs, backward 8; the fused op forward 8, backward 4), the narrow builds (half) for odd H. The CUDA
# kernel tests, the row tunings on aligned, misaligned and odd rows, then the kernel-only ratios
# (ops_timing, PolyNorm and the fused op) and the grouped op against its loop, each alone.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01b/call4.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
OUT="$OUT" bash bench/device_run.sh build
stamp build
timeout 150 python3 -m pytest tests/test_parity.py tests/test_kernels.py tests/test_clusters.py tests/test_launch_plan.py \
  tests/test_mul.py tests/test_grouped.py -q -ra -p no:cacheprovider -k "cuda or clusters or launch" -n 12 \
  > "$OUT/tests_kernels.log" 2>&1; echo "pytest kernels rc=$?"
grep -E "^FAILED|^ERROR" "$OUT/tests_kernels.log" | head -20; tail -1 "$OUT/tests_kernels.log"
stamp tests
timeout 60 python3 bench/tune_rows.py --H 512 8192 16384 65536 4097 5125 16385 65537 2>&1 | tee "$OUT/tune_bf16.log"
stamp tune
timeout 110 python3 bench/ops_timing.py 2>&1 | tee "$OUT/ops_timing.log"
stamp ops_timing
timeout 100 python3 bench/ops_timing.py --op poly_norm_mul 2>&1 | tee "$OUT/ops_timing_mul.log"
stamp ops_timing_mul
timeout 150 python3 bench/grouped_timing.py --out "$OUT/grouped_timing.json" 2>&1 | tee "$OUT/grouped_timing.log"
stamp grouped
