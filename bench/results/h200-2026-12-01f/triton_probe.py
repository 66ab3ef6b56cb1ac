#!/usr/bin/env python3
"""The Triton forward's launch configuration at short rows (issue 14, target 3: through autograd
the Triton forward at 2048 x 4096 ran at 3.07 of a copy against Liger's 1.94; kernels alone 2.29).
Times torch.ops.polynorm.forward_triton under (BLOCK_M, num_warps) overrides of
polynorm.triton_kernels._launch_config, kernel only, as medians of triton.testing.do_bench over a
copy of the same bytes timed in the same run; bf16. Diagnostic only.
"""
import torch
from triton.testing import do_bench

import polynorm  # noqa: F401
import polynorm.triton_kernels as tk

EPS = 1e-6


def bench(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def main() -> None:
    original = tk._launch_config
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; forward_triton / copy, bf16")
    for M, H in ((2048, 2048), (2048, 4096), (2048, 8192), (16384, 4096)):
        x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
        w = torch.tensor([0.3, -0.4, 0.9], device="cuda")
        b = torch.tensor([0.1], device="cuda")
        out = torch.empty_like(x)
        copy = bench(lambda: out.copy_(x))
        base = original(H, x.dtype, "forward")
        ref, _ = torch.ops.polynorm.forward_triton(x, w, b, EPS)
        cells = [f"table {base} {bench(lambda: torch.ops.polynorm.forward_triton(x, w, b, EPS)) / copy:.2f}"]
        for block_m in (1, 2):
            for warps in (4, 8, 16):
                if block_m * H // (32 * warps) > 64 or block_m * H // (32 * warps) < 4:
                    continue
                cfg = (block_m, base[1], base[2], warps)
                tk._launch_config = lambda H_, dt, d, cfg=cfg: cfg if d == "forward" else original(H_, dt, d)
                try:
                    y, _ = torch.ops.polynorm.forward_triton(x, w, b, EPS)
                    same = torch.equal(y, ref)
                    t = bench(lambda: torch.ops.polynorm.forward_triton(x, w, b, EPS))
                    cells.append(f"m{block_m}w{warps} {t / copy:.2f}{'' if same else '!'}")
                finally:
                    tk._launch_config = original
        print(f"M={M} H={H} copy {copy * 1e3:.1f} us: " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
