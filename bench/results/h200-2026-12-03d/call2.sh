#!/usr/bin/env bash
# Twenty-first session, call 2 (issues 13, 15; bench/NOTES.md v23). Call 1: without the idle-slot
# branches the forward at the seed shapes gains (b, c) but loses 10% at 2^26, where ptxas then spreads
# the row's 16 loads among the sums. Three builds, in parallel: m (as committed), d
# (-DPOLYNORM_FWD_FULL_PATH=1: the row's loads, then one branch: a warp with no idle slot sums its
# packs branch-free, the others as before; the same bits), e (=2: the outputs too). Their forwards
# at the seed shapes and at 2^26 (fwd_variants.py: one pass of all shapes, two more of the seed
# shapes in other orders); ncu's stall reasons at 2048 x 1024 on d.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03d/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
D=bench/results/h200-2026-12-03d
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
declare -A FLAGS=([d]="-DPOLYNORM_FWD_FULL_PATH=1" [e]="-DPOLYNORM_FWD_FULL_PATH=2")
for v in d e; do rm -rf /tmp/$v && mkdir /tmp/$v && cp -r csrc polynorm setup.py pyproject.toml /tmp/$v/; done
(MAX_JOBS=6 python3 setup.py build_ext --inplace > /tmp/build_m.log 2>&1; echo "m rc=$?") &
for v in d e; do
  (cd /tmp/$v && POLYNORM_NVCC_FLAGS="${FLAGS[$v]}" MAX_JOBS=5 python3 setup.py build_ext --inplace \
    > /tmp/build_$v.log 2>&1; echo "$v rc=$?") &
done
wait
stamp builds
tar czf "$OUT/builds.tgz" -C /tmp build_m.log build_d.log build_e.log
run() {  # label, extra args
  P=$ROOT; [ $1 = m ] || P=/tmp/$1
  (cd /tmp && PYTHONPATH=$P timeout 45 python3 "$ROOT/$D/fwd_variants.py" "$@")
}
{
  for v in m d e; do run $v; done
  for v in e d m; do run $v --seed-only; done
  for v in d m e; do run $v --seed-only; done
} 2>&1 | tee "$OUT/variants.log"
stamp variants
R="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
PYTHONPATH=/tmp/d timeout 60 ncu --profile-from-start off --clock-control none -k regex:fwd_row_kernel -c 2 \
  --metrics "$R,smsp__inst_executed.sum,sm__cycles_active.avg,gpu__time_duration.sum" \
  --csv python3 bench/results/h200-2026-12-03c/ncu_small.py 2048 1024 > "$OUT/ncu_d.csv" 2>&1; echo "ncu d rc=$?"
python3 - "$OUT/ncu_d.csv" <<'PY'
import csv, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
h = rows[0]; k, n, val = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
for r in rows[1:]:
    v = float(r[val].replace(",", "")) if r[val].replace(",", "").replace(".", "").isdigit() else 0
    if "stalled" in r[n] and v < 0.05:
        continue
    print(r[k][30:75], r[n].replace("smsp__average_warps_issue_stalled_", "stall:"), r[val])
PY
stamp ncu
