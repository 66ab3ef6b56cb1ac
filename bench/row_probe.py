"""Probes of the CUDA row kernels' mid-row standing (issue 13), kernel-only, on a CUDA device.

Three questions, each answered as time over a copy (forward) or an add (backward) of the same
bytes, timed in the same run (medians of ``triton.testing.do_bench``), bf16:

- ``rounds``: does the ratio depend on how many rows each resident CTA gets (the last round of a
  persistent grid leaves SMs part-empty)? Sweeps M around 2^26 / H at fixed H.
- ``grid``: the forward's and backward's grid (``_tune_rows(grid_waves=...)``): persistent (1),
  two waves (2), a block per row group (0).
- ``compile``: ``torch.compile`` of the eager formula (``polynorm.reference.poly_norm``), forward
  only, on the same shapes; with ``--code DIR`` it writes inductor's generated kernels there,
  so that its launch geometry can be read.

    python3 bench/row_probe.py rounds grid compile --H 2048 8192 16384 --code out/inductor
"""

import argparse
import functools
from pathlib import Path

import torch
from triton.testing import do_bench

import polynorm
from polynorm import reference


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def inputs(M: int, H: int):
    x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
    g = torch.randn_like(x)
    weight = torch.tensor([0.3, -0.4, 0.9], device="cuda")
    bias = torch.tensor([0.1], device="cuda")
    return x, g, weight, bias


def ratios(M: int, H: int) -> tuple[float, float, float, float]:
    """(copy us, forward / copy, add us, backward / add) at M x H."""
    x, g, weight, bias = inputs(M, H)
    out = torch.empty_like(x)
    t_copy = bench(lambda: out.copy_(x))
    t_add = bench(lambda: torch.add(x, g, out=out))
    t_f = bench(lambda: torch.ops.polynorm.forward(x, weight, bias, 1e-6))
    _, rstd = torch.ops.polynorm.forward(x, weight, bias, 1e-6)
    t_b = bench(lambda: torch.ops.polynorm.backward(g, x, weight, rstd))
    return t_copy * 1e3, t_f / t_copy, t_add * 1e3, t_b / t_add


def rounds(hs: list[int]) -> None:
    print("## rounds: M around 2^26 / H (forward / copy, backward / add)")
    print("| H | M | M / (2^26 / H) | copy us | fwd x | add us | bwd x |")
    print("|---|---|---|---|---|---|---|")
    for H in hs:
        M0 = 2**26 // H
        for f in (0.80, 0.85, 0.90, 0.93, 0.96, 1.0, 1.03, 1.06, 1.10, 1.15, 1.20):
            M = int(M0 * f)
            c, fx, a, bx = ratios(M, H)
            print(f"| {H} | {M} | {f:.2f} | {c:.1f} | {fx:.3f} | {a:.1f} | {bx:.3f} |", flush=True)


def grid(hs: list[int]) -> None:
    print("## grid: _tune_rows(grid_waves=w), M = 2^26 / H (-1: the table's)")
    print("| H | waves | fwd x | bwd x |")
    print("|---|---|---|---|")
    try:
        for H in hs:
            for w in (-1, 0, 1, 2, 4):
                torch.ops.polynorm._tune_rows(grid_waves=w)
                _, fx, _, bx = ratios(2**26 // H, H)
                print(f"| {H} | {w} | {fx:.3f} | {bx:.3f} |", flush=True)
    finally:
        torch.ops.polynorm._tune_rows()


def compiled(hs: list[int], code_dir: str | None) -> None:
    print("## compile: torch.compile(reference.poly_norm) forward / copy, and polynorm's forward / copy, same run")
    print("| H | M | copy us | compile x | polynorm x |")
    print("|---|---|---|---|---|")
    torch._functorch.config.donated_buffer = False
    for H in hs:
        M = 2**26 // H
        x, _, weight, bias = inputs(M, H)
        torch.compiler.reset()
        fn = torch.compile(functools.partial(reference.poly_norm, eps=1e-6), fullgraph=True, dynamic=False)
        with torch.no_grad():
            if code_dir:
                from torch._inductor.utils import run_and_get_code

                _, codes = run_and_get_code(fn, x, weight, bias)
                Path(code_dir).mkdir(parents=True, exist_ok=True)
                Path(code_dir, f"forward_{M}x{H}.py").write_text("\n\n# ----\n\n".join(codes))
            out = torch.empty_like(x)
            t_copy = bench(lambda: out.copy_(x))
            t_c = bench(lambda: fn(x, weight, bias))
            t_p = bench(lambda: torch.ops.polynorm.forward(x, weight, bias, 1e-6))
        print(f"| {H} | {M} | {t_copy * 1e3:.1f} | {t_c / t_copy:.3f} | {t_p / t_copy:.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("probes", nargs="+", choices=("rounds", "grid", "compile"))
    parser.add_argument("--H", type=int, nargs="+", default=[2048, 8192, 16384])
    parser.add_argument("--code", help="folder for inductor's generated code (compile)")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, polynorm from {polynorm.__file__}, bf16")
    for probe in args.probes:
        run = {
            "rounds": lambda: rounds(args.H),
            "grid": lambda: grid(args.H),
            "compile": lambda: compiled(args.H, args.code),
        }
        run[probe]()


if __name__ == "__main__":
    main()
