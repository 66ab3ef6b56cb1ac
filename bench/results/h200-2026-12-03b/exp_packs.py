"""Odd-H rows at other pack counts (nineteenth session, call 2; the experiment build of
`call2_experiment.patch`, whose environment switches never landed as such). bf16, M·H = 2^26, rows
of one CTA of at most 256 threads: PolyNorm's backward at 4 / 5 / 6 packs a thread (4 and 5: narrow
builds, 80 registers; the table: 7 or 8, 128 registers), the fused backward at 3 (the table: 4), the fused
forward at 4 / 5 / 6 (the table: 7 or 8). Kernel over a same-run floor (medians of
triton.testing.do_bench): PolyNorm's backward and the fused forward over an add (read two, write
one), the fused backward over an add plus a copy. `err`: the largest error of the variant's
outputs (grad_x; out; grad_x and grad_mul) on the first 64 rows against the float64 oracle, over
the bf16 rounding floor (half an ulp of max(|ref|, 1)).

    python3 bench/results/h200-2026-12-03b/exp_packs.py
"""

import os

import torch
from triton.testing import do_bench

import polynorm  # noqa: F401
from polynorm.reference import poly_norm as reference

EPS = 1e-6


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def err(got: torch.Tensor, ref: torch.Tensor) -> float:
    floor = torch.finfo(torch.bfloat16).eps / 2 * ref.abs().clamp_min(1.0)
    return float(((got[:64].double() - ref).abs() / floor).max())


def oracle(x, mul, g, w, b):
    """float64 out (= y * mul), grad_x and grad_mul on the first 64 rows."""
    xs = x[:64].double().requires_grad_()
    ms = mul[:64].double().requires_grad_()
    y = reference(xs, w.double(), b.double(), EPS, compute_dtype=torch.float64)
    out = y * ms
    gx, gm = torch.autograd.grad(out, (xs, ms), g[:64].double(), retain_graph=True)
    gx_plain = torch.autograd.grad(y, xs, g[:64].double())[0]
    return out.detach(), gx, gm, gx_plain


def variant(name: str, value: int) -> None:
    for key in ("POLYNORM_EXP_BWD_PACKS", "POLYNORM_EXP_MUL_BWD_PACKS", "POLYNORM_EXP_MUL_FWD_PACKS"):
        os.environ.pop(key, None)
    if value:
        os.environ[name] = str(value)


def main() -> None:
    w = torch.tensor([0.3, -0.5, 0.8], device="cuda")
    b = torch.tensor([0.1], device="cuda")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, M·H = 2^26")
    print(f"{'H':>6} {'op':>10} {'packs':>5} {'ratio':>6} {'err':>6}")
    for H in (3000, 4097, 5125, 3001, 6001):
        M = 2**26 // H
        x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
        mul = torch.randn_like(x)
        g = torch.randn_like(x)
        out = torch.empty_like(x)
        out2 = torch.empty_like(x)
        t_add = bench(lambda: torch.add(x, g, out=out))
        t_copy = bench(lambda: out2.copy_(mul))
        ref_out, ref_gx, ref_gm, ref_gx_plain = oracle(x, mul, g, w, b)
        _, rstd = torch.ops.polynorm.forward(x, w, b, EPS)
        _, mrstd = torch.ops.polynorm.mul_forward(x, mul, w, b, EPS)
        cases = [
            ("backward", "POLYNORM_EXP_BWD_PACKS", (0, 4, 5, 6)),
            ("mul_fwd", "POLYNORM_EXP_MUL_FWD_PACKS", (0, 4, 5, 6)),
            ("mul_bwd", "POLYNORM_EXP_MUL_BWD_PACKS", (0, 3)),
        ]
        for op, env, values in cases:
            for value in values:
                variant(env, value)
                kind = "mul_backward" if op == "mul_bwd" else "mul_forward" if op == "mul_fwd" else "backward"
                if not value:
                    print(f"# {H} {kind}: the table's plan {torch.ops.polynorm._launch_plan(kind, H, torch.bfloat16)}")
                if op == "backward":
                    fn = lambda: torch.ops.polynorm.backward(g, x, w, rstd)  # noqa: E731
                    gx = fn()[0]
                    e = err(gx, ref_gx_plain)
                    floor = t_add
                elif op == "mul_fwd":
                    fn = lambda: torch.ops.polynorm.mul_forward(x, mul, w, b, EPS)  # noqa: E731
                    e = err(fn()[0], ref_out)
                    floor = t_add
                else:
                    fn = lambda: torch.ops.polynorm.mul_backward(g, x, mul, w, b, mrstd)  # noqa: E731
                    gx, gm = fn()[:2]
                    e = max(err(gx, ref_gx), err(gm, ref_gm))
                    floor = t_add + t_copy
                t = bench(fn)
                print(f"{H:>6} {op:>10} {value or 'table':>5} {t / floor:>6.3f} {e:>6.2f}", flush=True)
        variant("", 0)
        del x, mul, g, out, out2, rstd, mrstd
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
