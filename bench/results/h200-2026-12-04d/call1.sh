#!/usr/bin/env bash
# Twenty-ninth session, call 1 (issues 13, 15; bench/NOTES.md v32): the backward's aligned rows of clusters
# through shared-memory stages a row ahead (a bench-only build, _tune_rows(stage_rows=True), columns b-st /
# mb-st), against the table's, which now sums the cluster slots four at a time (reduce.cuh). Bits checked by
# tune_rows (err inf on any difference from the table's); memcheck of the staged build on small M.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04d/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"; gzip -f "$OUT/build.log"
stamp build
cat > /tmp/stage_check.py <<'PY'
import torch, polynorm
ops = torch.ops.polynorm
torch.manual_seed(1)
for dt in (torch.bfloat16, torch.float32):
    for H in (65536, 131072, 262144):
        M = 6
        x = torch.randn(M, H, device="cuda", dtype=dt); g = torch.randn_like(x); m = torch.randn_like(x)
        w = torch.tensor([0.3, -0.4, 0.9], device="cuda"); b = torch.tensor([0.1], device="cuda")
        _, rstd = ops.forward(x, w, b, 1e-6)
        _, rstd_m = ops.mul_forward(x, m, w, b, 1e-6)
        ref = ops.backward(g, x, w, rstd); refm = ops.mul_backward(g, x, m, w, b, rstd_m)
        ops._tune_rows(stage_rows=True)
        got = ops.backward(g, x, w, rstd); gotm = ops.mul_backward(g, x, m, w, b, rstd_m)
        ops._tune_rows()
        same = all(torch.equal(a, c) for a, c in zip(got, ref)) and all(torch.equal(a, c) for a, c in zip(gotm, refm))
        print(dt, H, ops._launch_plan("backward", H, dt), "| staged == table, bitwise:", same)
torch.cuda.synchronize()
PY
python3 /tmp/stage_check.py 2>&1 | tee "$OUT/stage_check.log"
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 /tmp/stage_check.py > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?"; tail -3 "$OUT/memcheck.log"
stamp checks
for pass in 1 2; do
  timeout 60 python3 bench/tune_rows.py --table-only --aligned-only --stage --H 32768 65536 131072 262144
done 2>&1 | tee "$OUT/tune.log"
timeout 40 python3 bench/tune_rows.py --op poly_norm_mul --table-only --aligned-only --stage --H 32768 65536 131072 262144 2>&1 | tee "$OUT/tune_mul.log"
timeout 40 python3 bench/tune_rows.py --dtype float32 --table-only --aligned-only --stage --H 65536 131072 262144 2>&1 | tee "$OUT/tune_fp32.log"
stamp tune
