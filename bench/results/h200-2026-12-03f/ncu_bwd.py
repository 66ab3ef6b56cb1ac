"""A short workload for ncu at one shape (twenty-third session): PolyNorm's backward and the fused
backward on bf16 randn(M, H), twice each, between cudaProfilerStart / Stop.

    ncu --profile-from-start off -k regex:bwd_row_kernel --metrics ... \\
        python3 bench/results/h200-2026-12-03f/ncu_bwd.py 13094 5125
"""
import sys

import torch

import polynorm  # noqa: F401


def main() -> None:
    M, H = int(sys.argv[1]), int(sys.argv[2])
    ops = torch.ops.polynorm
    x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
    g, mul = torch.randn_like(x), torch.randn_like(x)
    w = torch.tensor([0.3, -0.5, 0.8], device="cuda")
    b = torch.tensor([0.1], device="cuda")
    _, rstd = ops.forward(x, w, b, 1e-6)
    _, mrstd = ops.mul_forward(x, mul, w, b, 1e-6)
    run = [lambda: ops.backward(g, x, w, rstd), lambda: ops.mul_backward(g, x, mul, w, b, mrstd)]
    for op in run:  # warm: plans cached, allocations made
        op()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _ in range(2):
        for op in run:
            op()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
