#!/usr/bin/env bash
# Thirty-first session, call 3 (issue 13 target 1; bench/NOTES.md v34): PolyNorm's forward of 2-byte rows of whole
# packs on the narrow build (8 packs a thread, _tune_rows(narrow_forward=True), column f-n8) against the table's
# 16, bf16 and fp16 at M·H = 2^26; csrc is 3b38b82's but for that host-side switch.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04f/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
ls polynorm/_C*.so >/dev/null 2>&1 || { MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"; gzip -f "$OUT/build.log"; }
stamp build
python3 -c "
import torch, polynorm
ops = torch.ops.polynorm
for n in (False, True):
    ops._tune_rows(narrow_forward=n)
    print('narrow' if n else 'table ', [(H, ops._launch_plan('forward', H, torch.bfloat16)) for H in (512, 4096, 32768, 65536, 131072, 262144)])
ops._tune_rows()
" | tee "$OUT/plans.log"
for dt in bfloat16 float16; do
  timeout 100 python3 bench/tune_rows.py --dtype $dt --table-only --aligned-only --narrow --H 512 1024 2048 4096 8192 16384 32768 65536 131072 262144
done 2>&1 | tee "$OUT/tune_narrow.log"
stamp tune
