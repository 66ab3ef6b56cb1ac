#!/usr/bin/env bash
# Thirty-first session, call 1 (issue 13 target 1; bench/NOTES.md v34): PolyNorm's forward staged a row ahead
# (_tune_rows(stage_rows=2), forward.cuh kAlignedStaged) against the table's build. Bits and the oracle
# (stage_check.py), memcheck on a small case of it, then tune_rows: the table (f), the table on a persistent
# grid (fw1) and the staged rows (f-st2), bf16 / fp16 / fp32 at M·H = 2^26.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04f/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
D=bench/results/h200-2026-12-04f
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
git log -1 --format='commit %H' 2>/dev/null
ls polynorm/_C*.so >/dev/null 2>&1 || { MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"; gzip -f "$OUT/build.log"; }
stamp build
timeout 90 python3 $D/stage_check.py 2>&1 | tee "$OUT/stage_check.log"
stamp checks
cat > /tmp/stage_small.py <<'PY'
import torch, polynorm  # noqa: F401
ops = torch.ops.polynorm
w = torch.tensor([0.3, -0.4, 0.9], device="cuda"); b = torch.tensor([0.1], device="cuda")
for dtype, H, M in ((torch.bfloat16, 4096, 1100), (torch.bfloat16, 65536, 300), (torch.float32, 32768, 301)):
    x = torch.randn(M, H, device="cuda", dtype=dtype)
    ops._tune_rows(stage_rows=2)
    y, r = ops.forward(x, w, b, 1e-6)
    ops._tune_rows()
    y0, r0 = ops.forward(x, w, b, 1e-6)
    print(dtype, H, M, torch.equal(y, y0) and torch.equal(r, r0))
PY
timeout 120 compute-sanitizer --tool memcheck --print-limit 5 python3 /tmp/stage_small.py > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?"; tail -4 "$OUT/memcheck.log"
stamp memcheck
for dt in bfloat16 float16; do
  timeout 70 python3 bench/tune_rows.py --dtype $dt --table-only --aligned-only --persistent --stage 2 --H 4096 8192 16384 32768 65536 131072 262144
done 2>&1 | tee "$OUT/tune.log"
timeout 60 python3 bench/tune_rows.py --dtype float32 --table-only --aligned-only --persistent --stage 2 --H 4096 16384 32768 65536 131072 2>&1 | tee "$OUT/tune_fp32.log"
stamp tune
