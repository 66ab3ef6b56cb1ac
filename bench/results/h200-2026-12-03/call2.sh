#!/usr/bin/env bash
# Eighteenth session, call 2 (issues 13, 15; bench/NOTES.md v20): the EXPERIMENT build
# (call2_experiment.patch on the commit before the batched sum: the table's sum kernel and last
# block's sum, the batched sum as a kernel of its own, a block per R rows' first wave staggered,
# all from the environment): exp2.py.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
D=bench/results/h200-2026-12-03
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
gzip -f "$OUT/build.log"
stamp build
timeout 200 python3 $D/exp2.py 2>&1 | tee "$OUT/exp2.log"
stamp exp2
