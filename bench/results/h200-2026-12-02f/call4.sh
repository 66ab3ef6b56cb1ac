#!/usr/bin/env bash
# Seventeenth session, call 4 (issues 13, 15; bench/NOTES.md v19): the odd-H rows back on the
# persistent grid (the sum apart kept) and a misaligned view of whole packs on a block per R rows,
# against the other grids (tune_rows --apart); then the whole GPU suite.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-02f/call4.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
{
  timeout 40 python3 bench/tune_rows.py --table-only --apart 0 1 --H 3000 4097 5125 4096
  timeout 25 python3 bench/tune_rows.py --table-only --aligned-only --dtype float16 --apart 0 1 --H 3000 4097
} 2>&1 | tee "$OUT/tune.log"
stamp tune
/usr/bin/time -f "suite wall %e s" timeout -s INT 380 python3 -m pytest tests/test_pt2.py tests/test_grouped.py \
  tests/test_training.py tests -v -ra -p no:cacheprovider -n 16 --dist loadgroup --durations=15 > "$OUT/tests.log" 2>&1
echo "pytest rc=$?"
grep -E "\] (FAILED|ERROR) |^FAILED|^ERROR|passed|failed|suite wall" "$OUT/tests.log" | head -20
grep -E "\] (FAILED|ERROR) " "$OUT/tests.log" | sed -E 's/.*(FAILED|ERROR) //' | sort -u > "$OUT/failed.txt"
echo "sum-apart cases passed: $(grep -cE 'PASSED tests/test_kernels.py::test_(param_grads_summed_apart|cuda_graph_capture_of_either)' "$OUT/tests.log")"
gzip -f "$OUT/tests.log"
stamp suite
