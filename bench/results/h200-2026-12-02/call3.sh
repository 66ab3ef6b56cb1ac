#!/usr/bin/env bash
# Twelfth session, call 3 (issues 13, 14, 15): the kernels of calls 1-2, timed alone on the GPU:
# bench/ops_timing.py for PolyNorm and the fused op (the README's kernel tables), then
# bench/bench.py's full side-by-side sweep (Liger-Kernel 0.8.5 from .whl/, carried).
# Run from the repo root, with .whl carried, as: OUT=$OUT bash bench/results/h200-2026-12-02/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd):/tmp/site
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, liger_kernel; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
timeout 110 python3 bench/ops_timing.py 2>&1 | tee "$OUT/ops_timing.log"
stamp ops_timing
timeout 90 python3 bench/ops_timing.py --op poly_norm_mul 2>&1 | tee "$OUT/ops_timing_mul.log"
stamp ops_timing_mul
timeout 280 python3 bench/bench.py --warmup 15 --rep 50 --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"; tail -5 "$OUT/sweep.log"; tar czf "$OUT/sweep.tgz" -C "$OUT" sweep && rm -rf "$OUT/sweep"
stamp sweep
