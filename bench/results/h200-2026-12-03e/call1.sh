#!/usr/bin/env bash
# Twenty-second session, call 1 (issues 15, 13; bench/NOTES.md v24). Three builds in parallel: m (as
# committed), f (-DPOLYNORM_FWD_MUL_HOIST=1: the fused forward's mul loads hoisted, the branch as on
# main since 8aded82, never GPU-run) and u (f plus -DPOLYNORM_ROW_REDUCE_ROLLED=1: the forwards'
# cross-warp loop in row_reduce kept rolled; locally 3680 -> 3240 SASS lines in the bf16 8-pack fused forward). variants.py on each (every CUDA op, seed shapes and 2^26, with each
# build's bit signature), then the seed shapes again in the other order; ncu durations, instructions
# and instruction-cache stalls of both forwards at 2048 x 1024 / 2048 / 4096, m f u m f u.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03e/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
D=bench/results/h200-2026-12-03e
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
declare -A FLAGS=([f]="-DPOLYNORM_FWD_MUL_HOIST=1" [u]="-DPOLYNORM_FWD_MUL_HOIST=1 -DPOLYNORM_ROW_REDUCE_ROLLED=1")
for v in f u; do rm -rf /tmp/$v && mkdir /tmp/$v && cp -r csrc polynorm setup.py pyproject.toml /tmp/$v/; done
(MAX_JOBS=6 python3 setup.py build_ext --inplace > /tmp/build_m.log 2>&1; echo "m rc=$?") &
for v in f u; do
  (cd /tmp/$v && POLYNORM_NVCC_FLAGS="${FLAGS[$v]}" MAX_JOBS=5 python3 setup.py build_ext --inplace \
    > /tmp/build_$v.log 2>&1; echo "$v rc=$?") &
done
wait
stamp builds
tar czf "$OUT/builds.tgz" -C /tmp build_m.log build_f.log build_u.log
path_of() { if [ $1 = m ]; then echo $ROOT; else echo /tmp/$1; fi; }
{
  for v in m f u; do (cd /tmp && PYTHONPATH=$(path_of $v) timeout 80 python3 "$ROOT/$D/variants.py" $v); done
  for v in u f m u f m; do (cd /tmp && PYTHONPATH=$(path_of $v) timeout 30 python3 "$ROOT/$D/variants.py" $v --seed-only); done
} 2>&1 | tee "$OUT/variants.log"
stamp variants
R="smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio,smsp__inst_executed.sum,gpu__time_duration.sum"
for H in 1024 2048 4096; do
  for v in m f u m f u; do
    PYTHONPATH=$(path_of $v) timeout 40 ncu --profile-from-start off --clock-control none -k regex:fwd_row_kernel -c 4 \
      --metrics "$R" --csv python3 bench/results/h200-2026-12-03c/ncu_small.py 2048 $H > /tmp/ncu.csv 2>&1
    python3 - $v $H <<'PY'
import csv, sys
rows = list(csv.reader(l for l in open("/tmp/ncu.csv") if l.startswith('"')))
h = rows[0]; i, n, val = h.index("ID"), h.index("Metric Name"), h.index("Metric Value")
got = {}
for r in rows[1:]:
    got.setdefault(r[i], {})[r[n].replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", "")] = r[val]
for k, m in got.items():
    print(sys.argv[1], sys.argv[2], "fused" if int(k) % 2 else "poly ", " ".join(f"{a}={b}" for a, b in sorted(m.items())))
PY
  done
done 2>&1 | tee "$OUT/ncu.log"
stamp ncu
