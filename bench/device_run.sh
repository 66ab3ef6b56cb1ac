#!/usr/bin/env bash
# One device call (about 8 minutes on an H200): build, the kernel-only ratios, the CUDA and
# Triton parity and kernel tests, a profile of one odd H, then the whole suite and a short
# training comparison as far as the time allows. Logs go under $OUT (the device tool's
# output folder) or ./out; the training outputs also as one archive. From the repo root:
#   bash bench/device_run.sh
# liger-kernel, when wanted, comes as a wheel in .whl/ (see the device tool's README).
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-16}"
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m pip install -e . --no-build-isolation --no-deps > "$OUT/build.log" 2>&1; echo "build rc=$?"
timeout 110 python3 bench/ops_timing.py 2>&1 | tee "$OUT/ops_timing.log"
timeout 150 python3 -m pytest tests/test_parity.py tests/test_kernels.py -q -ra -p no:cacheprovider -k cuda \
  > "$OUT/tests_kernels.log" 2>&1; echo "pytest kernels rc=$?"
tail -1 "$OUT/tests_kernels.log"
timeout 60 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
  -k regex:row_kernel -c 2 python3 bench/profile_rows.py 5125 > "$OUT/ncu_5125.txt" 2>&1; echo "ncu rc=$?"
mkdir -p "$OUT/train"
timeout 150 python3 -m polynorm --no-progress --steps 100 --batch-size 8 --no-repeat --out "$OUT/train" \
  > "$OUT/train/train.log" 2>&1; echo "train rc=$?"
tar czf "$OUT/train.tgz" -C "$OUT" train
timeout 240 python3 -m pytest tests -q -ra -p no:cacheprovider --deselect "tests/test_pt2.py::test_aoti_package[cuda-cuda]" \
  --deselect "tests/test_pt2.py::test_aoti_package[cuda-triton]" > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR|passed|failed" "$OUT/tests.log" | head -40
