#!/usr/bin/env python3
"""A short run of the same-phase row builds (odd H, bf16 and fp32; PolyNorm, the fused op, a
grouped launch) for compute-sanitizer's racecheck and memcheck: the shared-memory stage areas
(packs.cuh, stage_row / staged_pack) must show no hazard and no access out of bounds. Every
output is also checked against the float64 oracle (a few rounding floors) and against the same
rows realigned in the other build (_tune_rows(same_phase=False)) bitwise. Diagnostic only.
"""
import torch

import polynorm  # noqa: F401
from polynorm.reference import poly_norm as reference


def main() -> None:
    torch.manual_seed(0)
    w = torch.tensor([0.3, -0.4, 0.9], device="cuda")
    b = torch.tensor([0.1], device="cuda")
    bad = 0
    for dtype in (torch.bfloat16, torch.float32):
        for M, H in ((5, 5125), (3, 16385), (9, 4097), (33, 65), (17, 257), (6, 3001)):
            x = torch.randn(M, H, device="cuda", dtype=dtype)
            g = torch.randn(M, H, device="cuda", dtype=dtype)
            mul = torch.randn(M, H, device="cuda", dtype=dtype)
            outs = {}
            for same_phase in (True, False):
                torch.ops.polynorm._tune_rows(same_phase=same_phase)
                y, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
                dx, dw, db = torch.ops.polynorm.backward(g, x, w, rstd)
                o, r2 = torch.ops.polynorm.mul_forward(x, mul, w, b, 1e-6)
                mdx, dmul, _, _ = torch.ops.polynorm.mul_backward(g, x, mul, w, b, r2)
                outs[same_phase] = (y, dx, o, mdx, dmul)
            torch.ops.polynorm._tune_rows()
            ref = reference(x.double(), w.double(), b.double(), 1e-6)
            err = float(((outs[True][0].double() - ref).abs() / ref.abs().clamp_min(1)).max() / torch.finfo(dtype).eps)
            same = all(torch.equal(a, c) for a, c in zip(outs[True], outs[False]))
            ok = same and err < 4
            bad += not ok
            print(f"{dtype} {M}x{H}: y err {err:.2f} eps, same-phase bits equal the realigned build's: {same}")
    offsets = torch.tensor([2, 2, 7], device="cuda")
    x = torch.randn(9, 5125, device="cuda", dtype=torch.bfloat16)
    we = torch.randn(3, 3, device="cuda")
    be = torch.randn(3, device="cuda")
    y, rstd = torch.ops.polynorm.grouped_forward(x, we, be, offsets, 1e-6)
    torch.ops.polynorm.grouped_backward(torch.randn_like(x), x, we, offsets, rstd)
    torch.cuda.synchronize()
    print("bad cases:", bad)


if __name__ == "__main__":
    main()
