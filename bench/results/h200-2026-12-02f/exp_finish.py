"""Seventeenth session, call 1 (bench/NOTES.md v19): where the one-CTA backward's time goes.

The row backward's grid (persistent, ``b``; a block per R rows, ``bw0``) against how its dW / dB
partials are finished, a bench-only mode in bits 24-26 of ``_tune_rows(stagger=)`` (the EXPERIMENT
build of this call): m0 the table's (every block fences, draws a ticket, the last sums), m1 the
partials only (dW / dB not summed: a bound), m2 fence and ticket but no sum, m3 the ticket without
the fence, m4 the partials summed by a kernel of their own after the row kernel, m5 that kernel as
a programmatic dependent launch. Bit 20: the start staggered in eighths rather than quarters.
Ratios over an add of the same bytes in the same run (medians of do_bench), bf16, M·H = 2^26.
Every variant's grad_x equals the table's bitwise (else err inf); m0 / m4 / m5's dW, dB within a few
fp32 roundings of the table's (err: the largest relative difference over fp32 eps).

    python3 bench/results/h200-2026-12-02f/exp_finish.py [--op poly_norm_mul] [--H ...]
"""
import argparse

import torch
from triton.testing import do_bench

import polynorm  # noqa: F401

E8 = 1 << 20


def mode(m: int, cycles: int = 1500) -> int:
    return cycles | (m << 24)


VARIANTS = {
    "b": (-1, -1), "b-s0": (-1, 0), "b-e8s750": (-1, 750 | E8), "b-e8s1500": (-1, 1500 | E8),
    "b-m1": (-1, mode(1)), "b-m2": (-1, mode(2)), "b-m3": (-1, mode(3)), "b-m4": (-1, mode(4)), "b-m5": (-1, mode(5)),
    "bw0": (0, -1), "bw0-m1": (0, 1 << 24), "bw0-m2": (0, 2 << 24), "bw0-m3": (0, 3 << 24), "bw0-m4": (0, 4 << 24),
    "bw0-m5": (0, 5 << 24), "bw2-m5": (2, mode(5)),
}
SUMMED = {"b", "b-s0", "b-e8s750", "b-e8s1500", "b-m4", "b-m5", "bw0", "bw0-m4", "bw0-m5", "bw2-m5"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--op", default="poly_norm", choices=["poly_norm", "poly_norm_mul"])
    parser.add_argument("--H", type=int, nargs="*", default=[512, 1024, 2048, 4096, 8192, 16384])
    args = parser.parse_args()
    fused = args.op == "poly_norm_mul"
    tune = torch.ops.polynorm._tune_rows
    torch.manual_seed(0)
    weight = torch.tensor([0.3, -0.4, 0.9], device="cuda")
    bias = torch.tensor([0.1], device="cuda")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.op}, bf16, M*H = 2^26; backward over "
          f"{'an add + a copy' if fused else 'an add'} of the same bytes")
    print("| H | floor us | " + " | ".join(VARIANTS) + " | err |")
    print("|" + "---|" * (3 + len(VARIANTS)))
    try:
        for H in args.H:
            M = 2**26 // H
            x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
            g = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
            mul = torch.randn(M, H, device="cuda", dtype=torch.bfloat16) if fused else None
            out = torch.empty_like(x)
            floor = do_bench(lambda: torch.add(x, g, out=out), warmup=10, rep=60, return_mode="median")
            if fused:
                floor += do_bench(lambda: out.copy_(x), warmup=10, rep=60, return_mode="median")
                _, rstd = torch.ops.polynorm.mul_forward(x, mul, weight, bias, 1e-6)
                backward = lambda: torch.ops.polynorm.mul_backward(g, x, mul, weight, bias, rstd)  # noqa: E731
            else:
                _, rstd = torch.ops.polynorm.forward(x, weight, bias, 1e-6)
                backward = lambda: torch.ops.polynorm.backward(g, x, weight, rstd)  # noqa: E731
            ref, cells, err = None, [], 0.0
            for name, (waves, stagger) in VARIANTS.items():
                tune(grid_waves=waves, stagger=stagger)
                grads = backward()
                if ref is None:
                    ref = grads
                elif not torch.equal(grads[0], ref[0]):
                    err = float("inf")
                elif name in SUMMED:
                    for got, exp in zip(grads[-2:], ref[-2:]):
                        rel = float((got - exp).abs().max() / exp.abs().max().clamp_min(1e-30))
                        err = max(err, rel / torch.finfo(exp.dtype).eps)
                cells.append(f"{do_bench(backward, warmup=10, rep=60, return_mode='median') / floor:.3f}")
                tune()
            print(f"| {H} | {floor * 1e3:.1f} | " + " | ".join(cells) + f" | {err:.2f} |", flush=True)
    finally:
        tune()


if __name__ == "__main__":
    main()
