#!/usr/bin/env bash
# Twenty-second session, call 2b (on call 2's warm machine and build; liger-kernel 0.8.5 from .whl/):
# bench/bench.py's full side-by-side sweep (every provider: the README's autograd table; issue 13's
# done condition). Builds first where the machine is not call 2's.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03e/call2b.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$(pwd) || exit 1
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
ls polynorm/_C*.so > /dev/null 2>&1 || { MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > /dev/null 2>&1; echo "build rc=$?"; }
timeout 400 python3 bench/bench.py --warmup 15 --rep 50 --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"; tail -5 "$OUT/sweep.log"
tar czf "$OUT/sweep.tgz" -C "$OUT" sweep && rm -rf "$OUT/sweep"
stamp sweep
