"""Forward then backward, three times, on bf16 ``randn(2^26 / H, H)``: a short workload for
``ncu`` to profile the row kernels at one H.

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --section Occupancy -k regex:row_kernel -c 2 python3 bench/profile_rows.py 5125

This is the script behind bench/results/h200-2026-11-29-v4/ncu_*.txt (run there as one.py).
A second argument sets the row kernels' tuning first (``torch.ops.polynorm._tune_rows``
keywords, or ``table``), e.g. ``python3 bench/profile_rows.py 65536 cta_threads:256,max_cluster:8``.
A third, ``mul``, profiles the fused PolyNorm x mul (``mul_forward``, ``mul_backward``) instead.
"""
import sys

import torch

import polynorm  # noqa: F401  (registers torch.ops.polynorm.*)


def main() -> None:
    H = int(sys.argv[1])
    fused = len(sys.argv) > 3 and sys.argv[3] == "mul"
    if len(sys.argv) > 2 and sys.argv[2] != "table":
        tuning = dict(item.split(":") for item in sys.argv[2].split(","))
        torch.ops.polynorm._tune_rows(**{k: v == "True" if v in ("True", "False") else int(v) for k, v in tuning.items()})
    M = 2**26 // H
    x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
    g = torch.randn_like(x)
    weight = torch.tensor([0.3, -0.4, 0.9], device="cuda")
    bias = torch.tensor([0.1], device="cuda")
    mul = torch.randn_like(x) if fused else None
    for _ in range(3):
        if fused:
            _y, rstd = torch.ops.polynorm.mul_forward(x, mul, weight, bias, 1e-6)
            torch.ops.polynorm.mul_backward(g, x, mul, weight, bias, rstd)
        else:
            _y, rstd = torch.ops.polynorm.forward(x, weight, bias, 1e-6)
            torch.ops.polynorm.backward(g, x, weight, rstd)
        x.copy_(g)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
