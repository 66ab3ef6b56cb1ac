#!/usr/bin/env python3
"""The backward's same-phase class sums (csrc/cuda/backward.cuh, class_sums) against the realigned
build, bitwise, for compute-sanitizer's racecheck and memcheck: odd-H rows and views one element
in, every row phase, rows of several segments and of clusters, rows of less than a warp (several
rows a warp), PolyNorm's and the fused op's backward, bf16 / fp16 / fp32 / fp64, more rows than
resident blocks (the class areas are written again row after row). `_tune_rows(same_phase=False)`
gives the realigned build, whose sums realign the packs first (finish_row) and add them in the
same class order. grad_x (and grad_mul), dW and dB must be equal bit for bit, and grad_x close to
the float64 oracle (its largest error over the largest |grad_x| of the first rows, in eps). `--racecheck`: three
cases with several rows a warp. Diagnostic only: tests/test_kernels.py and tests/test_parity.py are the tests.
"""
import sys

import torch

import polynorm  # noqa: F401
from polynorm.reference import poly_norm as reference


def main() -> None:
    racecheck = "--racecheck" in sys.argv  # fewer cases, each with rows enough for every warp to take several
    torch.manual_seed(0)
    w = torch.tensor([0.3, -0.4, 0.9], device="cuda")
    b = torch.tensor([0.1], device="cuda")
    tune = torch.ops.polynorm._tune_rows
    bad = 0
    cases = [(torch.bfloat16, 4097, 700, False), (torch.bfloat16, 5125, 600, False), (torch.bfloat16, 3000, 800, True),
             (torch.bfloat16, 16385, 300, False), (torch.bfloat16, 65537, 40, False), (torch.bfloat16, 33, 3000, False),
             (torch.bfloat16, 9, 5000, True), (torch.float16, 4097, 500, False), (torch.float32, 5125, 400, False),
             (torch.float32, 1024, 600, True), (torch.float64, 2049, 300, False)]
    if racecheck:  # 4097: 1056 rows a wave of 528 blocks of 2 rows; 9: rows of one lane, 32 a warp
        cases = [(torch.bfloat16, 4097, 3200, False), (torch.bfloat16, 16385, 800, False), (torch.bfloat16, 9, 20000, False)]
    for dtype, H, M, view in cases:
        base = torch.randn(M, H + 1, device="cuda", dtype=dtype)
        x = base[:, 1:] if view else base[:, :H].contiguous()
        g = torch.randn(M, H, device="cuda", dtype=dtype) if not view else torch.randn(M, H + 1, device="cuda", dtype=dtype)[:, 1:]
        mul = torch.randn(M, H, device="cuda", dtype=dtype) if not view else torch.randn(M, H + 1, device="cuda", dtype=dtype)[:, 1:]
        _, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
        _, rstd_m = torch.ops.polynorm.mul_forward(x, mul, w, b, 1e-6)
        outs = {}
        for same_phase in (True, False):
            tune(same_phase=same_phase)
            outs[same_phase] = (torch.ops.polynorm.backward(g, x, w, rstd),
                                torch.ops.polynorm.mul_backward(g, x, mul, w, b, rstd_m))
        tune()
        equal = all(torch.equal(a, c) for pa, pc in zip(outs[True], outs[False]) for a, c in zip(pa, pc))
        xd = x[:3].double().cpu().requires_grad_()
        reference(xd, w.double().cpu(), b.double().cpu(), 1e-6).backward(g[:3].double().cpu())
        dx = outs[True][0][0][:3].double().cpu()
        err = float((dx - xd.grad).abs().max() / xd.grad.abs().max() / torch.finfo(dtype).eps)  # over the row's largest
        plan = torch.ops.polynorm._launch_plan("backward", H, dtype)
        ok = equal and err < 8
        bad += not ok
        print(f"{dtype} {M}x{H} view={view} ({plan}): same-phase = realigned bitwise: {equal}; grad_x {err:.2f} eps")
    torch.cuda.synchronize()
    print(f"bad cases: {bad}")


if __name__ == "__main__":
    main()
