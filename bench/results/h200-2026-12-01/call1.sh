# 1 x H200: build, then the whole suite alone (16 workers), every test's outcome kept
# (tests_verbose.log.gz); SIGINT at the limit so that pytest still prints its summary.
set -o pipefail; export PYTHONUNBUFFERED=1; bash bench/device_run.sh build | tail -2
/usr/bin/time -f "suite wall %e s" timeout -s INT 430 python3 -m pytest tests -v -ra -p no:cacheprovider \
  -n 16 --dist loadgroup --durations=40 > $OUT/tests_verbose.log 2>&1; echo "pytest rc=$?"
grep -E "^(FAILED|ERROR)|Fatal Python|crashed|worker .* crashed|passed|failed|suite wall" $OUT/tests_verbose.log | head -40
sed -n '/slowest 40 durations/,/short test summary/p' $OUT/tests_verbose.log | head -45 > $OUT/durations.txt
grep -E -B2 -A60 "Fatal Python error" $OUT/tests_verbose.log | head -150 > $OUT/fault.txt
grep -E "^(FAILED|ERROR)|^=|Error|assert" $OUT/tests_verbose.log | grep -v PASSED | head -300 > $OUT/summary.txt
gzip -9 $OUT/tests_verbose.log; ls -la $OUT
