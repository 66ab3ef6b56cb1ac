#!/usr/bin/env bash
# Sixth session, call 2 (issue 13): the wide builds (forward 16 packs, backward 8) at every H and
# dtype, by grid, beside the table's; the backward's last block now sums the partials with every
# thread (a grid of a block per row is affordable). Then the CUDA kernel tests.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01b/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
OUT="$OUT" bash bench/device_run.sh build
stamp build
timeout 170 python3 bench/tune_rows.py --aligned-only --H 512 2048 4096 8192 16384 32768 65536 131072 262144 2>&1 \
  | tee "$OUT/tune_bf16.log"
stamp tune_bf16
timeout 80 python3 bench/tune_rows.py --aligned-only --dtype float32 --H 512 4096 16384 65536 2>&1 | tee "$OUT/tune_fp32.log"
stamp tune_fp32
timeout 60 python3 bench/tune_rows.py --aligned-only --dtype float16 --H 2048 8192 32768 2>&1 | tee "$OUT/tune_fp16.log"
stamp tune_fp16
timeout 150 python3 -m pytest tests/test_parity.py tests/test_kernels.py tests/test_clusters.py tests/test_launch_plan.py \
  -q -ra -p no:cacheprovider -k cuda -n 8 > "$OUT/tests_kernels.log" 2>&1; echo "pytest kernels rc=$?"
tail -3 "$OUT/tests_kernels.log"
stamp tests
