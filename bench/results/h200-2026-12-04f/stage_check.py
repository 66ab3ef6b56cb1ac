"""PolyNorm's forward staged a row ahead (_tune_rows(stage_rows=2); forward.cuh kAlignedStaged) against the
table's build: y and rstd bitwise equal (poisoned first), the plan says staged=1, and y within the float64
oracle's rounding floor. Rows of whole warps in 2- and 4-byte dtypes, M odd so that the persistent loop's last
round is partial. Thirty-first session, call 1 (bench/NOTES.md v34)."""
import torch
import polynorm  # noqa: F401
from polynorm.reference import poly_norm as reference

ops = torch.ops.polynorm
w = torch.tensor([0.3, -0.4, 0.9], device="cuda")
b = torch.tensor([0.1], device="cuda")
bad = 0
cases = [(torch.bfloat16, H) for H in (4096, 8192, 16384, 32768, 65536, 131072, 262144)]
cases += [(torch.float16, H) for H in (16384, 65536)] + [(torch.float32, H) for H in (4096, 16384, 32768, 65536)]
for dtype, H in cases:
    M = max(3, (2**23 // H) | 1)
    torch.manual_seed(H)
    x = torch.randn(M, H, device="cuda", dtype=dtype)
    outs = []
    for n in (-1, 2):
        ops._tune_rows(stage_rows=n)
        plan = ops._launch_plan("forward", H, dtype)
        y, rstd = ops.forward(x, w, b, 1e-6)
        torch.cuda.synchronize()
        outs.append((plan, y, rstd))
    ops._tune_rows()
    (p0, y0, r0), (p1, y1, r1) = outs
    ref = reference(x[:8].double(), w.double(), b.double(), 1e-6)
    floor = torch.finfo(dtype).eps / 2 * ref.abs().clamp_min(1.0)
    err = float(((y1[:8].double() - ref).abs() / floor).max())
    # Half-ulps of the output: 2-byte outputs round once (<= 1 plus fp32's share); fp32 outputs carry the fp32
    # sums' own error over H elements (the table's reads 3-5 in tune_rows' err column, call 1), bound at 16.
    bound = 16.0 if dtype == torch.float32 else 2.0
    ok = "staged=1" in p1 and "staged" not in p0 and torch.equal(y0, y1) and torch.equal(r0, r1) and err <= bound
    bad += not ok
    print(f"{str(dtype)[6:]:9} H={H:6} M={M:5} table[{p0}] staged[{p1}] equal={torch.equal(y0, y1) and torch.equal(r0, r1)} "
          f"err={err:.2f} {'ok' if ok else 'FAIL'}", flush=True)
print("FAILED" if bad else "all equal", bad)
