#!/usr/bin/env python3
"""Digests of every output bit of the CUDA ops (y, rstd; grad_x, dW, dB; the fused op's too) at
fixed inputs, one line a shape, so that two builds' runs can be diffed (bench-only flags such
as POLYNORM_ROLL_PREFETCH must leave every bit as main's). Diagnostic only.

    PYTHONPATH=<tree> python3 bits_probe.py > bits_<tree>.txt
"""
import hashlib

import torch

import polynorm  # noqa: F401  (registers torch.ops.polynorm.*)

EPS = 1e-6


def digest(*tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    ops = torch.ops.polynorm
    shapes = [(m, h) for h in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536) for m in (2**26 // h, 3000 // (h // 512) + 1)]
    for dtype in (torch.bfloat16, torch.float32):
        for M, H in shapes:
            g = torch.Generator(device="cuda").manual_seed(M * 131 + H)
            x = torch.randn(M, H, device="cuda", dtype=dtype, generator=g)
            gy = torch.randn(M, H, device="cuda", dtype=dtype, generator=g)
            mul = torch.randn(M, H, device="cuda", dtype=dtype, generator=g)
            w = torch.tensor([0.3, -0.4, 0.9], device="cuda")
            b = torch.tensor([0.1], device="cuda")
            y, rstd = ops.forward(x, w, b, EPS)
            dx, dw, db = ops.backward(gy, x, w, rstd)
            my, mrstd = ops.mul_forward(x, mul, w, b, EPS)
            mdx, mdm, mdw, mdb = ops.mul_backward(gy, x, mul, w, b, mrstd)
            torch.cuda.synchronize()
            print(f"{str(dtype)[6:]:9s} M={M:6d} H={H:6d} fwd {digest(y, rstd)} bwd {digest(dx)} dWdB {digest(dw, db)} "
                  f"mul_fwd {digest(my, mrstd)} mul_bwd {digest(mdx, mdm)} mul_dWdB {digest(mdw, mdb)}", flush=True)


if __name__ == "__main__":
    main()
