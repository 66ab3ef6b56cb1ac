#!/usr/bin/env bash
# Ninth session, call 2 (issues 13, 14, 15), on the working tree (9770e08's row kernels; P: the
# grouped backward's parameter sums over 1024 threads of 4 running sums). Build in place, the
# grouped tests (CUDA), grouped_timing, the reduce-overhead probe, then the full side-by-side
# sweep (liger-kernel from .whl/, carried).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01e/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
ROOT=$(pwd)
HERE=$ROOT/bench/results/h200-2026-12-01e
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$ROOT:/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
MAX_JOBS=16 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
stamp build
timeout 100 python3 -m pytest tests/test_grouped.py -q -ra -p no:cacheprovider -k cuda -n 16 \
  > "$OUT/tests_grouped.log" 2>&1; echo "pytest grouped rc=$?"; tail -1 "$OUT/tests_grouped.log"
stamp tests
(cd /tmp && timeout 120 python3 "$ROOT/bench/grouped_timing.py" --out "$OUT/grouped_timing.json" 2>&1 | tee "$OUT/grouped_timing.log")
stamp grouped
(cd /tmp && timeout 100 python3 "$HERE/ro_probe.py" > "$OUT/ro_probe.log" 2>&1; echo "ro_probe rc=$?"; grep -E "^##|x floor" "$OUT/ro_probe.log")
stamp ro_probe
timeout 280 python3 bench/bench.py --warmup 15 --rep 50 --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"; tar czf "$OUT/sweep.tgz" -C "$OUT" sweep && rm -rf "$OUT/sweep"
stamp sweep
