set -o pipefail; export PYTHONUNBUFFERED=1; bash bench/device_run.sh build | tail -2
mkdir -p $OUT/s
(CUDA_VISIBLE_DEVICES=1 OUT=$OUT/s SUITE_TIMEOUT=330 bash bench/device_run.sh suite > $OUT/s/stages.log 2>&1) &
export CUDA_VISIBLE_DEVICES=0
timeout 120 python3 bench/ops_timing.py > $OUT/ops_timing.log 2>&1
TUNE_H="512 4096 16384 4097 5125 16385" bash bench/device_run.sh tune grouped > $OUT/t1.log 2>&1
timeout 100 python3 bench/ops_timing.py --op poly_norm_mul --no-seed-shapes > $OUT/ops_timing_mul.log 2>&1
wait; unset CUDA_VISIBLE_DEVICES
timeout 150 python3 -m pytest tests/test_distributed.py tests/test_grouped.py tests/test_mul.py -q -ra -p no:cacheprovider -k "second_device or mixed_devices or two_gpus" -n 4 > $OUT/tests_2gpu.log 2>&1; echo 2gpu rc=$?; tail -1 $OUT/tests_2gpu.log
grep -E "FAILED|passed|failed|wall" $OUT/s/stages.log
cat $OUT/ops_timing.log $OUT/ops_timing_mul.log; grep "^|" $OUT/tune_rows.log; grep "^|" $OUT/grouped_timing.log
mv $OUT/s/tests.log $OUT/tests.log; tar czf /tmp/logs.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/logs.tgz $OUT/ && ls $OUT
