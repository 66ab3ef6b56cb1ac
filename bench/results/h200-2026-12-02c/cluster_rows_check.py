#!/usr/bin/env python3
"""Cluster rows that walk several rows each, for compute-sanitizer's racecheck: more rows than the
device holds clusters, so every CTA's mbarriers turn over their phases and every slot parity is
written again two rows later (the case cluster_check.py of h200-2026-12-02b never reached: its
rows were fewer than the resident clusters). PolyNorm forward at 65536 and backward at 32768
(clusters of 2 CTAs of 256), the backward at 16384 on CTAs of 128 (clusters of 2, four CTAs an
SM), the fused backward at 16384 (clusters of 2), an odd 16385 view (realigned) on CTAs of 128,
and a grouped launch. Every output is checked against the float64 oracle on a few rows, and the
backward's grad_x of the first rows against the same rows run alone (a batch of 4 rows: fewer
rows than clusters), bitwise. Diagnostic only: tests/test_clusters.py is the test.
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
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bad = 0
    # (M, H, cta_threads, view): M well past the resident clusters (about sms at 2 CTAs of 256 an SM
    # and clusters of 2; 2 * sms at 4 CTAs of 128).
    cases = [(3 * sms, 65536, 0, False), (3 * sms, 32768, 0, False), (5 * sms, 16384, 128, False),
             (3 * sms, 16385, 128, True)]
    for M, H, cta, view in cases:
        torch.ops.polynorm._tune_rows(cta_threads=cta)
        base = torch.randn(M, H + 1, device="cuda", dtype=torch.bfloat16)
        x = base[:, 1:] if view else base[:, :H].contiguous()
        g = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
        mul = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
        y, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
        dx, dw, db = torch.ops.polynorm.backward(g, x, w, rstd)
        o, r2 = torch.ops.polynorm.mul_forward(x, mul, w, b, 1e-6)
        torch.ops.polynorm.mul_backward(g, x, mul, w, b, r2)
        dx4, _, _ = torch.ops.polynorm.backward(g[:4], x[:4], w, rstd[:4])
        same = torch.equal(dx4, dx[:4])
        rows = slice(0, 4)
        ref = reference(x[rows].cpu().double(), w.cpu().double(), b.cpu().double(), 1e-6)
        e_y, e_o = err_eps(y[rows], ref), err_eps(o[rows], ref * mul[rows].cpu().double())
        last = reference(x[-2:].cpu().double(), w.cpu().double(), b.cpu().double(), 1e-6)
        e_last = err_eps(y[-2:], last)
        plan = torch.ops.polynorm._launch_plan("backward", H, torch.bfloat16)
        ok = e_y < 4 and e_o < 4 and e_last < 4 and same
        bad += not ok
        print(f"{M}x{H} cta={cta} view={view} (table's backward plan: {plan}): y {e_y:.2f} / last rows "
              f"{e_last:.2f} eps, mul {e_o:.2f} eps, grad_x of 4 rows alone bitwise: {same}")
    torch.ops.polynorm._tune_rows()
    offsets = torch.tensor([1, 100, 3 * sms], device="cuda")
    x = torch.randn(3 * sms, 65536, device="cuda", dtype=torch.bfloat16)
    we = torch.randn(3, 3, device="cuda")
    be = torch.randn(3, device="cuda")
    y, rstd = torch.ops.polynorm.grouped_forward(x, we, be, offsets, 1e-6)
    torch.ops.polynorm.grouped_backward(torch.randn_like(x), x, we, offsets, rstd)
    torch.cuda.synchronize()
    print("bad cases:", bad)


if __name__ == "__main__":
    main()
