# 1 x H200: the Triton backend's GPU tests with the direct launch on (POLYNORM_TRITON_DIRECT_LAUNCH=1),
# in-process, before making it the default.
set -o pipefail; export PYTHONUNBUFFERED=1; bash bench/device_run.sh build | tail -2
POLYNORM_TRITON_DIRECT_LAUNCH=1 timeout -s INT 110 python3 -m pytest tests/test_triton.py tests/test_parity.py tests/test_mul.py \
  tests/test_kernels.py tests/test_api.py -q -ra -p no:cacheprovider -n 16 -k "triton and not compile" > $OUT/tests_direct.log 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Fatal" $OUT/tests_direct.log | head -20
