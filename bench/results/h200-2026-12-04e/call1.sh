#!/usr/bin/env bash
# Thirtieth session, call 1 (issue 15, and 13's odd rows; bench/NOTES.md v33): the fused backward's odd rows in 2- and
# 4-byte dtypes hold their whole packs in slots and the 2 to kVec - 1 elements past them on the last lane (a wide
# tail: builds kSamePhaseTail / kRealignedTail) where that takes fewer lanes (csrc/launch_plan.h row_tail_plan; bf16
# 5125: one CTA of 160 threads, not two of 96). Memcheck and bitwise layout checks of rows with tails of 1-7
# elements; the CUDA tests of the fused op and of misaligned rows; tune_rows against the plans of before
# (--no-tail, _tune_rows(tail_rows=False)).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04e/call1.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc=$?"; gzip -f "$OUT/build.log"
stamp build
cat > /tmp/tail_check.py <<'PY'
# Rows with tails of 1-7 elements (bf16; fp32 1-3), aligned and one element into a buffer, both ops, both
# directions: the view's bits against the aligned rows' (new outputs each call; the suite's tests poison theirs).
import torch, polynorm
ops = torch.ops.polynorm
gen = torch.Generator(device="cuda").manual_seed(3)
def view(t):
    buf = torch.full((t.numel() + 1,), float("nan"), device="cuda", dtype=t.dtype)
    buf[1:].copy_(t.reshape(-1))
    return buf[1:].view_as(t)
ok = True
for dt in (torch.bfloat16, torch.float32):
    for H in (66, 263, 2051, 4103, 5125, 5126, 16387):
        M = 7
        x, g, m = (torch.randn(M, H, device="cuda", dtype=dt, generator=gen) for _ in range(3))
        w = torch.tensor([0.3, -0.4, 0.9], device="cuda"); b = torch.tensor([0.1], device="cuda")
        def run(x, g, m):
            y, rstd = ops.forward(x, w, b, 1e-6)
            out, rstd_m = ops.mul_forward(x, m, w, b, 1e-6)
            return (y, rstd, *ops.backward(g, x, w, rstd), out, rstd_m, *ops.mul_backward(g, x, m, w, b, rstd_m))
        ref = run(x, g, m)
        got = run(view(x), view(g), view(m))
        same = all(torch.equal(a, c) for a, c in zip(ref, got))
        finite = all(bool(torch.isfinite(a).all()) for a in ref)
        ok &= same and finite
        print(dt, H, ops._launch_plan("mul_backward", H, dt), "| view == aligned, bitwise:", same, "| finite:", finite)
torch.cuda.synchronize()
print("all same:", ok)
PY
python3 /tmp/tail_check.py 2>&1 | tee "$OUT/tail_check.log"
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 /tmp/tail_check.py > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?"; tail -3 "$OUT/memcheck.log"
stamp checks
timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/test_mul.py tests/test_launch_plan.py \
  "tests/test_kernels.py::test_misaligned_rows_give_the_aligned_bits" -k "not cpu" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$OUT/tests.log"
stamp tests
for dt in bfloat16 float16; do
  timeout 45 python3 bench/tune_rows.py --op poly_norm_mul --dtype $dt --table-only --aligned-only --no-tail --H 2051 3003 4097 4103 5125 16385 16387 65539
done 2>&1 | tee "$OUT/tune_mul.log"
timeout 40 python3 bench/tune_rows.py --op poly_norm_mul --dtype float32 --table-only --aligned-only --no-tail --H 2051 4099 5126 8195 2>&1 | tee "$OUT/tune_mul_fp32.log"
stamp tune
