#!/usr/bin/env bash
# Sixth session, call 1 (issue 13): where the mid rows' time goes, and three occupancy variants.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01b/call1.sh
# - build: main (pip install -e .) and, in parallel, a copy at -DPOLYNORM_ROW_MIN_BLOCKS=4 (the
#   256-thread builds at 64 registers) in /tmp/mb4;
# - tune_rows, aligned rows: 8 / 4 / 16 packs forward, 4 / 8 backward (16 and 8: the wide builds, 128
#   registers), main then mb4;
# - row_probe rounds (M around 2^26 / H) and ncu of the row kernels at H = 2048 and 8192;
# - row_probe compile: torch.compile's forward and its generated kernels.
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
rm -rf /tmp/mb4 && mkdir /tmp/mb4 && cp -r csrc polynorm bench setup.py pyproject.toml /tmp/mb4/ 2>/dev/null
(cd /tmp/mb4 && POLYNORM_NVCC_FLAGS=-DPOLYNORM_ROW_MIN_BLOCKS=4 MAX_JOBS=8 python3 setup.py build_ext --inplace \
  > "$OUT/build_mb4.log" 2>&1; echo "mb4 build rc=$?") &
MAX_JOBS=8 OUT="$OUT" bash bench/device_run.sh build
wait
stamp build
H_ROWS="512 2048 4096 8192 16384 32768"
timeout 100 python3 bench/tune_rows.py --aligned-only --H $H_ROWS 2>&1 | tee "$OUT/tune_main.log"
stamp tune_main
PYTHONPATH=/tmp/mb4 python3 -c "import polynorm; print('mb4 polynorm from', polynorm.__file__)"
PYTHONPATH=/tmp/mb4 timeout 100 python3 bench/tune_rows.py --aligned-only --H $H_ROWS 2>&1 | tee "$OUT/tune_mb4.log"
stamp tune_mb4
timeout 80 python3 bench/row_probe.py rounds --H 2048 8192 16384 2>&1 | tee "$OUT/probe_rounds.log"
stamp rounds
OUT="$OUT" NCU_H="2048 8192" bash bench/device_run.sh ncu_rows
stamp ncu
timeout 100 python3 bench/row_probe.py compile --H 4096 8192 16384 32768 --code "$OUT/inductor" 2>&1 | tee "$OUT/probe_compile.log"
tar czf "$OUT/inductor.tgz" -C "$OUT" inductor && rm -rf "$OUT/inductor"
stamp compile
