#!/usr/bin/env bash
# Eleventh session, call 2 (issue 13): main's kernels (the claims removed: polynorm_cuda.cu as at
# 49f5b94), built in place. First ncu with source counters of the odd-H row kernels at H = 5125 and
# 16385 (bf16, the table's builds: the forward and the backward's same-phase builds; warp states,
# stall reasons and SASS lines), for the odd-H backward (1.37-1.66 of an add against issue 13's
# 1.20); then the whole GPU suite, which runs tests/test_grouped.py's warp-vote cases on CUDA for
# the first time.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01g/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
OUT=$OUT NCU_H="5125 16385" bash bench/device_run.sh ncu_rows 2>&1 | grep -v "^NVIDIA\|^torch"
stamp ncu
/usr/bin/time -f "suite wall %e s" timeout -s INT 330 python3 -m pytest tests/test_pt2.py \
  tests/test_grouped.py tests/test_training.py tests -q -ra -p no:cacheprovider \
  -n 16 --dist loadgroup --durations=15 > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR|passed|failed|suite wall" "$OUT/tests.log" | head -40
timeout 60 python3 -m pytest tests/test_grouped.py -k "warp_vote and cuda" -q -rA -p no:cacheprovider > "$OUT/tests_vote.log" 2>&1
echo "pytest vote rc=$?"; grep -c "^PASSED" "$OUT/tests_vote.log"; tail -1 "$OUT/tests_vote.log"
stamp suite
