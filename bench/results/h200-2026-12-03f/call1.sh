#!/usr/bin/env bash
# Twenty-third session, call 1 (issue 13, plan item 1; bench/NOTES.md v25). Five builds in parallel:
# m (as committed) and this directory's patches applied to copies of csrc: N (e1, e3 for the
# same-phase backward only, e4, e5, e6 of ../h200-2026-12-03e/cpu_sassmap), A (N plus e2: W = 32 in
# row_lane, a hack for rows of 32 lanes or more), AL (A plus __ldg for the same-phase backward's row
# loads), AR (A with every backward row build capped at 112 registers, __maxnreg__, so that 96-thread
# blocks fit 6 an SM). variants.py on each, m N A AL AR then A N m; ncu of both backwards at 5125
# and 16385 (duration, instructions, registers, occupancy); sass_load_order on N's and A's libraries.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03f/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
D=bench/results/h200-2026-12-03f
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
VS="N A AL AR"
for v in $VS; do
  rm -rf /tmp/$v && mkdir /tmp/$v && cp -r csrc polynorm setup.py pyproject.toml /tmp/$v/
  (cd /tmp/$v/csrc && patch -p1 -s < "$ROOT/$D/$v.patch") || echo "patch $v failed"
done
(MAX_JOBS=4 python3 setup.py build_ext --inplace > /tmp/build_m.log 2>&1; echo "m rc=$?") &
# (the first try of this call failed to build every patch: e5's inline asm met fp64 sums; now
# float sums only, call1.out)
for v in $VS; do
  (cd /tmp/$v && MAX_JOBS=3 python3 setup.py build_ext --inplace > /tmp/build_$v.log 2>&1; echo "$v rc=$?") &
done
wait
stamp builds
tar czf "$OUT/builds.tgz" -C /tmp build_m.log build_N.log build_A.log build_AL.log build_AR.log
grep -h " error" /tmp/build_*.log | sort | uniq -c | head -5
path_of() { if [ $1 = m ]; then echo $ROOT; else echo /tmp/$1; fi; }
for v in N A; do
  (python3 bench/sass_load_order.py $(ls /tmp/$v/polynorm/_C*.so) > "$OUT/sass_load_order_$v.log" 2>&1; echo "sass $v rc=$?") &
done
{
  for v in m N A AL AR A N m; do (cd /tmp && PYTHONPATH=$(path_of $v) timeout 60 python3 "$ROOT/$D/variants.py" $v); done
} 2>&1 | tee "$OUT/variants.log"
stamp variants
R="gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__block_size,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active"
for MH in "13094 5125" "4095 16385"; do
  for v in m N A AR; do
    PYTHONPATH=$(path_of $v) timeout 40 ncu --profile-from-start off --clock-control none -k regex:bwd_row_kernel -c 4 \
      --metrics "$R" --csv python3 $D/ncu_bwd.py $MH > /tmp/ncu.csv 2>&1
    python3 - $v $MH <<'PY'
import csv, sys
rows = list(csv.reader(l for l in open("/tmp/ncu.csv") if l.startswith('"')))
if not rows:
    print(sys.argv[1:], "no ncu rows"); sys.exit()
h = rows[0]; i, n, val = h.index("ID"), h.index("Metric Name"), h.index("Metric Value")
got = {}
for r in rows[1:]:
    got.setdefault(r[i], {})[r[n].split("__")[1]] = r[val]
for k, m in got.items():
    print(sys.argv[1], sys.argv[3], "mbwd" if int(k) % 2 else "bwd ", " ".join(f"{a}={b}" for a, b in sorted(m.items())))
PY
  done
done 2>&1 | tee "$OUT/ncu.log"
stamp ncu
wait
cat "$OUT"/sass_load_order_*.log | tail -8
stamp end
