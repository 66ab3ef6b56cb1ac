#!/usr/bin/env bash
# Thirtieth session, call 2 (issue 15, 13's odd rows; bench/NOTES.md v33): the fused backward's tail builds with the
# tail's loads and sums under one branch (call 1's were predicated on every lane). Bits (tail_check), tune_rows
# against the plans of before (--no-tail), then ops_timing --graph of the fused op (the README's table).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04e/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"; gzip -f "$OUT/build.log"
stamp build
sed -n '/^cat > \/tmp\/tail_check.py/,/^PY$/p' bench/results/h200-2026-12-04e/call1.sh | sed '1d;$d' > /tmp/tail_check.py
python3 /tmp/tail_check.py 2>&1 | tee "$OUT/tail_check.log"
stamp checks
for dt in bfloat16 float16; do
  timeout 45 python3 bench/tune_rows.py --op poly_norm_mul --dtype $dt --table-only --aligned-only --no-tail --H 2051 3003 4097 4103 5125 16385 16387 65539
done 2>&1 | tee "$OUT/tune_mul.log"
timeout 40 python3 bench/tune_rows.py --op poly_norm_mul --dtype float32 --table-only --aligned-only --no-tail --H 2051 4099 5126 8195 2>&1 | tee "$OUT/tune_mul_fp32.log"
stamp tune
timeout 100 python3 bench/ops_timing.py --graph --op poly_norm_mul > "$OUT/ops_timing_graph_mul.log" 2>&1; echo "graph mul rc=$?"
stamp graph_mul
