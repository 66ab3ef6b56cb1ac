#!/usr/bin/env python3
"""The staged row kernel (POLYNORM_STAGED_ROWS builds) on small shapes, for compute-sanitizer:
forward and mul_forward at every wide one-CTA geometry (H = 512 ... 32768 bf16, 256 ... 16384
fp32), M not a multiple of the rows a block, against the float64 oracle (the worst error over
the output dtype's rounding floor; fails past 4). Diagnostic only.
"""
import torch

import polynorm  # noqa: F401
from polynorm.reference import poly_norm as reference

EPS = 1e-6


def main() -> None:
    ops = torch.ops.polynorm
    worst = 0.0
    for dtype, hs in ((torch.bfloat16, (512, 1024, 4096, 16384, 32768)), (torch.float32, (256, 2048, 16384))):
        for H in hs:
            for M in (1, 37, 2500) + ((20000,) if H <= 1024 else ()):  # past the persistent grid's rows
                x = torch.randn(M, H, device="cuda", dtype=dtype)
                mul = torch.randn(M, H, device="cuda", dtype=dtype)
                w = torch.tensor([0.3, -0.4, 0.9], device="cuda")
                b = torch.tensor([0.1], device="cuda")
                ref = reference(x.double(), w.double(), b.double(), EPS)
                for name, out, want in (("forward", ops.forward(x, w, b, EPS)[0], ref),
                                        ("mul_forward", ops.mul_forward(x, mul, w, b, EPS)[0], ref * mul.double())):
                    floor = torch.finfo(dtype).eps / 2 * want.abs().clamp_min(1.0)
                    err = float(((out.double() - want).abs() / floor).max())
                    worst = max(worst, err)
                    print(f"{str(dtype)[6:]} M={M} H={H} {name}: {err:.2f}", flush=True)
    torch.cuda.synchronize()
    print(f"worst {worst:.2f}")
    assert worst <= 4.0, worst


if __name__ == "__main__":
    main()
