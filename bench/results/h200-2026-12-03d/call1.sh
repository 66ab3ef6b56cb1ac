#!/usr/bin/env bash
# Twenty-first session, call 1 (issues 13, 14, 15; bench/NOTES.md v23). Four builds of the tree, in
# parallel: m (as committed: one set of sums, the idle-slot skip), a (-DPOLYNORM_FWD_SUM_SETS=2),
# b (-DPOLYNORM_FWD_IDLE_SKIP=0), c (both, four sets); the forwards of each at the seed shapes and
# at 2^26 (fwd_variants.py, two passes, order reversed). On m: the kernel smoke tests and the new
# fused graph-capture test; ops_timing --graph for both ops (plan item 0); ncu's stall reasons and
# per-SASS-line samples of the forwards at 2048 x 1024 (plan item 1).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03d/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
D=bench/results/h200-2026-12-03d
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
declare -A FLAGS=([a]="-DPOLYNORM_FWD_SUM_SETS=2" [b]="-DPOLYNORM_FWD_IDLE_SKIP=0"
                  [c]="-DPOLYNORM_FWD_SUM_SETS=4 -DPOLYNORM_FWD_IDLE_SKIP=0")
for v in a b c; do rm -rf /tmp/$v && mkdir /tmp/$v && cp -r csrc polynorm setup.py pyproject.toml /tmp/$v/; done
(MAX_JOBS=6 python3 setup.py build_ext --inplace > /tmp/build_m.log 2>&1; echo "m rc=$?") &
for v in a b c; do
  (cd /tmp/$v && POLYNORM_NVCC_FLAGS="${FLAGS[$v]}" MAX_JOBS=4 python3 setup.py build_ext --inplace \
    > /tmp/build_$v.log 2>&1; echo "$v rc=$?") &
done
wait
stamp builds
tar czf "$OUT/builds.tgz" -C /tmp build_m.log build_a.log build_b.log build_c.log
export PYTHONPATH=$ROOT
timeout 120 python3 -m pytest tests/test_mul.py tests/test_kernels.py -q -p no:cacheprovider -n 16 \
  -k "graph_capture or misaligned or batch_invariance or staggered" > "$OUT/smoke.log" 2>&1
echo "smoke rc=$?"; grep -E "^FAILED|^ERROR" "$OUT/smoke.log" | head; tail -1 "$OUT/smoke.log"
stamp smoke
{
  for v in m a b c; do
    P=$ROOT; [ $v = m ] || P=/tmp/$v
    (cd /tmp && PYTHONPATH=$P timeout 40 python3 "$ROOT/$D/fwd_variants.py" $v)
  done
  for v in c b a m; do
    P=$ROOT; [ $v = m ] || P=/tmp/$v
    (cd /tmp && PYTHONPATH=$P timeout 30 python3 "$ROOT/$D/fwd_variants.py" $v --seed-only)
  done
} 2>&1 | tee "$OUT/variants.log"
stamp variants
timeout 90 python3 bench/ops_timing.py --graph > "$OUT/ops_timing_graph.log" 2>&1; echo "graph rc=$?"
timeout 90 python3 bench/ops_timing.py --graph --op poly_norm_mul > "$OUT/ops_timing_graph_mul.log" 2>&1
echo "graph mul rc=$?"
cat "$OUT/ops_timing_graph.log" "$OUT/ops_timing_graph_mul.log"
stamp graph
R="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
for v in m c; do
  P=$ROOT; [ $v = m ] || P=/tmp/$v
  PYTHONPATH=$P timeout 60 ncu --profile-from-start off --clock-control none -k regex:fwd_row_kernel -c 2 \
    --metrics "$R,smsp__inst_executed.sum,sm__cycles_active.avg,gpu__time_duration.sum" \
    --section SourceCounters -o /tmp/ncu_$v python3 bench/results/h200-2026-12-03c/ncu_small.py 2048 1024 \
    > /tmp/ncu_$v.out 2>&1; echo "ncu $v rc=$?"
  ncu -i /tmp/ncu_$v.ncu-rep --csv --page details > /tmp/stalls_$v.csv 2>&1
  ncu -i /tmp/ncu_$v.ncu-rep --csv --page source --print-source sass > /tmp/sass_$v.csv 2>&1
done
tar czf "$OUT/ncu.tgz" -C /tmp stalls_m.csv stalls_c.csv sass_m.csv sass_c.csv ncu_m.out ncu_c.out
python3 - <<'EOF'
import csv, io
for v in "mc":
    rows = list(csv.reader(l for l in open(f"/tmp/stalls_{v}.csv") if l.startswith('"')))
    if not rows:
        print(v, "no rows"); continue
    h = rows[0]; k, n, val = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
    for r in rows[1:]:
        if "stalled" in r[n] or "inst_executed" in r[n] or "duration" in r[n] or "cycles_active" in r[n]:
            try:
                if float(r[val].replace(",", "")) < 0.05 and "stalled" in r[n]:
                    continue
            except ValueError:
                pass
            print(v, r[k][30:75], r[n].replace("smsp__average_warps_issue_stalled_", "stall:"), r[val])
EOF
stamp ncu
