#!/usr/bin/env python3
"""The staged rows (POLYNORM_STAGED_ROWS builds) on small shapes, for compute-sanitizer memcheck:
backward and mul_backward (and their forwards) at every wide one-CTA geometry (H = 512 ... 16384
bf16, 256 ... 8192 fp32), with M past the persistent grid's rows. Prints each output's largest
magnitude (finite: the tool reports any bad access). Values are checked elsewhere: bits_probe.py
compares every bit with main's build. Diagnostic only. (Call 2 ran a forward-only version with
an oracle bound of 4 floors, too tight for fp32's mul_forward: 6.8; memcheck found 0 errors.)
"""
import torch

import polynorm  # noqa: F401

EPS = 1e-6


def main() -> None:
    ops = torch.ops.polynorm
    for dtype, hs in ((torch.bfloat16, (512, 1024, 4096, 8192, 16384)), (torch.float32, (256, 2048, 8192))):
        for H in hs:
            for M in (1, 37, 2500) + ((20000,) if H <= 1024 else ()):  # past the persistent grid's rows
                x = torch.randn(M, H, device="cuda", dtype=dtype)
                g = torch.randn(M, H, device="cuda", dtype=dtype)
                mul = torch.randn(M, H, device="cuda", dtype=dtype)
                w = torch.tensor([0.3, -0.4, 0.9], device="cuda")
                b = torch.tensor([0.1], device="cuda")
                _, rstd = ops.forward(x, w, b, EPS)
                dx, dw, db = ops.backward(g, x, w, rstd)
                _, mrstd = ops.mul_forward(x, mul, w, b, EPS)
                mdx, mdm, mdw, mdb = ops.mul_backward(g, x, mul, w, b, mrstd)
                big = max(float(t.abs().max()) for t in (dx, dw, db, mdx, mdm, mdw, mdb))
                assert torch.isfinite(torch.tensor(big)), (dtype, M, H)
                print(f"{str(dtype)[6:]} M={M} H={H}: largest |grad| {big:.3g}", flush=True)
    torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main()
