#!/usr/bin/env python3
"""ncu input: PolyNorm's row kernels at M x H (bf16) under two grids each, for Nsight Compute
(tenth session, call 5; bench/NOTES.md v12's open question: the forward on a persistent grid is
7-10% slower than on a block per R rows). One forward for rstd, then warm-ups, then the profiled
launches, in this order: forward on the table's grid (a block per R rows), forward persistent
(_tune_rows(grid_waves=1)), backward on the table's grid (persistent), backward on a block per
R rows (_tune_rows(grid_waves=0)). Profile with --launch-skip 5 --launch-count 4.

    python3 grid_profile.py [M H]
"""
import sys

import torch

import polynorm  # noqa: F401

M, H = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (16384, 4096)
x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
g = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
w = torch.tensor([0.3, -0.4, 0.9], device="cuda")
b = torch.tensor([0.1], device="cuda")
ops, tune = torch.ops.polynorm, torch.ops.polynorm._tune_rows
_, rstd = ops.forward(x, w, b, 1e-6)
for _ in range(2):  # warm-ups, then the profiled launches
    tune()
    ops.forward(x, w, b, 1e-6)
    tune(grid_waves=1)
    ops.forward(x, w, b, 1e-6)
    tune()
    ops.backward(g, x, w, rstd)
    tune(grid_waves=0)
    ops.backward(g, x, w, rstd)
tune()
torch.cuda.synchronize()
print("done")
