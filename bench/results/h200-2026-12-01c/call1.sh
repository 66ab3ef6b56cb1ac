#!/usr/bin/env bash
# Seventh session, call 1 (issues 13, 15): the realigning row builds with the row's end masked once
# a row (mask_row_end) instead of every pack (mask_pack), the same-phase builds without the dead
# realigned path, and warp-idle slots skipped in every layout (c: main, pip-installed), against
# the same without the idle skip (b: call1_no_idle.patch) and c at 128 registers for the narrow
# builds (d: -DPOLYNORM_ROW_MIN_BLOCKS=2). Three in-place builds, no pip install (which PYTHONPATH
# would not override): c in the repo, b and d in /tmp copies; PYTHONPATH picks each. Old main's figures: h200-2026-12-01b/call4/tune_bf16.log.
# Then the kernel tests at c, and the forward's rows a block at M = 2048 (row_probe.py rows).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01c/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
for v in b d; do rm -rf /tmp/$v && mkdir /tmp/$v && cp -r csrc polynorm setup.py pyproject.toml /tmp/$v/; done
(cd /tmp/b/csrc && patch -p1 -s < "$ROOT/bench/results/h200-2026-12-01c/call1_no_idle.patch" && echo "b patched")
(MAX_JOBS=8 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "c rc=$?") &
(cd /tmp/b && MAX_JOBS=4 python3 setup.py build_ext --inplace > "$OUT/build_b.log" 2>&1; echo "b rc=$?") &
(cd /tmp/d && POLYNORM_NVCC_FLAGS=-DPOLYNORM_ROW_MIN_BLOCKS=2 MAX_JOBS=4 python3 setup.py build_ext --inplace \
  > "$OUT/build_d.log" 2>&1; echo "d rc=$?") &
wait
stamp builds
PYTHONPATH=$ROOT timeout 170 python3 -m pytest tests/test_parity.py tests/test_kernels.py tests/test_clusters.py tests/test_launch_plan.py \
  tests/test_mul.py tests/test_grouped.py -q -ra -p no:cacheprovider -k "cuda or clusters or launch" -n 14 \
  > "$OUT/tests_kernels.log" 2>&1; echo "pytest kernels rc=$?"
grep -E "^FAILED|^ERROR" "$OUT/tests_kernels.log" | head -20; tail -1 "$OUT/tests_kernels.log"
stamp tests
PYTHONPATH=$ROOT timeout 50 python3 bench/tune_rows.py --H 1024 8192 4097 5125 16385 65537 2>&1 | tee "$OUT/tune_c.log"
stamp tune_c
for v in b d; do
  (cd /tmp && PYTHONPATH=/tmp/$v timeout 50 python3 "$ROOT/bench/tune_rows.py" --H 1024 8192 4097 5125 16385 65537 2>&1 | tee "$OUT/tune_$v.log")
  stamp tune_$v
done
PYTHONPATH=$ROOT timeout 60 python3 bench/row_probe.py rows --H 1024 2048 4096 8192 2>&1 | tee "$OUT/probe_rows.log"
stamp rows
