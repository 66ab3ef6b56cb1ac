#!/usr/bin/env bash
# Eighth session, call 1 (issues 13, 15): A, the working tree (rows one element past whole packs
# keep that element apart, launch_plan.h slot_packs: H = 4097 on 64 threads, not 96; the
# backward's cluster fit checked on the launched build; grouped backward sized by its own build)
# against B, A with the same-phase sums' shift at compile time (call1_shift_cases.patch). The
# kernel tests at A, then tune_rows (PolyNorm bf16 and fp32, the fused op) on both.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01d/call1.sh (the call ran
# the working tree that became A; from a later commit, A is that commit's kernels).
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
rm -rf /tmp/b && mkdir /tmp/b && cp -r csrc polynorm setup.py pyproject.toml tests /tmp/b/
(MAX_JOBS=8 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "A rc=$?") &
(cd /tmp/b/csrc && patch -p1 -s < "$ROOT/bench/results/h200-2026-12-01d/call1_shift_cases.patch" && echo "B patched")
(cd /tmp/b && MAX_JOBS=8 python3 setup.py build_ext --inplace \
  > "$OUT/build_b.log" 2>&1; echo "B rc=$?") &
wait
stamp builds
timeout 170 python3 -m pytest tests/test_parity.py tests/test_kernels.py tests/test_clusters.py \
  tests/test_launch_plan.py tests/test_mul.py tests/test_grouped.py -q -ra -p no:cacheprovider -k "cuda or clusters or launch" -n 14 \
  > "$OUT/tests_kernels.log" 2>&1; echo "pytest kernels (A) rc=$?"
grep -E "^FAILED|^ERROR" "$OUT/tests_kernels.log" | head -20; tail -1 "$OUT/tests_kernels.log"
stamp tests
for v in A B; do
  dir=$ROOT; [ $v = B ] && dir=/tmp/b
  (cd /tmp && PYTHONPATH=$dir timeout 45 python3 "$ROOT/bench/tune_rows.py" --H 1024 4097 5125 16385 65537 2>&1 | tee "$OUT/tune_$v.log")
  (cd /tmp && PYTHONPATH=$dir timeout 30 python3 "$ROOT/bench/tune_rows.py" --dtype float32 --H 4097 5125 16385 --aligned-only 2>&1 \
    | tee -a "$OUT/tune_$v.log")
  (cd /tmp && PYTHONPATH=$dir timeout 30 python3 "$ROOT/bench/tune_rows.py" --op poly_norm_mul --H 4097 5125 16385 --aligned-only 2>&1 \
    | tee -a "$OUT/tune_$v.log")
  stamp tune_$v
done
