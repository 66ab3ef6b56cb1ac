#!/usr/bin/env bash
# Ninth session, call 1 (issues 13, 14, 15). Three trees built side by side in place:
# - E, the working tree: grouped rows load before their expert is searched (call1_e.patch);
# - D, main's kernels (9770e08: call1_e.patch reversed);
# - S, E built with -DPOLYNORM_IDLE_SKIP=1 (same-phase rows skip the sums of warp-slots past
#   the row's chunks).
# Then: the kernel tests at E (parity, kernels, grouped, fused op; CUDA only), tune_rows E
# against S at odd H (PolyNorm and the fused op), grouped_timing at E (all shapes) and D (the
# seed shape), and the reduce-overhead probe (ro_probe.py).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01e/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
HERE=$ROOT/bench/results/h200-2026-12-01e
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
for v in d s; do rm -rf /tmp/$v && mkdir /tmp/$v && cp -r csrc polynorm setup.py pyproject.toml /tmp/$v/; done
(cd /tmp/d && patch -p1 -R -s < "$HERE/call1_e.patch" && echo "D: patch reversed")
(MAX_JOBS=6 python3 setup.py build_ext --inplace > "$OUT/build_e.log" 2>&1; echo "E rc=$?") &
(cd /tmp/d && MAX_JOBS=5 python3 setup.py build_ext --inplace > "$OUT/build_d.log" 2>&1; echo "D rc=$?") &
(cd /tmp/s && POLYNORM_NVCC_FLAGS=-DPOLYNORM_IDLE_SKIP=1 MAX_JOBS=5 python3 setup.py build_ext --inplace > "$OUT/build_s.log" 2>&1; echo "S rc=$?") &
wait
stamp builds
PYTHONPATH=$ROOT timeout 200 python3 -m pytest tests/test_parity.py tests/test_kernels.py tests/test_grouped.py tests/test_mul.py \
  -q -ra -p no:cacheprovider -k cuda -n 16 > "$OUT/tests_kernels.log" 2>&1; echo "pytest kernels rc=$?"
tail -3 "$OUT/tests_kernels.log"
stamp tests
for v in e s; do
  dir=$ROOT; [ $v = s ] && dir=/tmp/s
  echo "## $v" >> "$OUT/tune.log"
  (cd /tmp && PYTHONPATH=$dir timeout 60 python3 "$ROOT/bench/tune_rows.py" --table-only --aligned-only \
    --H 4096 3000 4097 5125 16385 65537 2>&1 | tee -a "$OUT/tune.log")
  (cd /tmp && PYTHONPATH=$dir timeout 40 python3 "$ROOT/bench/tune_rows.py" --table-only --aligned-only --op poly_norm_mul \
    --H 4097 5125 16385 2>&1 | tee -a "$OUT/tune.log")
  stamp tune_$v
done
(cd /tmp && PYTHONPATH=$ROOT timeout 150 python3 "$ROOT/bench/grouped_timing.py" --out "$OUT/grouped_timing.json" 2>&1 | tee "$OUT/grouped_timing.log")
stamp grouped_e
(cd /tmp && PYTHONPATH=/tmp/d timeout 40 python3 "$ROOT/bench/grouped_timing.py" --shapes 2048x4096 --providers grouped 2>&1 | tee "$OUT/grouped_timing_d.log")
stamp grouped_d
(cd /tmp && PYTHONPATH=$ROOT timeout 100 python3 "$HERE/ro_probe.py" > "$OUT/ro_probe.log" 2>&1; echo "ro_probe rc=$?"; grep -E "^##|x floor" "$OUT/ro_probe.log")
stamp ro_probe
