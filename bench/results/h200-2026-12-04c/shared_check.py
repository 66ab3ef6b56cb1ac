#!/usr/bin/env python3
"""A short run of PolyNorm's backward on the shared-half plan (csrc/launch_plan.h row_shared_half:
the register plan's row on half its CTAs, a second lane's packs a thread in shared memory by
cp.async) for compute-sanitizer's racecheck and memcheck: bf16 8192 forced onto 4 CTAs of 32 (2 of
the shared-half plan), 131072 and 262144 on the table's clusters (4 and 8 CTAs of 256), fp32 32768
(8 x 128 -> 4 x 128); several rows a cluster, so every thread's slots are overwritten by the next
row's copies. grad_x is compared bitwise with the register plan's (shared_half=0) and dW with the
oracle on the CPU. Diagnostic only: tests/test_clusters.py is the test.
"""
import torch

import polynorm  # noqa: F401
from polynorm.reference import poly_norm as reference


def main() -> None:
    torch.manual_seed(0)
    w = torch.tensor([0.3, -0.4, 0.9], device="cuda")
    b = torch.tensor([0.1], device="cuda")
    tune = torch.ops.polynorm._tune_rows
    bad = 0
    for M, H, cta, dtype in [(40, 8192, 32, torch.bfloat16), (6, 131072, 0, torch.bfloat16),
                             (5, 262144, 0, torch.bfloat16), (9, 32768, 0, torch.float32)]:
        x = torch.randn(M, H, device="cuda", dtype=dtype)
        g = torch.randn(M, H, device="cuda", dtype=dtype)
        tune(cta_threads=cta, max_cluster=16 if cta else 0, shared_half=0)
        y, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
        dx0, _, _ = torch.ops.polynorm.backward(g, x, w, rstd)
        tune(cta_threads=cta, max_cluster=16 if cta else 0, shared_half=1)
        plan = torch.ops.polynorm._launch_plan("backward", H, dtype)
        dx, dw, db = torch.ops.polynorm.backward(g, x, w, rstd)
        # dW, dB on the CPU (racecheck then reports only the kernels under test).
        xd, gd = x.cpu().double().requires_grad_(), g.cpu().double()
        wd, bd = w.cpu().double().requires_grad_(), b.cpu().double().requires_grad_()
        reference(xd, wd, bd, 1e-6).backward(gd)
        e_w = float(((dw.cpu().double() - wd.grad).abs() / wd.grad.abs().clamp_min(1)).max())
        same = torch.equal(dx, dx0)
        bad += not same or e_w > 1e-4
        print(f"{dtype} {M}x{H} ({plan}): grad_x the register plan's bits: {same}; dW rel err {e_w:.2e}")
    tune()
    torch.cuda.synchronize()
    print("bad cases:", bad)


if __name__ == "__main__":
    main()
