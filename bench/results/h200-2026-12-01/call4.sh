# 1 x H200: the whole suite at the session's final kernels (staged rows removed, the message fix
# kept), 16 workers, the slow compile tests first; SIGINT at the limit so that pytest still
# prints its summary.
set -o pipefail; export PYTHONUNBUFFERED=1; bash bench/device_run.sh build | tail -2
/usr/bin/time -f "suite wall %e s" timeout -s INT 445 python3 -m pytest tests/test_pt2.py tests/test_grouped.py tests/test_training.py tests \
  -v -ra -p no:cacheprovider -n 16 --dist loadgroup --durations=25 > $OUT/tests_verbose.log 2>&1; echo "pytest rc=$?"
grep -E "^(FAILED|ERROR)|Fatal Python|crashed|passed|failed|suite wall" $OUT/tests_verbose.log | head -30
grep -E "^(SKIPPED|XFAIL|FAILED|ERROR)|passed|failed|suite wall|^=" $OUT/tests_verbose.log > $OUT/tests_summary.log
gzip -9 $OUT/tests_verbose.log; ls $OUT
