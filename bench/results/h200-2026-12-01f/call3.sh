#!/usr/bin/env bash
# Tenth session, call 3 (issues 13, 15). Two trees built side by side in place:
# - M, the working tree: main's kernels (call 2's M; the default SASS is unchanged);
# - S, the same sources with -DPOLYNORM_STAGED_ROWS=1 (bench only: the backward's aligned rows
#   of one CTA, PolyNorm's and the fused op's, get x, grad_y (and mul) into shared memory by
#   bulk copies issued for the block's next row right after this row's reduction; the grid is
#   the persistent one, unchanged).
# Then: kernel tests at S (parity, kernels, fused op; CUDA); every output bit of M and S
# (bits_probe.py; diffed); compute-sanitizer memcheck over the staged rows (staged_check.py);
# tune_rows --aligned-only --table-only at M and S, PolyNorm and the fused op.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01f/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
HERE=$ROOT/bench/results/h200-2026-12-01f
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/gpu.txt"
rm -rf /tmp/s && mkdir /tmp/s && cp -r csrc polynorm setup.py pyproject.toml /tmp/s/
(MAX_JOBS=8 python3 setup.py build_ext --inplace > "$OUT/build_m.log" 2>&1; echo "M rc=$?") &
(cd /tmp/s && POLYNORM_NVCC_FLAGS="-DPOLYNORM_STAGED_ROWS=1" MAX_JOBS=8 python3 setup.py build_ext --inplace > "$OUT/build_s.log" 2>&1; echo "S rc=$?") &
wait
stamp builds
(PYTHONPATH=/tmp/s timeout 150 python3 -m pytest tests/test_parity.py tests/test_kernels.py tests/test_mul.py \
  -q -ra -p no:cacheprovider -k cuda -n 12 > "$OUT/tests_s.log" 2>&1; echo "pytest S rc=$?"; tail -1 "$OUT/tests_s.log") &
for v in m s; do
  dir=$ROOT; [ $v = s ] && dir=/tmp/s
  (cd /tmp && PYTHONPATH=$dir timeout 150 python3 "$HERE/bits_probe.py" > "$OUT/bits_$v.txt" 2>&1; echo "bits $v rc=$?") &
done
wait
if diff "$OUT/bits_m.txt" "$OUT/bits_s.txt" > "$OUT/bits_diff_s.txt"; then echo "bits: M and S identical ($(wc -l < "$OUT/bits_m.txt") lines)"; else echo "bits: M and S DIFFER"; head -20 "$OUT/bits_diff_s.txt"; fi
stamp tests_bits
(cd /tmp && PYTHONPATH=/tmp/s timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 python3 "$HERE/staged_check.py" > "$OUT/sanitizer_memcheck.log" 2>&1; echo "sanitizer memcheck rc=$?"; tail -2 "$OUT/sanitizer_memcheck.log")
stamp sanitizer
for v in m s m s; do
  dir=$ROOT; [ $v = s ] && dir=/tmp/s
  echo "## $v" | tee -a "$OUT/tune.log"
  (cd /tmp && PYTHONPATH=$dir timeout 60 python3 "$ROOT/bench/tune_rows.py" --aligned-only --table-only \
    --H 1024 2048 4096 8192 16384 2>&1 | tee -a "$OUT/tune.log")
  (cd /tmp && PYTHONPATH=$dir timeout 60 python3 "$ROOT/bench/tune_rows.py" --aligned-only --table-only --op poly_norm_mul \
    --H 1024 4096 8192 2>&1 | tee -a "$OUT/tune.log")
  stamp tune_$v
done
cd "$OUT" && tar czf logs.tgz gpu.txt build_*.log bits_*.txt tests_s.log sanitizer_memcheck.log && rm -f gpu.txt build_*.log bits_*.txt
ls
