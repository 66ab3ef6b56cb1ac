#!/usr/bin/env bash
# Thirty-second session's plan, call 1 (issue 13 target 1; bench/NOTES.md v35): PolyNorm's aligned forward of the
# wide build (16 packs a thread) at fewer registers a thread, _tune_rows(forward_regs=96 or 80) (columns f-r96,
# f-r80: 5 or 6 CTAs of 128 an SM against the table's 4), beside the narrow build of 2-byte whole-pack rows
# (_tune_rows(narrow_forward=True), column f-n8; h200-2026-12-04f/call3.sh, never run), all against the table's
# build in one run, bf16 / fp16 / fp32 at M·H = 2^26. First the GPU test that the capped builds give the table's
# bits; last, ncu of the three builds at bf16 65536 and 32768 (occupancy, DRAM throughput, local-memory traffic).
# Written in the thirty-second session, which was lent no device machine; not run there.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04g/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
# Build unless a built extension already has the switch (a warm machine keeps an older build otherwise).
python3 -c "import torch, polynorm; torch.ops.polynorm._tune_rows(forward_regs=0)" 2>/dev/null || {
  MAX_JOBS=$(nproc) POLYNORM_PTXAS_VERBOSE=1 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"
  gzip -f "$OUT/build.log"; }
stamp build
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k capped_forward > "$OUT/tests.log" 2>&1
tail -4 "$OUT/tests.log"
python3 bench/sass_load_order.py 2>&1 | tail -2 | tee -a "$OUT/tests.log"
stamp tests
python3 -c "
import torch, polynorm
ops = torch.ops.polynorm
for kw in ({}, {'narrow_forward': True}):
    ops._tune_rows(**kw)
    print(kw or 'table', [(H, ops._launch_plan('forward', H, torch.bfloat16)) for H in (512, 4096, 32768, 65536, 131072, 262144)])
ops._tune_rows()
" | tee "$OUT/plans.log"
for dt in bfloat16 float16; do
  timeout 150 python3 bench/tune_rows.py --dtype $dt --table-only --aligned-only --narrow --regs 96 80 --H 512 1024 2048 4096 8192 16384 32768 65536 131072 262144
done 2>&1 | tee "$OUT/tune_regs.log"
timeout 120 python3 bench/tune_rows.py --dtype float32 --table-only --aligned-only --regs 96 80 --H 512 1024 2048 4096 8192 16384 32768 65536 131072 2>&1 | tee -a "$OUT/tune_regs.log"
stamp tune
cat > /tmp/ncu_regs.py <<'PY'
import sys, torch, polynorm  # noqa: F401
ops = torch.ops.polynorm
H = int(sys.argv[1]); M = 2**26 // H
x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
w = torch.tensor([0.3, -0.4, 0.9], device="cuda"); b = torch.tensor([0.1], device="cuda")
for regs in (0, 96, 80):                   # the table's build, then the capped ones
    ops._tune_rows(forward_regs=regs)
    ops.forward(x, w, b, 1e-6)
ops._tune_rows()
torch.cuda.synchronize()
PY
for H in 65536 32768; do
  timeout 90 ncu --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats \
    --section MemoryWorkloadAnalysis -k regex:poly_norm_fwd_row python3 /tmp/ncu_regs.py $H > "$OUT/ncu_regs_$H.txt" 2>&1
  echo "ncu $H rc=$?"
  grep -E "poly_norm_fwd_row|Duration|Registers Per Thread|Block Limit Registers|Theoretical Occupancy|Achieved Occupancy|DRAM Throughput|Local" "$OUT/ncu_regs_$H.txt" | sed -E 's/\(const T1 \*[^)]*\)//' | cut -c1-200
done
stamp ncu
