"""The row kernels' CTA size and thread-block clusters side by side, kernel-only, on a CUDA
device (issue 13: long rows, one kernel family).

A row that needs more than ``cta_threads`` threads is split over a cluster of up to
``max_cluster`` CTAs, which add their partial sums through distributed shared memory
(``torch.ops.polynorm._tune_rows(cta_threads=..., max_cluster=...)``, csrc/launch_plan.h
``row_plan``). This script times PolyNorm's forward and backward and the fused op's
(``mul_forward``/``mul_backward``) at M·H = 2^26 (bf16 by default) under each CTA size, and
the staged and tiled families forced (``_force_kernel``) for comparison, as ratios to floors
timed in the same run (medians of ``triton.testing.do_bench``): a copy (forward), an add
(backward, fused forward), an add plus a copy (fused backward). Each cell's plan is checked:
``err`` is the largest error of any variant's y (first rows) over the half-ulp floor of the
float64 oracle, and every variant's dx is compared with the first's (a few rounding steps:
another reduction tree).

    python3 bench/tune_clusters.py [--dtype bfloat16] [--H 8192 65536 ...] [--ops fwd bwd mfwd mbwd]
"""

import argparse

import torch
from triton.testing import do_bench

import polynorm  # noqa: F401  (registers torch.ops.polynorm.*)
from polynorm.reference import poly_norm as reference

DEFAULT_H = (4096, 8192, 16384, 32768, 40000, 65536, 98304, 131072, 262144, 5125, 16385, 65537)
# (cta_threads, max_cluster): 1024/1 is the row kernels without clusters.
VARIANTS = [(1024, 1), (1024, 8), (512, 8), (256, 8), (128, 8), (256, 16)]
OPS = ("fwd", "bwd", "mfwd", "mbwd")


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def worst_error(y: torch.Tensor, x: torch.Tensor, weight, bias, mul=None) -> float:
    """Largest |y - oracle| over the first rows, in units of the output dtype's half-ulp."""
    ref = reference(x[:16].double(), weight.double(), bias.double(), 1e-6)
    if mul is not None:
        ref = ref * mul[:16].double()
    floor = torch.finfo(y.dtype).eps / 2 * ref.abs().clamp_min(1.0)
    return float(((y[:16].double() - ref).abs() / floor).max())


def plan_of(op: str, H: int, dtype) -> str:
    name = {"fwd": "forward", "bwd": "backward", "mfwd": "mul_forward", "mbwd": "mul_backward"}[op]
    text = torch.ops.polynorm._launch_plan(name, H, dtype)
    return text.split()[0] + ("" if "cluster=1" in text or not text.startswith("row") else
                              "x" + text.split("cluster=")[1] + "/" + text.split("G=")[1].split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--H", type=int, nargs="*", default=list(DEFAULT_H))
    parser.add_argument("--ops", nargs="*", default=list(OPS), choices=OPS)
    parser.add_argument("--elements", type=int, default=2**26, help="M·H of each shape")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    weight = torch.tensor([0.3, -0.4, 0.9], device="cuda")
    bias = torch.tensor([0.1], device="cuda")
    cols = [f"c{t}x{c}" for t, c in VARIANTS] + ["staged", "tiled"]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}, M*H = {args.elements}; "
          "c<cta threads>x<max cluster>: time / floor (fwd: copy, bwd and mfwd: add, mbwd: add + copy), "
          "same run, medians of do_bench; plan: the kernel each variant took ('row' plain, 'rowxC/G' a cluster "
          "of C CTAs of G threads); err: worst y error over the half-ulp floor, and dx against the first variant")
    print("| H | op | floor us | " + " | ".join(cols) + " | err |")
    print("|" + "---|" * (4 + len(cols)))
    try:
        for H in args.H:
            M = max(1, args.elements // H)
            x = torch.randn(M, H, device="cuda", dtype=dtype)
            mul = torch.randn(M, H, device="cuda", dtype=dtype)
            g = torch.randn(M, H, device="cuda", dtype=dtype)
            out = torch.empty(M, H, device="cuda", dtype=dtype)
            out2 = torch.empty(M, H, device="cuda", dtype=dtype)
            t_copy = bench(lambda: out.copy_(x))
            t_add = bench(lambda: torch.add(x, g, out=out))
            floors = {"fwd": t_copy, "bwd": t_add, "mfwd": t_add, "mbwd": t_add + bench(lambda: out2.copy_(x))}
            _, rstd = torch.ops.polynorm.forward(x, weight, bias, 1e-6)
            _, mrstd = torch.ops.polynorm.mul_forward(x, mul, weight, bias, 1e-6)
            calls = {
                "fwd": lambda: torch.ops.polynorm.forward(x, weight, bias, 1e-6),
                "bwd": lambda: torch.ops.polynorm.backward(g, x, weight, rstd),
                "mfwd": lambda: torch.ops.polynorm.mul_forward(x, mul, weight, bias, 1e-6),
                "mbwd": lambda: torch.ops.polynorm.mul_backward(g, x, mul, weight, bias, mrstd),
            }
            for op in args.ops:
                cells, plans, err, first = [], [], 0.0, None
                settings = [(t, c, "auto") for t, c in VARIANTS] + [(0, 0, "staged"), (0, 0, "tiled")]
                for cta, cluster, family in settings:
                    torch.ops.polynorm._tune_rows(cta_threads=cta, max_cluster=cluster)
                    torch.ops.polynorm._force_kernel(family)
                    plan = plan_of(op, H, dtype)
                    if family != "auto" and not plan.startswith(family):
                        cells.append("-")  # the family cannot serve this row (or op)
                        continue
                    try:
                        result = calls[op]()
                        torch.cuda.synchronize()
                    except RuntimeError as error:  # e.g. a cluster the device cannot place
                        cells.append("n/a")
                        print(f"# H={H} {op} {cta}x{cluster} {family}: {str(error).splitlines()[0]}")
                        continue
                    if op in ("fwd", "mfwd"):
                        err = max(err, worst_error(result[0], x, weight, bias, mul if op == "mfwd" else None))
                    else:
                        dx = result[0].float()
                        if first is None:
                            first = dx
                        else:
                            rel = float((dx - first).abs().max() / first.abs().max())
                            err = max(err, rel / (torch.finfo(dtype).eps / 2))
                    cells.append(f"{bench(calls[op]) / floors[op]:.3f} {plan}")
                print(f"| {H} | {op} | {floors[op] * 1e3:.1f} | " + " | ".join(cells) + f" | {err:.2f} |", flush=True)
    finally:
        torch.ops.polynorm._tune_rows()
        torch.ops.polynorm._force_kernel("auto")


if __name__ == "__main__":
    main()
