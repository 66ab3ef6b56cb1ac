set -o pipefail; export PYTHONUNBUFFERED=1; bash bench/device_run.sh build | tail -2
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 170 python3 -m pytest tests/test_clusters.py tests/test_launch_plan.py tests/test_kernels.py tests/test_parity.py tests/test_mul.py tests/test_grouped.py -q -k cuda -n 8 -p no:cacheprovider > $OUT/tests_k.log 2>&1; echo pytest rc=$?; grep -E "^FAILED|^ERROR" $OUT/tests_k.log | head -20; tail -1 $OUT/tests_k.log
timeout 150 python3 bench/tune_clusters.py 2>&1 | tee $OUT/tune_clusters.log
timeout 110 python3 bench/ops_timing.py --no-seed-shapes 2>&1 | tee $OUT/ops_timing.log
