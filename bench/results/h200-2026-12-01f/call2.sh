#!/usr/bin/env bash
# Tenth session, call 2 (issues 13, 15). Three trees built side by side in place:
# - M, the working tree: main's kernels with the warp-vote expert search on by default;
# - T, the same sources with -DPOLYNORM_STAGED_ROWS=1 (bench only: aligned forward rows of one
#   CTA, PolyNorm's and the fused op's, on a persistent grid, each row's bytes brought into
#   shared memory by a bulk copy issued as soon as the slot's previous row was read);
# - R, the same sources with -DPOLYNORM_ROLL_PREFETCH=1 (call 1's R).
# Then: kernel tests at T (parity, kernels, fused op; CUDA) and grouped tests at M; every output
# bit of M, T and R (bits_probe.py; diffed); compute-sanitizer (memcheck, synccheck) over the
# staged kernel (staged_check.py); tune_rows --aligned-only at M and T, PolyNorm and the fused op;
# grouped_timing at M (the seed shape).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01f/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
HERE=$ROOT/bench/results/h200-2026-12-01f
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/gpu.txt"
for v in t r; do rm -rf /tmp/$v && mkdir /tmp/$v && cp -r csrc polynorm setup.py pyproject.toml /tmp/$v/; done
(MAX_JOBS=6 python3 setup.py build_ext --inplace > "$OUT/build_m.log" 2>&1; echo "M rc=$?") &
(cd /tmp/t && POLYNORM_NVCC_FLAGS="-DPOLYNORM_STAGED_ROWS=1" MAX_JOBS=6 python3 setup.py build_ext --inplace > "$OUT/build_t.log" 2>&1; echo "T rc=$?") &
(cd /tmp/r && POLYNORM_NVCC_FLAGS="-DPOLYNORM_ROLL_PREFETCH=1" MAX_JOBS=5 python3 setup.py build_ext --inplace > "$OUT/build_r.log" 2>&1; echo "R rc=$?") &
wait
stamp builds
(PYTHONPATH=/tmp/t timeout 150 python3 -m pytest tests/test_parity.py tests/test_kernels.py tests/test_mul.py \
  -q -ra -p no:cacheprovider -k cuda -n 10 > "$OUT/tests_t.log" 2>&1; echo "pytest T rc=$?"; tail -1 "$OUT/tests_t.log") &
(PYTHONPATH=$ROOT timeout 150 python3 -m pytest tests/test_grouped.py \
  -q -ra -p no:cacheprovider -k cuda -n 6 > "$OUT/tests_grouped_m.log" 2>&1; echo "pytest grouped M rc=$?"; tail -1 "$OUT/tests_grouped_m.log") &
wait
stamp tests
for v in m t r; do
  dir=$ROOT; [ $v != m ] && dir=/tmp/$v
  (cd /tmp && PYTHONPATH=$dir timeout 150 python3 "$HERE/bits_probe.py" > "$OUT/bits_$v.txt" 2>&1; echo "bits $v rc=$?") &
done
wait
for v in t r; do
  if diff "$OUT/bits_m.txt" "$OUT/bits_$v.txt" > "$OUT/bits_diff_$v.txt"; then echo "bits: M and $v identical ($(wc -l < "$OUT/bits_m.txt") lines)"; else echo "bits: M and $v DIFFER"; head -20 "$OUT/bits_diff_$v.txt"; fi
done
stamp bits
for tool in memcheck synccheck; do
  (cd /tmp && PYTHONPATH=/tmp/t timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 python3 "$HERE/staged_check.py" > "$OUT/sanitizer_$tool.log" 2>&1; echo "sanitizer $tool rc=$?"; tail -3 "$OUT/sanitizer_$tool.log")
done
stamp sanitizer
for v in m t; do
  dir=$ROOT; [ $v = t ] && dir=/tmp/t
  echo "## $v" | tee -a "$OUT/tune.log"
  (cd /tmp && PYTHONPATH=$dir timeout 90 python3 "$ROOT/bench/tune_rows.py" --aligned-only \
    --H 1024 2048 4096 8192 16384 32768 2>&1 | tee -a "$OUT/tune.log")
  (cd /tmp && PYTHONPATH=$dir timeout 60 python3 "$ROOT/bench/tune_rows.py" --aligned-only --op poly_norm_mul \
    --H 1024 4096 8192 16384 2>&1 | tee -a "$OUT/tune.log")
  stamp tune_$v
done
(cd /tmp && PYTHONPATH=$ROOT timeout 40 python3 "$ROOT/bench/grouped_timing.py" --providers grouped --shapes 2048x4096 16384x4096 2>&1 | tee "$OUT/grouped_m.log")
stamp grouped
cd "$OUT" && tar czf logs.tgz gpu.txt build_*.log bits_*.txt tests_*.log sanitizer_*.log && rm -f gpu.txt build_*.log bits_*.txt tests_grouped_m.log
ls
