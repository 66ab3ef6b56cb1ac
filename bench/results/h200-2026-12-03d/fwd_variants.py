"""The forwards of one build, kernel-only (twenty-first session, call 1; bench/NOTES.md v23): the
build is whichever `polynorm` PYTHONPATH finds, so that the same script times builds of other
POLYNORM_NVCC_FLAGS (forward.cuh's POLYNORM_FWD_SUM_SETS, POLYNORM_FWD_IDLE_SKIP) one process each.

Columns: the floor in microseconds (copy for PolyNorm's forward, add for the fused one), then
PolyNorm's forward over the copy (fwd) and the fused forward over the add (mfwd), medians of
triton.testing.do_bench. `err`: the largest error of y (or out) on the first 64 rows against the
float64 oracle, in the dtype's half-ulp at 1 (max(|ref|, 1) scaled); `mis`: 1 if a view that
starts one element into its buffer gives the bits of the same rows aligned (both ops), else 0;
`sig`: a signature of y's and out's bits over the whole tensor (their int16 words summed, mod
10^6), equal across builds that give the same bits (call 2 on).

    PYTHONPATH=<build> python3 bench/results/h200-2026-12-03d/fwd_variants.py <label> [--seed-only]
"""

import sys

import torch
from triton.testing import do_bench

import polynorm  # noqa: F401
from polynorm.reference import poly_norm as reference


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def worst_error(y, x, w, b, mul=None) -> float:
    ref = reference(x[:64].double(), w.double(), b.double(), 1e-6)
    if mul is not None:
        ref = ref * mul[:64].double()
    floor = torch.finfo(y.dtype).eps / 2 * ref.abs().clamp_min(1.0)
    return float(((y[:64].double() - ref).abs() / floor).max())


def misaligned_bits_equal(x, mul, w, b) -> int:
    rows = x[:64]
    buf = torch.empty(rows.numel() + 1, device="cuda", dtype=rows.dtype)
    view = buf[1:].view_as(rows)
    view.copy_(rows)
    mbuf = torch.empty_like(buf)
    mview = mbuf[1:].view_as(rows)
    mview.copy_(mul[:64])
    same = torch.equal(torch.ops.polynorm.forward(view, w, b, 1e-6)[0], torch.ops.polynorm.forward(rows, w, b, 1e-6)[0])
    same &= torch.equal(torch.ops.polynorm.mul_forward(view, mview, w, b, 1e-6)[0],
                        torch.ops.polynorm.mul_forward(rows, mul[:64].contiguous(), w, b, 1e-6)[0])
    return int(same)


def main() -> None:
    label = sys.argv[1]
    seed_only = "--seed-only" in sys.argv
    w = torch.tensor([0.3, -0.5, 0.8], device="cuda")
    b = torch.tensor([0.1], device="cuda")
    shapes = [(2048, H) for H in (1024, 2048, 4096, 8192)]
    if not seed_only:
        shapes += [(2**26 // H, H) for H in (512, 1024, 2048, 4096, 8192, 16384, 32768, 3000, 5125)]
    print(f"# {label}: {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16")
    print(f"{'M':>6} {'H':>6} {'copy':>6} {'add':>6} {'fwd':>6} {'mfwd':>6} {'err':>5} {'merr':>5} {'mis':>3} {'sig':>13}")
    torch.manual_seed(0)
    for M, H in shapes:
        x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
        mul, g = torch.randn_like(x), torch.randn_like(x)
        out, out2 = torch.empty_like(x), torch.empty_like(x)
        copy = bench(lambda: out.copy_(x))
        add = bench(lambda: torch.add(x, g, out=out2))
        fwd = bench(lambda: torch.ops.polynorm.forward(x, w, b, 1e-6))
        mfwd = bench(lambda: torch.ops.polynorm.mul_forward(x, mul, w, b, 1e-6))
        err = worst_error(torch.ops.polynorm.forward(x, w, b, 1e-6)[0], x, w, b)
        merr = worst_error(torch.ops.polynorm.mul_forward(x, mul, w, b, 1e-6)[0], x, w, b, mul)
        mis = misaligned_bits_equal(x, mul, w, b)
        sig = [int(t.view(torch.int16).long().sum()) % 10**6 for t in (
            torch.ops.polynorm.forward(x, w, b, 1e-6)[0], torch.ops.polynorm.mul_forward(x, mul, w, b, 1e-6)[0])]
        print(f"{M:>6} {H:>6} {copy * 1e3:6.1f} {add * 1e3:6.1f} {fwd / copy:6.3f} {mfwd / add:6.3f} "
              f"{err:5.2f} {merr:5.2f} {mis:>3} {sig[0]:>6}/{sig[1]:>6}", flush=True)


if __name__ == "__main__":
    main()
