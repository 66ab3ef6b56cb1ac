#!/usr/bin/env bash
# Twenty-third session, call 5 (bench/NOTES.md v25): main after the review (launch.cuh row_kernel's
# dispatch folded, with asserts; short_rows in packs.cuh; the class read-back asm with a memory
# clobber: the same SASS for the backward builds checked locally; ops_timing.py --no-triton for the
# fused op, not run here: the session's device time ran short): the smoke subset and every
# misaligned-equals-aligned and cluster test on the GPU, and variants.py --more once.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03f/call5.sh
set -uo pipefail
OUT="${OUT:-out}"
D=bench/results/h200-2026-12-03f
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
gzip -f "$OUT/build.log"
stamp build
timeout -s INT 120 python3 -m pytest -m smoke tests -q -ra -p no:cacheprovider -n 16 --dist loadgroup \
  > "$OUT/smoke.log" 2>&1; echo "smoke rc=$?"; tail -3 "$OUT/smoke.log"
timeout -s INT 80 python3 -m pytest tests/test_kernels.py tests/test_mul.py tests/test_clusters.py \
  -k "misaligned_rows_give or cluster" -q -ra -p no:cacheprovider -n 16 > "$OUT/bits.log" 2>&1
echo "bits rc=$?"; tail -3 "$OUT/bits.log"
stamp tests
(cd /tmp && timeout 40 python3 "$ROOT/$D/variants.py" new --more) 2>&1 | tee "$OUT/variants.log"
stamp variants
