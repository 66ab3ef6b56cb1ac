"""Each CUDA kernel family on each row length, side by side, kernel-only, on a CUDA device.

Issue 13 asks to keep only the code that serves some shape best, and to measure before
deleting. ``torch.ops.polynorm._force_kernel(kind)`` makes every launch take the row or
tiled kernels where they can serve the row (``csrc/launch_plan.h``); this script times
``torch.ops.polynorm.forward``/``backward`` under each, at M·H = 2^26 (bf16 by default), as
ratios to a same-size copy (forward) and add (backward) timed in the same run: medians of
``triton.testing.do_bench``. ``auto`` is the table's own choice; a family that cannot serve
a row prints ``-``. The plan each launch took is printed too.

    python3 bench/variants_timing.py [--dtype bfloat16] [--H 512 4096 65536 ...]
"""

import argparse

import torch
from triton.testing import do_bench

import polynorm  # noqa: F401  (registers torch.ops.polynorm.*)

KINDS = ("auto", "row", "tiled")
DEFAULT_H = (512, 2048, 8192, 16384, 32768, 65536, 131072, 262144, 3000, 5125, 16385, 65537)


def bench(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32", "float64"])
    parser.add_argument("--H", type=int, nargs="*", default=list(DEFAULT_H))
    parser.add_argument("--elements", type=int, default=2**26, help="M·H of each shape")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    weight = torch.tensor([0.3, -0.4, 0.9], device="cuda")
    bias = torch.tensor([0.1], device="cuda")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}, M*H = {args.elements}; "
          "forward / copy and backward / add, same run, medians of do_bench")
    print("| M | H | copy us | add us | " + " | ".join(f"fwd {k}" for k in KINDS) + " | "
          + " | ".join(f"bwd {k}" for k in KINDS) + " | plans (fwd; bwd) |")
    print("|" + "---|" * (4 + 2 * len(KINDS) + 1))
    for H in args.H:
        M = max(1, args.elements // H)
        x = torch.randn(M, H, device="cuda", dtype=dtype)
        g = torch.randn_like(x)
        out = torch.empty_like(x)
        t_copy = bench(lambda: out.copy_(x))
        t_add = bench(lambda: torch.add(x, g, out=out))
        fwd, bwd, plans = [], [], []
        for kind in KINDS:
            torch.ops.polynorm._force_kernel(kind)
            pf = torch.ops.polynorm._launch_plan("forward", H, dtype)
            pb = torch.ops.polynorm._launch_plan("backward", H, dtype)
            served_f = kind == "auto" or pf.startswith(kind)
            served_b = kind == "auto" or pb.startswith(kind)
            _, rstd = torch.ops.polynorm.forward(x, weight, bias, 1e-6)
            fwd.append(f"{bench(lambda: torch.ops.polynorm.forward(x, weight, bias, 1e-6)) / t_copy:.2f}" if served_f else "-")
            bwd.append(f"{bench(lambda: torch.ops.polynorm.backward(g, x, weight, rstd)) / t_add:.2f}" if served_b else "-")
            if kind == "auto":
                plans.append(f"{pf}; {pb}")
        torch.ops.polynorm._force_kernel("auto")
        print(f"| {M} | {H} | {t_copy * 1e3:.1f} | {t_add * 1e3:.1f} | " + " | ".join(fwd) + " | " + " | ".join(bwd)
              + f" | {plans[0]} |", flush=True)


if __name__ == "__main__":
    main()
