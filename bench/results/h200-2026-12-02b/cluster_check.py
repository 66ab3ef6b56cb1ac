#!/usr/bin/env python3
"""A short run of the row kernels' cluster launches (rows of C > 1 CTAs that add their sums
through distributed shared memory) for compute-sanitizer's racecheck: PolyNorm forward and
backward at H = 65536 and 131072 (the table's clusters of 2-8), the odd 5125 on CTAs of 64
threads (clusters of 2 on the 7-pack builds, same-phase and realigned), the fused op at 32768,
and a grouped launch at 65536. Every output is checked against the float64 oracle (a few
rounding floors). Diagnostic only: the suite's tests/test_clusters.py is the test.

A copy of the twelfth session's script (h200-2026-12-02). Call 1 ran it at commit 3e70f04 with
``--tx`` (the mbarrier exchange, then a bench switch, ``_tune_rows(tx_exchange=True)``); since
then the mbarrier exchange is the only one, and a row of 262144 (the backward and the fused forward
on clusters of 16) is one more case.
"""
import torch

import polynorm  # noqa: F401
from polynorm.reference import poly_norm as reference


def err_eps(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float(((y.cpu().double() - ref).abs() / ref.abs().clamp_min(1)).max() / torch.finfo(y.dtype).eps)


def main() -> None:
    torch.manual_seed(0)
    w = torch.tensor([0.3, -0.4, 0.9], device="cuda")
    b = torch.tensor([0.1], device="cuda")
    bad = 0
    cases = [(3, 65536, 0, torch.bfloat16), (2, 131072, 0, torch.bfloat16), (5, 5125, 64, torch.bfloat16),
             (3, 32768, 0, torch.float32), (1, 262144, 0, torch.bfloat16)]
    for M, H, cta, dtype in cases:
        torch.ops.polynorm._tune_rows(cta_threads=cta)
        for view in (False, True):  # contiguous (same-phase at odd H), a view one element in (realigned)
            base = torch.randn(M, H + 1, device="cuda", dtype=dtype)
            x = base[:, 1:] if view else base[:, :H].contiguous()
            g = torch.randn(M, H, device="cuda", dtype=dtype)
            mul = torch.randn(M, H, device="cuda", dtype=dtype)
            y, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
            dx, dw, db = torch.ops.polynorm.backward(g, x, w, rstd)
            o, r2 = torch.ops.polynorm.mul_forward(x, mul, w, b, 1e-6)
            torch.ops.polynorm.mul_backward(g, x, mul, w, b, r2)
            # The oracle on the CPU: racecheck then reports only the GPU kernels under test (call 1
            # computed it on the GPU, and torch's own reduce_kernel filled the report).
            ref = reference(x.cpu().double(), w.cpu().double(), b.cpu().double(), 1e-6)
            e_y, e_o = err_eps(y, ref), err_eps(o, ref * mul.cpu().double())
            plan = torch.ops.polynorm._launch_plan("backward", H, dtype)
            ok = e_y < 4 and e_o < 4
            bad += not ok
            print(f"{dtype} {M}x{H} cta={cta} view={view} ({plan}): y {e_y:.2f} eps, mul {e_o:.2f} eps")
    torch.ops.polynorm._tune_rows()
    offsets = torch.tensor([1, 1, 4], device="cuda")
    x = torch.randn(4, 65536, device="cuda", dtype=torch.bfloat16)
    we = torch.randn(3, 3, device="cuda")
    be = torch.randn(3, device="cuda")
    y, rstd = torch.ops.polynorm.grouped_forward(x, we, be, offsets, 1e-6)
    torch.ops.polynorm.grouped_backward(torch.randn_like(x), x, we, offsets, rstd)
    torch.cuda.synchronize()
    print("bad cases:", bad)


if __name__ == "__main__":
    main()
