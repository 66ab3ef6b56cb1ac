#!/usr/bin/env bash
# One device call: build, the whole test suite on the GPU, then the kernel-only ratios.
# Logs go under $OUT (the device tool's output folder) or ./out. Usage, from the repo root:
#   bash bench/device_run.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-16}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m pip install -e . --no-build-isolation --no-deps > "$OUT/build.log" 2>&1; echo "build rc=$?"
timeout 150 python3 bench/ops_timing.py 2>&1 | tee "$OUT/ops_timing.log"
timeout 300 python3 -m pytest tests -q -ra -p no:cacheprovider > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR|passed|failed" "$OUT/tests.log" | head -40
