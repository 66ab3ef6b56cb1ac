#!/usr/bin/env bash
# Twenty-first session, call 3 (issues 15, 14; bench/NOTES.md v23). Calls 1-2: the forward's idle-slot
# branches stay (every branch-free variant lost at 2^26); the fused forward at 2048 x 1024 stalls on
# the instruction cache (imc miss 0.81-0.85, no instruction 0.62-0.97). Two builds in parallel: m (as
# committed) and f (-DPOLYNORM_FWD_MUL_HOIST=1: mul's packs loaded as 16-byte vectors under one
# branch for rows whose mul is aligned and whole, instead of load_pack's per-pack branch and its
# element-wise path; the same bits). fwd_variants.py on both (one full pass each, then the seed
# shapes in the other order); ncu's durations and stalls of both forwards at 2048 x 1024 / 4096 on
# both builds; ops_timing --graph (floors eager now) for both ops on m: the README's kernel tables.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03d/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
D=bench/results/h200-2026-12-03d
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
rm -rf /tmp/f && mkdir /tmp/f && cp -r csrc polynorm setup.py pyproject.toml /tmp/f/
(MAX_JOBS=8 python3 setup.py build_ext --inplace > /tmp/build_m.log 2>&1; echo "m rc=$?") &
(cd /tmp/f && POLYNORM_NVCC_FLAGS=-DPOLYNORM_FWD_MUL_HOIST=1 MAX_JOBS=8 python3 setup.py build_ext --inplace \
  > /tmp/build_f.log 2>&1; echo "f rc=$?") &
wait
stamp builds
tar czf "$OUT/builds.tgz" -C /tmp build_m.log build_f.log
run() {  # label, extra args
  P=$ROOT; [ $1 = m ] || P=/tmp/$1
  (cd /tmp && PYTHONPATH=$P timeout 45 python3 "$ROOT/$D/fwd_variants.py" "$@")
}
{
  run m; run f
  for v in f m f m; do run $v --seed-only; done
} 2>&1 | tee "$OUT/variants.log"
stamp variants
R="smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio"
R="$R,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__inst_executed.sum,gpu__time_duration.sum"
for v in m f m f; do
  P=$ROOT; [ $v = m ] || P=/tmp/$v
  for H in 1024 4096; do
    PYTHONPATH=$P timeout 40 ncu --profile-from-start off --clock-control none -k regex:fwd_row_kernel -c 4 \
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
export PYTHONPATH=$ROOT
timeout 100 python3 bench/ops_timing.py --graph > "$OUT/ops_timing_graph.log" 2>&1; echo "graph rc=$?"
timeout 100 python3 bench/ops_timing.py --graph --op poly_norm_mul > "$OUT/ops_timing_graph_mul.log" 2>&1
echo "graph mul rc=$?"
cat "$OUT/ops_timing_graph.log" "$OUT/ops_timing_graph_mul.log"
stamp graph
