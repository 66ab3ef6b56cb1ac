#!/usr/bin/env bash
# Tenth session, call 1 (issues 13, 14, 15). Two trees built side by side in place:
# - M, the working tree: main's kernels;
# - RB, the same sources with -DPOLYNORM_ROLL_PREFETCH=1 -DPOLYNORM_BALLOT_SEARCH=1 (bench-only
#   flags: the aligned one-CTA rows load the next row's packs as this row's are stored; the
#   grouped rows of a warp or more search their expert by a warp vote). The flags touch
#   disjoint kernels (R: aligned rows not grouped; B: grouped rows only), so one tree holds both.
# Then: the kernel tests at RB (parity, kernels, grouped, fused op; CUDA only); every output bit
# of M and RB at fixed inputs (bits_probe.py; diffed); tune_rows --aligned-only on both, PolyNorm
# and the fused op, with the grid columns; grouped_timing --providers grouped on both; the
# Triton forward's launch configurations (triton_probe.py); the reduce-overhead probe with
# layer_norm's baseline (ro_probe.py).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01f/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
HERE=$ROOT/bench/results/h200-2026-12-01f
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/gpu.txt"
rm -rf /tmp/rb && mkdir /tmp/rb && cp -r csrc polynorm setup.py pyproject.toml /tmp/rb/
(MAX_JOBS=8 python3 setup.py build_ext --inplace > "$OUT/build_m.log" 2>&1; echo "M rc=$?") &
(cd /tmp/rb && POLYNORM_NVCC_FLAGS="-DPOLYNORM_ROLL_PREFETCH=1 -DPOLYNORM_BALLOT_SEARCH=1" MAX_JOBS=8 \
  python3 setup.py build_ext --inplace > "$OUT/build_rb.log" 2>&1; echo "RB rc=$?") &
wait
stamp builds
PYTHONPATH=/tmp/rb timeout 150 python3 -m pytest tests/test_parity.py tests/test_kernels.py tests/test_grouped.py tests/test_mul.py \
  -q -ra -p no:cacheprovider -k cuda -n 16 > "$OUT/tests_rb.log" 2>&1; echo "pytest RB rc=$?"
tail -2 "$OUT/tests_rb.log"
stamp tests
for v in m rb; do
  dir=$ROOT; [ $v = rb ] && dir=/tmp/rb
  (cd /tmp && PYTHONPATH=$dir timeout 150 python3 "$HERE/bits_probe.py" > "$OUT/bits_$v.txt" 2>&1; echo "bits $v rc=$?")
done
if diff "$OUT/bits_m.txt" "$OUT/bits_rb.txt" > "$OUT/bits_diff.txt"; then echo "bits: M and RB identical ($(wc -l < "$OUT/bits_m.txt") lines)"; else echo "bits: DIFFER"; cat "$OUT/bits_diff.txt"; fi
stamp bits
for v in m rb; do
  dir=$ROOT; [ $v = rb ] && dir=/tmp/rb
  echo "## $v" | tee -a "$OUT/tune.log"
  (cd /tmp && PYTHONPATH=$dir timeout 90 python3 "$ROOT/bench/tune_rows.py" --aligned-only \
    --H 1024 2048 4096 8192 16384 32768 65536 2>&1 | tee -a "$OUT/tune.log")
  (cd /tmp && PYTHONPATH=$dir timeout 60 python3 "$ROOT/bench/tune_rows.py" --aligned-only --op poly_norm_mul \
    --H 1024 4096 8192 16384 32768 2>&1 | tee -a "$OUT/tune.log")
  (cd /tmp && PYTHONPATH=$dir timeout 60 python3 "$ROOT/bench/grouped_timing.py" --providers grouped 2>&1 | tee -a "$OUT/grouped_$v.log")
  stamp tune_$v
done
(cd /tmp && PYTHONPATH=$ROOT timeout 60 python3 "$HERE/triton_probe.py" 2>&1 | tee "$OUT/triton_probe.log")
stamp triton
(cd /tmp && PYTHONPATH=$ROOT timeout 90 python3 "$HERE/ro_probe.py" --forms layer_norm eager "reduce-overhead, autograd" "reduce-overhead, static" --shapes 2048x1024 2048x4096 --no-profile > "$OUT/ro_probe.log" 2>&1; echo "ro_probe rc=$?"; grep -E "^##|x floor" "$OUT/ro_probe.log")
stamp ro_probe
cd "$OUT" && tar czf logs.tgz gpu.txt build_*.log bits_*.txt tests_rb.log && rm -f gpu.txt build_*.log bits_m.txt bits_rb.txt
ls
