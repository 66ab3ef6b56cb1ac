set -o pipefail; export PYTHONUNBUFFERED=1; bash bench/device_run.sh build | tail -2
timeout 100 python3 -m pytest tests/test_clusters.py tests/test_launch_plan.py tests/test_kernels.py -q -k cuda -n 8 -p no:cacheprovider > $OUT/tests_k.log 2>&1; echo pytest rc=$?; grep -E "^FAILED|^ERROR" $OUT/tests_k.log | head -20; tail -1 $OUT/tests_k.log
timeout 150 python3 bench/tune_clusters.py --ops fwd bwd --H 2048 4096 8192 16384 32768 65536 131072 262144 --variants table c512x8 c256x8 \
  p4w1=fwd_packs:4,grid_waves:1 p4w1c256=fwd_packs:4,grid_waves:1,cta_threads:256 w0=grid_waves:0 \
  b2p=bwd_packs:2 b2pc256=bwd_packs:2,cta_threads:256 b2n=bwd_packs:2,prefetch:False 2>&1 | tee $OUT/tune_clusters.log
timeout 60 python3 bench/tune_rows.py --H 3000 4097 5125 16385 2>&1 | tee $OUT/tune_rows_oddh.log
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats"
for H in 2048 8192 5125; do timeout 60 ncu --clock-control none $S -k regex:row_kernel -c 2 python3 bench/profile_rows.py $H > $OUT/ncu_$H.txt 2>&1; echo "ncu $H rc=$?"; done
timeout 60 ncu --clock-control none $S -k regex:row_kernel -c 2 python3 bench/profile_rows.py 65536 > $OUT/ncu_65536.txt 2>&1; echo "ncu 65536 rc=$?"
timeout 60 ncu --clock-control none $S -k regex:row_kernel -c 2 python3 bench/profile_rows.py 8192 bwd_packs:2,cta_threads:256 > $OUT/ncu_8192_b2p.txt 2>&1; echo "ncu 8192 b2p rc=$?"
cd $OUT && tar czf ncu.tgz ncu_*.txt && rm -f ncu_*.txt
