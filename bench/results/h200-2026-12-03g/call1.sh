#!/usr/bin/env bash
# Twenty-fourth session, call 1 (issues 15 and 13; bench/NOTES.md v26). Three builds in parallel:
# m (main as committed), F (F.patch on a copy: the fused backward's mul row folded into the
# same-phase row helpers, the twenty-third session's next_mul_fold.patch) and O (the csrc before the
# twenty-third session's twins, b226377: O.patch), for the rows whose
# builds spill more since (the narrow realigned forward, the grouped same-phase backward).
# build_compare.py m F m F at 2^26; m O m O at the spill rows; grouped_timing on O and m;
# tune_rows --cta for the fused backward's odd rows (one CTA against a cluster); ncu of the fused
# backward at 5125 on m and F.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03g/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
D=bench/results/h200-2026-12-03g
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for v in F O; do
  rm -rf /tmp/$v && mkdir /tmp/$v && cp -r csrc polynorm setup.py pyproject.toml /tmp/$v/
done
(cd /tmp/F/csrc && patch -p1 -s < "$ROOT/$D/F.patch") || echo "patch F failed"
(cd /tmp/O && patch -p1 -s < "$ROOT/$D/O.patch") || echo "patch O failed"
(MAX_JOBS=6 python3 setup.py build_ext --inplace > /tmp/build_m.log 2>&1; echo "m rc=$?") &
for v in F O; do
  (cd /tmp/$v && MAX_JOBS=5 python3 setup.py build_ext --inplace > /tmp/build_$v.log 2>&1; echo "$v rc=$?") &
done
wait
stamp builds
tar czf "$OUT/builds.tgz" -C /tmp build_m.log build_F.log build_O.log
path_of() { if [ $1 = m ]; then echo $ROOT; else echo /tmp/$1; fi; }
(python3 bench/sass_load_order.py $(ls /tmp/F/polynorm/_C*.so) > "$OUT/sass_load_order_F.log" 2>&1; echo "sass F rc=$?") &
{
  for v in m F m F; do
    (cd /tmp && PYTHONPATH=$(path_of $v) timeout 60 python3 "$ROOT/bench/build_compare.py" $v \
      4096 16384 65536 3000 4097 5125 16385 65537 1001 4097v)
  done
} 2>&1 | tee "$OUT/compare_mF.log"
stamp compare_mF
{
  for v in O m O m; do
    (cd /tmp && PYTHONPATH=$(path_of $v) timeout 40 python3 "$ROOT/bench/build_compare.py" $v 5125v 16385v 2001v)
  done
} 2>&1 | tee "$OUT/compare_mO.log"
stamp compare_mO
for v in O m; do
  echo "# grouped, build $v"
  PYTHONPATH=$(path_of $v) timeout 60 python3 bench/grouped_timing.py --providers grouped --experts 8 64 \
    --shapes 16380x4097 13094x5125 16384x4096
done 2>&1 | tee "$OUT/grouped_mO.log"
stamp grouped
PYTHONPATH=$ROOT timeout 90 python3 bench/tune_rows.py --op poly_norm_mul --H 4097 5125 16385 65537 65536 \
  --aligned-only --table-only --cta 256 512 2>&1 | tee "$OUT/tune_mul_cta.log"
stamp tune
R="gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__block_size,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active"
for MH in "13094 5125" "4095 16385"; do
  for v in m F; do
    PYTHONPATH=$(path_of $v) timeout 40 ncu --profile-from-start off --clock-control none -k regex:bwd_row_kernel -c 4 \
      --metrics "$R" --csv python3 bench/results/h200-2026-12-03f/ncu_bwd.py $MH > /tmp/ncu.csv 2>&1
    python3 - $v $MH <<'PY'
import csv, sys
rows = list(csv.reader(l for l in open("/tmp/ncu.csv") if l.startswith('"')))
if not rows:
    print(sys.argv[1:], "no ncu rows"); sys.exit()
h = rows[0]; i, n, val = h.index("ID"), h.index("Metric Name"), h.index("Metric Value")
got = {}
for r in rows[1:]:
    got.setdefault(r[i], {})[r[n]] = r[val]
for k, m in got.items():
    print(sys.argv[1], sys.argv[3], "mbwd" if int(k) % 2 else "bwd ", " ".join(f"{a.split('__')[1]}={b}" for a, b in sorted(m.items())))
PY
  done
done 2>&1 | tee "$OUT/ncu.log"
stamp ncu
wait
tail -4 "$OUT/sass_load_order_F.log"
stamp end
