# 2 x H200: the whole suite on GPU 1, then the fused op's kernel-only ratios and the grouped op;
# on GPU 0 the full bench/bench.py sweep (Liger from .whl/), the kernel-only ratios and the
# per-step profile; then the two-GPU tests on both.
set -o pipefail; export PYTHONUNBUFFERED=1; bash bench/device_run.sh build | tail -2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
mkdir -p $OUT/s
(export CUDA_VISIBLE_DEVICES=1; OUT=$OUT/s SUITE_TIMEOUT=260 bash bench/device_run.sh suite > $OUT/s/stages.log 2>&1
 timeout 80 python3 bench/ops_timing.py --op poly_norm_mul --no-seed-shapes > $OUT/ops_timing_mul.log 2>&1
 OUT=$OUT/s bash bench/device_run.sh grouped > /dev/null 2>&1; mv $OUT/s/grouped_timing.* $OUT/) &
export CUDA_VISIBLE_DEVICES=0
timeout 250 python3 bench/bench.py --warmup 15 --rep 50 --out $OUT/bench > $OUT/bench.log 2>&1; echo "bench rc=$?"
timeout 110 python3 bench/ops_timing.py > $OUT/ops_timing.log 2>&1; echo "ops_timing rc=$?"
OUT=$OUT/s bash bench/device_run.sh profile > /dev/null 2>&1; mv $OUT/s/profile_steps.log $OUT/
wait; unset CUDA_VISIBLE_DEVICES
timeout 60 python3 -m pytest tests/test_distributed.py tests/test_grouped.py tests/test_mul.py -q -ra -p no:cacheprovider -k "second_device or mixed_devices or two_gpus" -n 4 > $OUT/tests_2gpu.log 2>&1; echo 2gpu rc=$?; tail -1 $OUT/tests_2gpu.log
grep -E "FAILED|ERROR|passed|failed|wall" $OUT/s/stages.log | head -30
cat $OUT/ops_timing.log $OUT/ops_timing_mul.log; grep "^|" $OUT/grouped_timing.log; sed -n '/^| M/,$p' $OUT/profile_steps.log | head -30
mv $OUT/s/tests.log $OUT/tests.log; tar czf $OUT/bench.tgz -C $OUT bench && rm -rf $OUT/bench $OUT/s; ls $OUT
