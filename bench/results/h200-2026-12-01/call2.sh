# 1 x H200: staged rows (kStage) against the table, and the _tune_rows segfault alone.
set -o pipefail; export PYTHONUNBUFFERED=1; bash bench/device_run.sh build | tail -2
echo "== the segfault test alone, then each bad tuple in a fresh process"; which gdb
timeout 60 python3 -m pytest tests/test_launch_plan.py -q -p no:cacheprovider -p no:xdist -k tune_rows 2>&1 | tail -15
for a in "2, 0, 1" "0, 3, 1" "0, 0, -2" "0, 0, -1, True, True, 48" "0, 0, -1, True, True, 0, 3"; do
  timeout 30 python3 -X faulthandler -c "
import torch, polynorm
try:
    torch.ops.polynorm._tune_rows($a)
except ValueError as e:
    print('raised:', str(e).splitlines()[0])
" 2>&1 | tail -4; echo "($a) rc=$?"
done
echo "== staged-row tests"
timeout 120 python3 -m pytest tests/test_staged.py tests/test_clusters.py tests/test_launch_plan.py -q -p no:cacheprovider -n 8 2>&1 | tail -8
echo "== timing"
timeout 150 python3 bench/tune_clusters.py --ops fwd bwd --H 512 1024 2048 4096 8192 16384 32768 --variants table st=stage:True 2>&1 | tee $OUT/tune_staged_bf16.log
timeout 100 python3 bench/tune_clusters.py --dtype float32 --ops fwd bwd --H 1024 4096 8192 16384 --variants table st=stage:True 2>&1 | tee $OUT/tune_staged_fp32.log
ls $OUT
