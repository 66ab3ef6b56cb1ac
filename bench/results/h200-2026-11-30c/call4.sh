set -o pipefail; export PYTHONUNBUFFERED=1
bash bench/device_run.sh build | tail -1
timeout 150 python3 -m pytest tests/test_kernels.py tests/test_parity.py tests/test_launch_plan.py tests/test_mul.py -q -k cuda -n 8 -p no:cacheprovider --maxfail=20 > $OUT/tests_k.log 2>&1; echo pytest rc=$?; grep -E "^FAILED|passed|failed" $OUT/tests_k.log | head -20
TUNE_H="4096 4097 5125 16385" bash bench/device_run.sh tune | grep "^|"
timeout 120 python3 bench/ops_timing.py 2>&1 | tee $OUT/ops_timing.log
bash bench/device_run.sh bench triton_host | grep -v "^NVIDIA\|^torch"
grep -E "^\|" $OUT/triton_host.log | head -60
tar czf /tmp/logs.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/logs.tgz $OUT/ && ls $OUT
