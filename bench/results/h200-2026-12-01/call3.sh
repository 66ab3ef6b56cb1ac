# 1 x H200: staged rows fixed (dynamic shared memory now passed to plain launches) and made the
# table's default; the _tune_rows segfault's fix (no int streamed into an error message).
set -o pipefail; export PYTHONUNBUFFERED=1; bash bench/device_run.sh build | tail -2
echo "== the segfault test alone"
timeout 60 python3 -m pytest tests/test_launch_plan.py -q -p no:cacheprovider -p no:xdist -k tune_rows 2>&1 | tail -2
echo "== kernel tests on CUDA"
timeout 170 python3 -m pytest tests/test_staged.py tests/test_clusters.py tests/test_launch_plan.py tests/test_kernels.py \
  tests/test_parity.py tests/test_mul.py tests/test_grouped.py -q -ra -p no:cacheprovider -n 16 -k "cuda or staged or clusters or launch_plan" \
  > $OUT/tests_k.log 2>&1; echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests_k.log | head -20
echo "== timing"
timeout 120 python3 bench/tune_clusters.py --ops fwd bwd --H 512 1024 2048 4096 8192 16384 32768 --variants table ns=stage:False 2>&1 | tee $OUT/tune_staged_bf16.log
timeout 80 python3 bench/tune_clusters.py --dtype float32 --ops fwd bwd --H 1024 4096 8192 16384 --variants table ns=stage:False 2>&1 | tee $OUT/tune_staged_fp32.log
timeout 120 python3 bench/ops_timing.py > $OUT/ops_timing.log 2>&1; echo "ops_timing rc=$?"; cat $OUT/ops_timing.log
gzip -9 $OUT/tests_k.log; ls $OUT
