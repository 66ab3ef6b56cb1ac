"""A short workload for ncu at one shape (twentieth session, call 1): copy, add, PolyNorm's
forward, the fused forward and torch's rms_norm on bf16 randn(M, H), twice each, between
cudaProfilerStart / Stop (so `ncu --profile-from-start off` sees only these kernels).

    ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum,... \\
        python3 bench/results/h200-2026-12-03c/ncu_small.py 2048 1024
"""
import sys

import torch
import torch.nn.functional as F

import polynorm  # noqa: F401


def main() -> None:
    M, H = int(sys.argv[1]), int(sys.argv[2])
    x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
    g, mul = torch.randn_like(x), torch.randn_like(x)
    out = torch.empty_like(x)
    w = torch.tensor([0.3, -0.5, 0.8], device="cuda")
    b = torch.tensor([0.1], device="cuda")
    rw = torch.randn(H, device="cuda", dtype=torch.bfloat16)
    ops = [
        lambda: out.copy_(x),
        lambda: torch.add(x, g, out=out),
        lambda: torch.ops.polynorm.forward(x, w, b, 1e-6),
        lambda: torch.ops.polynorm.mul_forward(x, mul, w, b, 1e-6),
        lambda: F.rms_norm(x, (H,), rw, 1e-6),
    ]
    for op in ops:  # warm: plans cached, allocations made
        op()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _ in range(2):
        for op in ops:
            op()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
