"""A short workload for ncu (twenty-fifth session): PolyNorm's backward and the fused backward on
bf16 rows of M x H, contiguous (`H`), x alone one element into its buffer (`Hx`), or x, mul and
grad_y so (`Hv`), twice each, between cudaProfilerStart / Stop.

    ncu --profile-from-start off -k regex:bwd_row_kernel --metrics ... \\
        python3 bench/results/h200-2026-12-03h/ncu_views.py 13094 5125x
"""
import sys

import torch

import polynorm  # noqa: F401


def rows(M: int, H: int, view: bool) -> torch.Tensor:
    if view:
        return torch.randn(M * H + 1, device="cuda", dtype=torch.bfloat16)[1:].view(M, H)
    return torch.randn(M, H, device="cuda", dtype=torch.bfloat16)


def main() -> None:
    M, shape = int(sys.argv[1]), sys.argv[2]
    mode = shape[-1] if shape[-1] in "vx" else ""
    H = int(shape.rstrip("vx"))
    ops = torch.ops.polynorm
    x, g, mul = rows(M, H, mode != ""), rows(M, H, mode == "v"), rows(M, H, mode == "v")
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
