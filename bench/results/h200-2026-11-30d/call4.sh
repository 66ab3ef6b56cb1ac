set -o pipefail; export PYTHONUNBUFFERED=1; bash bench/device_run.sh build | tail -2
timeout 60 python3 -m pytest tests/test_clusters.py -q -n 8 -p no:cacheprovider > $OUT/tests_clusters.log 2>&1; echo pytest rc=$?; tail -1 $OUT/tests_clusters.log
timeout 200 python3 bench/tune_clusters.py --H 16384 32768 40000 65536 131072 262144 16385 65537 5125 --variants table \
  w0=grid_waves:0 w2=grid_waves:2 w1c256=grid_waves:1,cta_threads:256 w1c1024=grid_waves:1,cta_threads:1024 2>&1 | tee $OUT/tune_clusters.log
