#!/usr/bin/env bash
# Twenty-fifth session, call 2 (bench/NOTES.md v27). Two builds in parallel: n (the tree: call 1's
# realigned backward, with phase 0 summed as packs and the phase chosen by realignments, a phase
# not 0 counting one and a half) and c (call2_csrc.patch reversed: call 1's build, c58eebb).
# build_compare.py c n n c at the views; ncu of both backwards on n at 5125, 5125x, 5125v; the GPU
# tests of every misaligned and CUDA case of the kernels, the fused op, the grouped op and the
# clusters on n; sass_load_order on n.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03h/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
D=bench/results/h200-2026-12-03h
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
rm -rf /tmp/c && mkdir /tmp/c && cp -r csrc polynorm setup.py pyproject.toml /tmp/c/
(cd /tmp/c && patch -R -p1 -s < "$ROOT/$D/call2_csrc.patch") || echo "patch c failed"
(MAX_JOBS=8 python3 setup.py build_ext --inplace > /tmp/build_n.log 2>&1; echo "n rc=$?") &
(cd /tmp/c && MAX_JOBS=8 python3 setup.py build_ext --inplace > /tmp/build_c.log 2>&1; echo "c rc=$?") &
wait
stamp builds
tar czf "$OUT/builds.tgz" -C /tmp build_n.log build_c.log
path_of() { if [ $1 = n ]; then echo $ROOT; else echo /tmp/$1; fi; }
(python3 bench/sass_load_order.py $(ls polynorm/_C*.so) > "$OUT/sass_load_order_n.log" 2>&1; echo "sass n rc=$?") &
{
  for v in c n n c; do
    (cd /tmp && PYTHONPATH=$(path_of $v) timeout 50 python3 "$ROOT/bench/build_compare.py" $v \
      5125 4096v 5125v 16385v 4096x 5125x 16385x 2001x)
  done
} 2>&1 | tee "$OUT/compare_cn.log"
stamp compare
export PYTHONPATH=$ROOT
R="gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_mio_throttle_per_warp_active.pct,smsp__warp_issue_stalled_short_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct,smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warp_issue_stalled_wait_per_warp_active.pct,smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct,launch__registers_per_thread"
for MH in "13094 5125" "13094 5125x" "13094 5125v" "16384 4096x"; do
  timeout 40 ncu --profile-from-start off --clock-control none -k regex:bwd_row_kernel -c 4 \
    --metrics "$R" --csv python3 $D/ncu_views.py $MH > /tmp/ncu.csv 2>&1
  python3 - $MH <<'PY'
import csv, sys
rows = list(csv.reader(l for l in open("/tmp/ncu.csv") if l.startswith('"')))
if not rows:
    print(sys.argv[1:], "no ncu rows"); sys.exit()
h = rows[0]; i, n, val = h.index("ID"), h.index("Metric Name"), h.index("Metric Value")
got = {}
for r in rows[1:]:
    got.setdefault(r[i], {})[r[n]] = r[val]
short = lambda a: a.split("__")[1].replace("warp_issue_stalled_", "st_").replace("_per_warp_active.pct", "")
for k, m in got.items():
    print(sys.argv[2], "mbwd" if int(k) % 2 else "bwd ", " ".join(f"{short(a)}={b}" for a, b in sorted(m.items())))
PY
done 2>&1 | tee "$OUT/ncu.log"
stamp ncu
timeout 200 python3 -m pytest tests/test_kernels.py tests/test_mul.py tests/test_grouped.py tests/test_clusters.py \
  -k "cuda or misaligned or gpu or layouts" -q -ra -p no:cacheprovider -n 16 > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20
tail -2 "$OUT/tests.log"
gzip -f "$OUT/tests.log"
stamp tests
wait
tail -2 "$OUT/sass_load_order_n.log"
stamp end
