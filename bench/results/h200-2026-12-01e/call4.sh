#!/usr/bin/env bash
# Ninth session, call 4 (issues 13, 15): the whole GPU suite on main's kernels, built in place;
# first an ncu of the single-expert and grouped row kernels at M = 16384, H = 4096, E = 64
# (grouped forward 1.15 against 1.06 of a copy, call 3's grouped_probe.log). As run in call 4, the
# line after ncu removed the ncu tarball with its inputs (a glob that matched it); fixed here, and
# call 5 ran the build and ncu steps again (SKIP_SUITE=1).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01e/call4.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
ROOT=$(pwd)
HERE=$ROOT/bench/results/h200-2026-12-01e
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
MAX_JOBS=16 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
rep="$OUT/ncu_grouped"
(cd /tmp && timeout 120 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
  --section WarpStateStats --section SourceCounters --section LaunchStats --import-source yes \
  -k regex:row_kernel --launch-skip 4 -c 4 -f -o "$rep" python3 "$HERE/grouped_profile.py" 16384 4096 64 > "$rep.log" 2>&1)
echo "ncu rc=$?"
ncu --import "$rep.ncu-rep" --page details --print-details all > "$rep.txt" 2>&1
ncu --import "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.sass.csv" 2>&1
tar czf "$OUT/ncu_grouped.tgz" -C "$OUT" ncu_grouped.log ncu_grouped.ncu-rep ncu_grouped.txt ncu_grouped.sass.csv \
  && rm -f "$OUT"/ncu_grouped.{log,ncu-rep,txt,sass.csv}
stamp ncu
[ "${SKIP_SUITE:-0}" = 1 ] && exit 0
/usr/bin/time -f "suite wall %e s" timeout -s INT 330 python3 -m pytest tests/test_pt2.py \
  tests/test_grouped.py tests/test_training.py tests -q -ra -p no:cacheprovider \
  -n 16 --dist loadgroup --durations=15 > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|^ERROR|passed|failed|suite wall" "$OUT/tests.log" | head -40
stamp suite
