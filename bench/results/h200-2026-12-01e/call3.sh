#!/usr/bin/env bash
# Ninth session, call 3 (issues 13, 14, 15), on main's kernels (the working tree): build in place;
# grouped_probe.py (host or kernel: the grouped op's gap at M = 2048); ro_probe.py again (with
# static inputs); ops_timing for PolyNorm and the fused op (the README's tables); ncu of the row
# kernels at H = 16384 and 32768 (forward 1.06 against 1.16 of a copy: 128- against 256-thread rows).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01e/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
ROOT=$(pwd)
HERE=$ROOT/bench/results/h200-2026-12-01e
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
MAX_JOBS=16 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
(cd /tmp && timeout 90 python3 "$HERE/grouped_probe.py" 2>&1 | tee "$OUT/grouped_probe.log")
stamp grouped_probe
(cd /tmp && timeout 110 python3 "$HERE/ro_probe.py" > "$OUT/ro_probe.log" 2>&1; echo "ro_probe rc=$?"; grep -E "^##|x floor" "$OUT/ro_probe.log")
stamp ro_probe
OUT=$OUT NCU_H="16384 32768" bash bench/device_run.sh timing mul_timing ncu_rows
stamp all
