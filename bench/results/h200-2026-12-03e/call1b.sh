#!/usr/bin/env bash
# Twenty-second session, call 1b (on call 1's warm machine, its builds in place): where the odd-H
# backward's instructions go now (bench/NOTES.md v24): ncu with SourceCounters of the row kernels at
# H = 5125 on m (bench/device_run.sh's ncu_rows stage: details, raw metrics and SASS lines as text),
# then the kernel tests that the two switches touch, on u's build (the fused ops' layouts and graphs,
# the misaligned rows' bits, batch invariance, the staggered starts).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03e/call1b.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
PYTHONPATH=$ROOT NCU_H=5125 bash bench/device_run.sh ncu_rows > "$OUT/ncu_rows_run.log" 2>&1; echo "ncu_rows rc=$?"
stamp ncu_rows
rm -rf /tmp/t && mkdir /tmp/t && cp -r tests README.md docs examples bench setup.py pyproject.toml /tmp/t/ && cp -r /tmp/u/polynorm /tmp/t/
(cd /tmp/t && timeout 150 python3 -m pytest tests/test_mul.py tests/test_kernels.py tests/test_launch_plan.py -q \
  -p no:cacheprovider -n 16 -k "graph_capture or misaligned or independent_layouts or batch_invariance or staggered or plan" \
  > "$OUT/smoke_u.log" 2>&1; echo "smoke u rc=$?")
grep -E "^FAILED|^ERROR" "$OUT/smoke_u.log" | head; tail -1 "$OUT/smoke_u.log"
stamp done
