#!/usr/bin/env bash
# Twenty-third session, call 2 (issue 13; bench/NOTES.md v25): the commit that builds the realigning and
# same-phase row kernels twice (kWholeWarps: W = 32 at compile time for rows of 32 lanes or more)
# with the same-phase backward patches of call 1's N. Two builds in parallel: new (the repo root) and
# old (main before this session's csrc: call2_csrc.patch reversed); variants.py --more on each, old new
# new old; then the whole GPU suite on new.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03f/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
D=bench/results/h200-2026-12-03f
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
rm -rf /tmp/old && mkdir /tmp/old && cp -r csrc polynorm setup.py pyproject.toml /tmp/old/
(cd /tmp/old && patch -R -p1 -s < "$ROOT/$D/call2_csrc.patch") || echo "reverse patch failed"
(MAX_JOBS=9 python3 setup.py build_ext --inplace > /tmp/build_new.log 2>&1; echo "new rc=$?") &
(cd /tmp/old && MAX_JOBS=7 python3 setup.py build_ext --inplace > /tmp/build_old.log 2>&1; echo "old rc=$?") &
wait
stamp builds
tar czf "$OUT/builds.tgz" -C /tmp build_new.log build_old.log
path_of() { if [ $1 = new ]; then echo $ROOT; else echo /tmp/$1; fi; }
{
  for v in old new new old; do (cd /tmp && PYTHONPATH=$(path_of $v) timeout 60 python3 "$ROOT/$D/variants.py" $v --more); done
} 2>&1 | tee "$OUT/variants.log"
stamp variants
export PYTHONPATH=$ROOT
/usr/bin/time -f "suite wall %e s" timeout -s INT 320 python3 -m pytest tests/test_pt2.py tests/test_grouped.py \
  tests/test_training.py tests -v -ra -p no:cacheprovider -n 16 --dist loadgroup --durations=15 > "$OUT/tests.log" 2>&1
echo "pytest rc=$?"
grep -E "\] (FAILED|ERROR) |^FAILED|^ERROR|passed|failed|suite wall" "$OUT/tests.log" | head -20
grep -E "\] (FAILED|ERROR) " "$OUT/tests.log" | sed -E 's/.*(FAILED|ERROR) //' | sort -u > "$OUT/failed.txt"
gzip -f "$OUT/tests.log"
stamp suite
