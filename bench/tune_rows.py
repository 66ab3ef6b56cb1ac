"""The row kernels' tunings side by side, kernel-only, on a CUDA device (issue 13).

``torch.ops.polynorm._tune_rows(fwd_packs, bwd_packs, grid_waves, prefetch, same_phase)`` picks
the packs a thread of PolyNorm's 2-byte row kernels (forward 4, 8 or 16; backward 4 or 8: the
wide builds of 128 registers, for aligned rows of at most 256 threads a CTA), the
forward's grid (1: persistent, as many blocks as fit once; 0: a block per R rows), the
forward's prefetch of the next row (``p``), and whether odd-H rows take the same-phase path
(``sp0``: without it, default packs). This script
times ``torch.ops.polynorm.forward``/``backward`` under each at M·H = 2^26 (bf16 by default) as
ratios to a same-size copy (forward) and add (backward) timed in the same run (medians of
``triton.testing.do_bench``), on aligned rows, on odd H, and on a view that starts one element
into its buffer (``mis``: every row misaligned). Each variant's output is also checked against
the float64 oracle on its first rows (``err``: the largest error over the bf16 rounding floor).

    python3 bench/tune_rows.py [--dtype bfloat16] [--H 512 4096 ...]
"""

import argparse

import torch
from triton.testing import do_bench

import polynorm  # noqa: F401  (registers torch.ops.polynorm.*)
from polynorm.reference import poly_norm as reference

DEFAULT_H = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 3000, 4097, 5125, 16385)
# (packs, grid waves, prefetch); 16 packs forward and 8 backward: the wide bench builds (aligned
# rows of at most 256 threads a CTA; "n/a" elsewhere).
# (packs, grid waves) backward: -1 the table's grid (persistent), 0 a block per R rows.
FWD = [(0, -1, True), (8, 1, False), (8, 0, False), (4, 1, False), (16, 0, False), (16, 1, False)]
BWD = [(0, -1), (4, 0), (8, -1), (8, 0), (8, 2)]


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def worst_error(y: torch.Tensor, x: torch.Tensor, weight, bias) -> float:
    """Largest |y - oracle| over the first rows, in units of the output dtype's half-ulp at 1."""
    rows = x[:64].double()
    ref = reference(rows, weight.double(), bias.double(), 1e-6)
    floor = torch.finfo(y.dtype).eps / 2 * ref.abs().clamp_min(1.0)
    return float(((y[:64].double() - ref).abs() / floor).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--H", type=int, nargs="*", default=list(DEFAULT_H))
    parser.add_argument("--elements", type=int, default=2**26, help="M·H of each shape")
    parser.add_argument("--aligned-only", action="store_true", help="skip the view that starts one element in")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    weight = torch.tensor([0.3, -0.4, 0.9], device="cuda")
    bias = torch.tensor([0.1], device="cuda")
    fwd_cols = [f"f{p}w{w}" + ("p" if pre and p == 4 else "") for p, w, pre in FWD]
    bwd_cols = [f"b{p}w{w}" for p, w in BWD] + ["f-sp0", "b-sp0"]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}, M*H = {args.elements}; "
          "forward / copy (f<packs>w<grid waves>) and backward / add (b<packs>w<grid waves>; 0 packs, -1 waves: "
          "the table's), same run, medians of do_bench; "
          "err: worst error of any variant over the half-ulp floor")
    print("| H | layout | copy us | add us | " + " | ".join(fwd_cols + bwd_cols) + " | err |")
    print("|" + "---|" * (5 + len(fwd_cols) + len(bwd_cols)))
    try:
        for H in args.H:
            M = max(1, args.elements // H)
            buf = torch.randn(M * H + 8, device="cuda", dtype=dtype)
            layouts = [("aligned", buf[: M * H].view(M, H))]
            if H % 8 == 0 and not args.aligned_only:
                layouts.append(("mis", buf[1 : 1 + M * H].view(M, H)))
            for name, x in layouts:
                g = torch.randn(M, H, device="cuda", dtype=dtype)
                out = torch.empty(M, H, device="cuda", dtype=dtype)
                t_copy = bench(lambda: out.copy_(x))
                t_add = bench(lambda: torch.add(x, g, out=out))
                cells, err = [], 0.0
                for packs, waves, prefetch in FWD:
                    torch.ops.polynorm._tune_rows(packs, 0, waves, prefetch)
                    try:
                        y, _ = torch.ops.polynorm.forward(x, weight, bias, 1e-6)
                    except RuntimeError:  # a wide build where it is not built (misaligned or long rows)
                        cells.append("n/a")
                        continue
                    err = max(err, worst_error(y, x, weight, bias))
                    cells.append(f"{bench(lambda: torch.ops.polynorm.forward(x, weight, bias, 1e-6)) / t_copy:.3f}")
                torch.ops.polynorm._tune_rows()
                _, rstd = torch.ops.polynorm.forward(x, weight, bias, 1e-6)
                ref_dx = None
                for packs, waves in BWD:
                    torch.ops.polynorm._tune_rows(0, packs, waves)
                    try:
                        dx, dw, db = torch.ops.polynorm.backward(g, x, weight, rstd)
                    except RuntimeError:  # as above
                        cells.append("n/a")
                        continue
                    if ref_dx is None:
                        ref_dx = dx
                    else:  # another reduction order: agreement within a few rounding steps
                        rel = float(((dx.float() - ref_dx.float()).abs().max()) / ref_dx.float().abs().max())
                        err = max(err, rel / (torch.finfo(dtype).eps / 2))
                    cells.append(f"{bench(lambda: torch.ops.polynorm.backward(g, x, weight, rstd)) / t_add:.3f}")
                # Default packs without the same-phase path (odd H only: elsewhere it is not taken).
                torch.ops.polynorm._tune_rows(0, 0, -1, True, False)
                if H % 8:
                    y0, _ = torch.ops.polynorm.forward(x, weight, bias, 1e-6)
                    dx0 = torch.ops.polynorm.backward(g, x, weight, rstd)[0]
                    torch.ops.polynorm._tune_rows()
                    y1, _ = torch.ops.polynorm.forward(x, weight, bias, 1e-6)
                    dx1 = torch.ops.polynorm.backward(g, x, weight, rstd)[0]
                    if not (torch.equal(y0, y1) and torch.equal(dx0, dx1)):
                        err = float("inf")  # the same-phase path must give the other path's bits
                    torch.ops.polynorm._tune_rows(0, 0, -1, True, False)
                    cells.append(f"{bench(lambda: torch.ops.polynorm.forward(x, weight, bias, 1e-6)) / t_copy:.3f}")
                    cells.append(f"{bench(lambda: torch.ops.polynorm.backward(g, x, weight, rstd)) / t_add:.3f}")
                else:
                    cells += ["-", "-"]
                torch.ops.polynorm._tune_rows()
                print(f"| {H} | {name} | {t_copy * 1e3:.1f} | {t_add * 1e3:.1f} | " + " | ".join(cells)
                      + f" | {err:.2f} |", flush=True)
    finally:
        torch.ops.polynorm._tune_rows()


if __name__ == "__main__":
    main()
