#!/usr/bin/env bash
# Sixth session, call 3 (issues 13, 15): the wide builds as the table's (PolyNorm forward 16 packs,
# backward 8, every layout and the grouped builds; prefetch and the narrow PolyNorm builds
# deleted): tune_rows on aligned, misaligned and odd rows, the fused op at 4/8 and 2/4 packs, then
# the CUDA tests of the kernels, clusters, launch plan, fused and grouped ops.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01b/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
OUT="$OUT" bash bench/device_run.sh build
stamp build
timeout 120 python3 bench/tune_rows.py --H 512 2048 8192 16384 32768 65536 131072 262144 3000 4097 5125 16385 65537 2>&1 \
  | tee "$OUT/tune_bf16.log"
stamp tune_bf16
timeout 60 python3 bench/tune_rows.py --dtype float32 --H 512 4096 16384 65536 5125 2>&1 | tee "$OUT/tune_fp32.log"
stamp tune_fp32
timeout 100 python3 bench/tune_rows.py --op poly_norm_mul --H 512 2048 4096 8192 16384 32768 65536 5125 2>&1 \
  | tee "$OUT/tune_mul_bf16.log"
stamp tune_mul
timeout 240 python3 -m pytest tests/test_parity.py tests/test_kernels.py tests/test_clusters.py tests/test_launch_plan.py \
  tests/test_mul.py tests/test_grouped.py -q -ra -p no:cacheprovider -k "cuda or clusters or launch" -n 12 \
  > "$OUT/tests_kernels.log" 2>&1; echo "pytest kernels rc=$?"
grep -E "^FAILED|^ERROR" "$OUT/tests_kernels.log" | head -20; tail -1 "$OUT/tests_kernels.log"
stamp tests
