"""Where the Triton backend's host time goes (issue 14): microseconds per call, layer by layer.

Each row times one layer of the eager Triton path on a small CUDA tensor (the GPU work is a
few microseconds, so host time dominates), best of ``--repeats`` runs of ``--calls`` calls,
with a synchronize only at the end of each run:

- ``bare launch``: ``_poly_norm_fwd_kernel[grid](...)`` with precomputed arguments;
- ``_forward_impl``: checks, outputs, launch config, one launch;
- ``PolyNormTritonFunction.apply``: the eager autograd Function (no backward recorded);
- ``poly_norm(backend="triton")``: the public call;
- the same four for the backward, and a full forward+backward through autograd;
- ``cuda`` rows: the C++ backend's public call, for scale.

Then a cProfile of ``--profile-calls`` forward+backward steps, the 25 functions with the most
own time. Run on a GPU: ``python3 bench/triton_host.py``.
"""

import argparse
import cProfile
import pstats
import time

import torch
import triton

import polynorm
from polynorm import triton_kernels as tk


def per_call_us(fn, calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--M", type=int, default=2048)
    parser.add_argument("--H", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile-calls", type=int, default=300)
    args = parser.parse_args()
    M, H = args.M, args.H
    dev = torch.device("cuda")
    x = torch.randn(M, H, device=dev, dtype=torch.bfloat16)
    w = torch.full((3,), 1 / 3, device=dev)
    b = torch.zeros(1, device=dev)
    g = torch.randn_like(x)
    y, rstd = tk._forward_impl(x, w, b, 1e-6, tk._launch_directly)
    block_m, block_h, one_block, num_warps = tk._launch_config(H, x.dtype, "forward")
    grid = ((M + block_m - 1) // block_m,)

    def bare():
        tk._poly_norm_fwd_kernel[grid](
            x, H, y, rstd, w, 1, b, M, H, 1e-6, BLOCK_M=block_m, BLOCK_H=block_h, ONE_BLOCK=one_block, num_warps=num_warps
        )

    xr = x.detach().requires_grad_()
    wr = w.detach().requires_grad_()
    br = b.detach().requires_grad_()

    def full(backend):
        out = polynorm.poly_norm(xr, wr, br, 1e-6, backend=backend)
        torch.autograd.grad(out, (xr, wr, br), g)

    rows = [
        ("forward: bare launch", bare),
        ("forward: _forward_impl", lambda: tk._forward_impl(x, w, b, 1e-6, tk._launch_directly)),
        ("forward: PolyNormTritonFunction.apply", lambda: tk.PolyNormTritonFunction.apply(x, w, b, 1e-6, False)),
        ("forward: poly_norm(backend='triton')", lambda: polynorm.poly_norm(x, w, b, 1e-6, backend="triton")),
        ("forward: torch.ops.polynorm.forward_triton", lambda: torch.ops.polynorm.forward_triton(x, w, b, 1e-6)),
        ("backward: _backward_impl", lambda: tk._backward_impl(g, x, w, rstd, tk._launch_directly)),
        ("backward: torch.ops.polynorm.backward_triton", lambda: torch.ops.polynorm.backward_triton(g, x, w, rstd)),
        ("full: poly_norm(backend='triton') + autograd.grad", lambda: full("triton")),
        ("forward: poly_norm(backend='cuda')", lambda: polynorm.poly_norm(x, w, b, 1e-6, backend="cuda")),
        ("full: poly_norm(backend='cuda') + autograd.grad", lambda: full("cuda")),
        ("empty_like (one allocation)", lambda: torch.empty_like(x)),
    ]
    print(f"# Triton host time, M={M} H={H} bf16, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}; best of {args.repeats} x {args.calls} calls")
    print("| layer | us per call |\n|---|---|")
    for name, fn in rows:
        fn()
        print(f"| {name} | {per_call_us(fn, args.calls, args.repeats):.1f} |")

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.profile_calls):
        full("triton")
    torch.cuda.synchronize()
    prof.disable()
    print(f"\n# cProfile of {args.profile_calls} forward+backward steps (triton), by own time")
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
