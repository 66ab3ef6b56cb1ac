#!/usr/bin/env bash
# Eighth session, call 6 (issue 13): D, the working tree (the row kernels' integer divisions by
# run-time G, W and C replaced by shifts and masks, the in-warp reduction unrolled where W = 32,
# global loads and stores kept LDG/STG in the realigning builds: call6_d.patch on f12e3a4) against
# A (f12e3a4: the patch reversed). tune_rows on both (the table's grid; D also with every grid
# at odd H), then the whole GPU suite on D.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01d/call6.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
rm -rf /tmp/a && mkdir /tmp/a && cp -r csrc polynorm setup.py pyproject.toml /tmp/a/
(cd /tmp/a && patch -p1 -R -s < "$ROOT/bench/results/h200-2026-12-01d/call6_d.patch" && echo "A: patch reversed")
(MAX_JOBS=8 python3 setup.py build_ext --inplace > "$OUT/build_d.log" 2>&1; echo "D rc=$?") &
(cd /tmp/a && MAX_JOBS=8 python3 setup.py build_ext --inplace > "$OUT/build_a.log" 2>&1; echo "A rc=$?") &
wait
stamp builds
for v in a d; do
  dir=$ROOT; [ $v = a ] && dir=/tmp/a
  echo "## $v" >> "$OUT/tune.log"
  (cd /tmp && PYTHONPATH=$dir timeout 60 python3 "$ROOT/bench/tune_rows.py" --table-only --aligned-only \
    --H 1024 4096 16384 4097 5125 16385 65537 2>&1 | tee -a "$OUT/tune.log")
  (cd /tmp && PYTHONPATH=$dir timeout 30 python3 "$ROOT/bench/tune_rows.py" --table-only --aligned-only --dtype float32 \
    --H 1024 4097 5125 2>&1 | tee -a "$OUT/tune.log")
  stamp tune_$v
done
echo "## d, every grid" >> "$OUT/tune.log"
(cd /tmp && PYTHONPATH=$ROOT timeout 40 python3 "$ROOT/bench/tune_rows.py" --H 1024 4097 5125 16385 2>&1 | tee -a "$OUT/tune.log")
stamp tune_grids
python3 -m pip install -e . --no-build-isolation --no-deps > "$OUT/install.log" 2>&1; echo "install rc=$?"
stamp install
/usr/bin/time -f "suite wall %e s" timeout -s INT 300 python3 -m pytest tests/test_pt2.py \
  tests/test_grouped.py tests/test_training.py tests -q -ra -p no:cacheprovider \
  -n 16 --dist loadgroup --durations=15 > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR|passed|failed|suite wall" "$OUT/tests.log" | head -40
stamp suite
