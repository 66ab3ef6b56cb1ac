set -o pipefail; export PYTHONUNBUFFERED=1; bash bench/device_run.sh build | tail -2
timeout 240 python3 bench/tune_clusters.py --H 4096 8192 16384 32768 40000 65536 131072 262144 --variants table c256x8 \
  c1024=cta_threads:1024 f4=fwd_packs:4,prefetch:False f4c256=fwd_packs:4,prefetch:False,cta_threads:256 p4w1=fwd_packs:4,grid_waves:1 \
  b2=bwd_packs:2,prefetch:False b2c512=bwd_packs:2,prefetch:False,cta_threads:512 b2p=bwd_packs:2 2>&1 | tee $OUT/tune_clusters.log
