set -o pipefail; export PYTHONUNBUFFERED=1; bash bench/device_run.sh build | tail -2
timeout 60 python3 -m pytest tests/test_kernels.py -q -k "cuda and (batch or misaligned or graph or deterministic)" -n 8 -p no:cacheprovider > $OUT/tests_k.log 2>&1; echo pytest rc=$?; tail -1 $OUT/tests_k.log
timeout 120 python3 bench/ops_timing.py 2>&1 | tee $OUT/ops_timing.log
