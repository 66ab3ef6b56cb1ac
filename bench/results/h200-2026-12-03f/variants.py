"""Every CUDA op of one build at the odd-H shapes, kernel-only (twenty-third session; bench/NOTES.md
v25): the build is whichever `polynorm` PYTHONPATH finds, so one script times the builds of this
directory's patches (N, A, AL, AR), one process each. A copy of ../h200-2026-12-03e/variants.py
with other shapes: M * H = 2^26 at H = 4096 and 16384 (aligned, controls) and the odd 3000, 4097,
5125, 16385, 65537 (same-phase rows). A's patch fixes W = 32 in row_lane, which is wrong for rows
of fewer than 32 lanes: every shape here has 32 or more.

Columns: the floors in microseconds (copy; add), then PolyNorm's forward over the copy (fwd), the
fused forward over the add (mfwd), PolyNorm's backward over the add (bwd) and the fused backward
over add + copy (mbwd): medians of triton.testing.do_bench. `err`: the fused forward's largest
error on the first 64 rows against the float64 oracle, in half-ulps (bench/tune_rows.py); `sig`:
every output's int16 words summed mod 10^6 (y, out, grad_x, grad_mul, the parameter gradients),
equal across builds that give the same bits.

    PYTHONPATH=<build> python3 bench/results/h200-2026-12-03f/variants.py <label> [--more]

`--more` adds H = 1001 (rows of 16 lanes: the builds without kWholeWarps), 2001, and views that
start one element into a buffer at H = 4096 and 16384 (marked `v`: realigned rows).
"""

import pathlib
import sys

import torch
from triton.testing import do_bench

import polynorm  # noqa: F401

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # bench/
from tune_rows import worst_error  # noqa: E402


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=40, return_mode="median")


def signature(tensors) -> int:
    return sum(int(t.contiguous().view(torch.int16).long().sum()) for t in tensors) % 10**6


def main() -> None:
    label = sys.argv[1]
    ops = torch.ops.polynorm
    w = torch.tensor([0.3, -0.5, 0.8], device="cuda")
    b = torch.tensor([0.1], device="cuda")
    shapes = [(2**26 // H, H, False) for H in (4096, 16384, 3000, 4097, 5125, 16385, 65537)]
    if "--more" in sys.argv:  # call 2: short odd rows (under 32 lanes: 1001) and views one element in
        shapes += [(2**26 // H, H, False) for H in (1001, 2001)] + [(2**26 // H, H, True) for H in (4096, 16384)]
    print(f"# {label}: {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16")
    print(f"{'M':>6} {'H':>6} {'copy':>6} {'add':>6} {'fwd':>6} {'mfwd':>6} {'bwd':>6} {'mbwd':>6} {'err':>5} {'sig':>7}")
    torch.manual_seed(0)
    for M, H, view in shapes:
        x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
        if view:  # every row starts 2 bytes past a 16-byte boundary: the realigned builds
            x = torch.randn(M * H + 1, device="cuda", dtype=torch.bfloat16)[1:].view(M, H)
        mul, g = torch.randn_like(x), torch.randn_like(x)
        out, out2 = torch.empty_like(x), torch.empty_like(x)
        copy = bench(lambda: out.copy_(x))
        add = bench(lambda: torch.add(x, g, out=out2))
        y, rstd = ops.forward(x, w, b, 1e-6)
        mout, mrstd = ops.mul_forward(x, mul, w, b, 1e-6)
        fwd = bench(lambda: ops.forward(x, w, b, 1e-6))
        mfwd = bench(lambda: ops.mul_forward(x, mul, w, b, 1e-6))
        bwd = bench(lambda: ops.backward(g, x, w, rstd))
        mbwd = bench(lambda: ops.mul_backward(g, x, mul, w, b, mrstd))
        err = worst_error(mout, x, w, b, mul)
        grads = (*ops.backward(g, x, w, rstd), *ops.mul_backward(g, x, mul, w, b, mrstd))
        sig = signature([y, mout] + [t.float().view(torch.int16) if t.dtype != torch.bfloat16 else t for t in grads])
        print(f"{M:>6} {str(H) + ('v' if view else ''):>6} {copy * 1e3:6.1f} {add * 1e3:6.1f} {fwd / copy:6.3f} {mfwd / add:6.3f} "
              f"{bwd / add:6.3f} {mbwd / (add + copy):6.3f} {err:5.2f} {sig:>7}", flush=True)


if __name__ == "__main__":
    main()
