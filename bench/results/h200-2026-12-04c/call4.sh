#!/usr/bin/env bash
# Twenty-eighth session, call 4 (issue 13; bench/NOTES.md v31): PolyNorm's aligned backward on CTAs of
# 512 threads (a bench-only build, _tune_rows(cta_threads=512), column b-c512): 262144 on 8 x 512 (one
# CTA an SM, all of a cluster's lanes as 16 x 256 hold, the same reduction tree) against the table's
# 16 x 256; 131072 on 4 x 512, 65536 on 2 x 512, 32768 on one CTA of 512. bf16 twice, fp32 once.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04c/call4.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"; gzip -f "$OUT/build.log"
stamp build
python3 -c "
import torch, polynorm
torch.ops.polynorm._tune_rows(cta_threads=512)
for H in (32768, 65536, 131072, 262144): print(H, torch.ops.polynorm._launch_plan('backward', H, torch.bfloat16))
"
for pass in 1 2; do
  timeout 50 python3 bench/tune_rows.py --table-only --aligned-only --cta 512 --H 32768 65536 131072 262144
done 2>&1 | tee "$OUT/tune.log"
timeout 40 python3 bench/tune_rows.py --dtype float32 --table-only --aligned-only --cta 512 --H 65536 131072 2>&1 | tee "$OUT/tune_fp32.log"
stamp tune
