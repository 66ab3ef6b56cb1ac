"""A short workload for ncu (twenty-seventh session): one op of PolyNorm or the fused PolyNorm x
mul on bf16 rows of M x H, contiguous (`H`) or with every input one element into its buffer
(`Hv`), run twice between cudaProfilerStart / Stop after a warm call.

    ncu --profile-from-start off -k regex:row_kernel -c 1 --section ... \\
        python3 bench/results/h200-2026-12-04b/ncu_case.py 256 262144 backward
"""
import sys

import torch

import polynorm  # noqa: F401


def rows(M: int, H: int, view: bool) -> torch.Tensor:
    if view:
        return torch.randn(M * H + 1, device="cuda", dtype=torch.bfloat16)[1:].view(M, H)
    return torch.randn(M, H, device="cuda", dtype=torch.bfloat16)


def main() -> None:
    M, shape, op = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    view = shape.endswith("v")
    H = int(shape.rstrip("v"))
    ops = torch.ops.polynorm
    x, g, mul = rows(M, H, view), rows(M, H, view), rows(M, H, view)
    w = torch.tensor([0.3, -0.5, 0.8], device="cuda")
    b = torch.tensor([0.1], device="cuda")
    _, rstd = ops.forward(x, w, b, 1e-6)
    _, mrstd = ops.mul_forward(x, mul, w, b, 1e-6)
    run = {
        "forward": lambda: ops.forward(x, w, b, 1e-6),
        "backward": lambda: ops.backward(g, x, w, rstd),
        "mul_forward": lambda: ops.mul_forward(x, mul, w, b, 1e-6),
        "mul_backward": lambda: ops.mul_backward(g, x, mul, w, b, mrstd),
    }[op]
    run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
