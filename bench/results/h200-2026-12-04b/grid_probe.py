"""The grid each row launch of clusters takes under each cluster scheduling policy preference
(twenty-seventh session): ``_tune_rows(cluster_policy=p)`` for p = 0 (the default), 1 (spread),
2 (load balancing), one call of each op at bf16 M·H = 2^26, the kernel's grid and block read
from a torch.profiler trace. Prints: op, H, policy, grid (blocks), block, clusters (grid over the
row's CTAs, from the launch plan), rounds of rows (M over the clusters).

    python3 bench/results/h200-2026-12-04b/grid_probe.py
"""
import json
import os
import re
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

import polynorm  # noqa: F401

CASES = [("forward", 65536), ("forward", 131072), ("forward", 262144), ("backward", 16384), ("backward", 32768),
         ("backward", 65536), ("backward", 131072), ("backward", 262144), ("mul_forward", 32768),
         ("mul_forward", 65536), ("mul_forward", 131072), ("mul_backward", 16384), ("mul_backward", 32768),
         ("mul_backward", 65536), ("mul_backward", 131072)]


def main() -> None:
    ops = torch.ops.polynorm
    w = torch.tensor([0.3, -0.5, 0.8], device="cuda")
    b = torch.tensor([0.1], device="cuda")
    print("| op | H | M | policy | grid | block | CTAs a row | clusters | rounds |")
    print("|---|---|---|---|---|---|---|---|---|")
    try:
        for op, H in CASES:
            M = 2**26 // H
            x, g, mul = (torch.randn(M, H, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            _, rstd = ops.forward(x, w, b, 1e-6)
            _, mrstd = ops.mul_forward(x, mul, w, b, 1e-6)
            run = {
                "forward": lambda: ops.forward(x, w, b, 1e-6),
                "backward": lambda: ops.backward(g, x, w, rstd),
                "mul_forward": lambda: ops.mul_forward(x, mul, w, b, 1e-6),
                "mul_backward": lambda: ops.mul_backward(g, x, mul, w, b, mrstd),
            }[op]
            C = int(re.search(r"cluster=(\d+)", ops._launch_plan(op, H, torch.bfloat16)).group(1))
            for policy in (0, 1, 2):
                ops._tune_rows(cluster_policy=policy)
                run()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    run()
                    torch.cuda.synchronize()
                with tempfile.TemporaryDirectory() as d:
                    path = os.path.join(d, "t.json")
                    prof.export_chrome_trace(path)
                    events = json.load(open(path))["traceEvents"]
                k = [e for e in events if e.get("cat") == "kernel" and "row_kernel" in e.get("name", "")]
                grid = k[0]["args"]["grid"][0] if k else 0
                block = k[0]["args"]["block"][0] if k else 0
                clusters = grid // C if C else 0
                rounds = M / clusters if clusters else float("nan")
                print(f"| {op} | {H} | {M} | {policy} | {grid} | {block} | {C} | {clusters} | {rounds:.2f} |")
    finally:
        ops._tune_rows()


if __name__ == "__main__":
    main()
