"""Every CUDA op of one build at chosen row lengths, kernel-only, with a bit signature per row: run
once per build (each build a copy of the tree with a patch, found through PYTHONPATH), the lines
of two builds compare their speed and, through `sig`, whether they give the same bits (issues 13
and 15; bench/NOTES.md v25-v26). Generalises the per-session `variants.py` scripts of
bench/results/h200-2026-12-03e and -03f.

Each shape is M * H = --elements (2^26 by default) bf16 elements; `H` alone is a contiguous
tensor (odd H: same-phase rows), `Hv` a view that starts one element into its buffer (x, mul and
grad_y: every row 2 bytes past a 16-byte boundary while the outputs start aligned: the realigned
builds), `Hx` such a view of x alone (mul and grad_y contiguous: a view's input and the gradient
autograd gives it). The copy and add are of the same tensors (views included).

Columns: the floors in microseconds (copy; add: of the tensors timed), then PolyNorm's forward over the copy (fwd), the
fused forward over the add (mfwd), PolyNorm's backward over the add (bwd) and the fused backward
over add + copy (mbwd): medians of triton.testing.do_bench. `err`: the fused forward's largest
error on the first 64 rows against the float64 oracle, in half-ulps (bench/tune_rows.py); `sig`:
every output's int16 words summed mod 10^6 (y, out, grad_x, grad_mul, the parameter gradients),
equal across builds that give the same bits; `acopy`, `aadd`: the floors of aligned tensors of the
same shape (a view's own copy and add are slower), in microseconds.

    PYTHONPATH=<build> python3 bench/build_compare.py <label> 4096 5125 16385v 5125x [--elements N]
"""

import argparse
import pathlib
import sys

import torch
from triton.testing import do_bench

import polynorm  # noqa: F401  (registers torch.ops.polynorm.*)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from tune_rows import worst_error  # noqa: E402


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=40, return_mode="median")


def signature(tensors) -> int:
    return sum(int(t.contiguous().view(torch.int16).long().sum()) for t in tensors) % 10**6


def rows(M: int, H: int, view: bool) -> torch.Tensor:
    if view:
        return torch.randn(M * H + 1, device="cuda", dtype=torch.bfloat16)[1:].view(M, H)
    return torch.randn(M, H, device="cuda", dtype=torch.bfloat16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("label")
    parser.add_argument("shapes", nargs="+", help="H, or Hv for a view one element in")
    parser.add_argument("--elements", type=int, default=2**26)
    args = parser.parse_args()
    ops = torch.ops.polynorm
    w = torch.tensor([0.3, -0.5, 0.8], device="cuda")
    b = torch.tensor([0.1], device="cuda")
    print(f"# {args.label}: {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, M*H = {args.elements}")
    print(f"{'M':>6} {'H':>6} {'copy':>6} {'add':>6} {'fwd':>6} {'mfwd':>6} {'bwd':>6} {'mbwd':>6} {'err':>5} {'sig':>7}"
          f" {'acopy':>6} {'aadd':>6}")
    torch.manual_seed(0)
    for shape in args.shapes:
        view = shape[-1] if shape[-1] in "vx" else ""
        H = int(shape.rstrip("vx"))
        M = args.elements // H
        x, mul, g = rows(M, H, view != ""), rows(M, H, view == "v"), rows(M, H, view == "v")
        out, out2 = torch.empty_like(x), torch.empty_like(x)
        copy = bench(lambda: out.copy_(x))
        add = bench(lambda: torch.add(x, g, out=out2))
        xa, ga = rows(M, H, False), rows(M, H, False)  # the aligned floors of the same bytes
        acopy = bench(lambda: out.copy_(xa))
        aadd = bench(lambda: torch.add(xa, ga, out=out2))
        y, rstd = ops.forward(x, w, b, 1e-6)
        mout, mrstd = ops.mul_forward(x, mul, w, b, 1e-6)
        fwd = bench(lambda: ops.forward(x, w, b, 1e-6))
        mfwd = bench(lambda: ops.mul_forward(x, mul, w, b, 1e-6))
        bwd = bench(lambda: ops.backward(g, x, w, rstd))
        mbwd = bench(lambda: ops.mul_backward(g, x, mul, w, b, mrstd))
        err = worst_error(mout, x, w, b, mul)
        grads = (*ops.backward(g, x, w, rstd), *ops.mul_backward(g, x, mul, w, b, mrstd))
        sig = signature([y, mout] + [t.float().view(torch.int16) if t.dtype != torch.bfloat16 else t for t in grads])
        print(f"{M:>6} {shape:>6} {copy * 1e3:6.1f} {add * 1e3:6.1f} {fwd / copy:6.3f} {mfwd / add:6.3f} "
              f"{bwd / add:6.3f} {mbwd / (add + copy):6.3f} {err:5.2f} {sig:>7} {acopy * 1e3:6.1f} {aadd * 1e3:6.1f}", flush=True)


if __name__ == "__main__":
    main()
