#!/usr/bin/env python3
"""A short workload for Nsight Compute: the CUDA forward then backward of one op, three times,
on ``randn(2^26 / H, H)`` (x and grad; mul too for the fused op).

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --section Occupancy -k regex:poly_norm -c 2 python3 bench/profile_rows.py 5125
    python3 bench/profile_rows.py 16384 --op poly_norm_mul --dtype float16 --layout view

``--layout view`` makes every input start one element past a 16-byte boundary, as
``bench/ops_timing.py``'s view rows do. At M * H = 2^26 each tensor (128 MiB in 2-byte dtypes)
is larger than any L2, so every pass reads from memory.
"""

import argparse

import torch

import polynorm  # noqa: F401  (registers torch.ops.polynorm.*)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("H", type=int)
    parser.add_argument("--op", choices=("poly_norm", "poly_norm_mul"), default="poly_norm")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--layout", choices=("contiguous", "view"), default="contiguous")
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()
    H, dtype = args.H, getattr(torch, args.dtype)
    M = 2**26 // H

    def tensor() -> torch.Tensor:
        if args.layout == "view":
            return torch.randn(M * H + 1, device="cuda", dtype=dtype)[1:].view(M, H)
        return torch.randn(M, H, device="cuda", dtype=dtype)

    x, g = tensor(), tensor()
    mul = tensor() if args.op == "poly_norm_mul" else None
    weight = torch.tensor([0.3, -0.4, 0.9], device="cuda")
    bias = torch.tensor([0.1], device="cuda")
    for _ in range(args.iters):
        if mul is not None:
            _out, rstd = torch.ops.polynorm.mul_forward(x, mul, weight, bias, 1e-6)
            torch.ops.polynorm.mul_backward(g, x, mul, weight, bias, rstd)
        else:
            _y, rstd = torch.ops.polynorm.forward(x, weight, bias, 1e-6)
            torch.ops.polynorm.backward(g, x, weight, rstd)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
