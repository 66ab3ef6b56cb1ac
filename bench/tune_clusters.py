"""The row kernels' CTA size and thread-block clusters side by side, kernel-only, on a CUDA
device (issue 13: long rows, one kernel family).

A row that needs more than ``cta_threads`` threads is split over a cluster of up to
``max_cluster`` CTAs, which add their partial sums through distributed shared memory
(``torch.ops.polynorm._tune_rows(cta_threads=..., max_cluster=...)``, csrc/launch_plan.h
``row_plan``). This script times PolyNorm's forward and backward and the fused op's
(``mul_forward``/``mul_backward``) at M·H = 2^26 (bf16 by default) under each CTA size, and
the tiled family forced (``_force_kernel``) for comparison, as ratios to floors
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
# Column name: _tune_rows settings. "table": the launch table's own choice; c<T>x<C>: rows of
# more than T threads split over clusters of up to C CTAs of at most T threads (c1024x1: no
# clusters; PolyNorm's wide builds cap T at 256); w1: a persistent grid (forward and backward),
# w0: a block (cluster) per row.
VARIANTS = {
    "table": {},
    "c1024x1": dict(cta_threads=1024, max_cluster=1),
    "c512x8": dict(cta_threads=512, max_cluster=8),
    "c256x8": dict(cta_threads=256, max_cluster=8),
    "c128x8": dict(cta_threads=128, max_cluster=8),
    "c256x16": dict(cta_threads=256, max_cluster=16),
}
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
    if not text.startswith("row"):
        return text.split()[0]
    cluster = int(text.split("cluster=")[1].split()[0])
    return "row" if cluster == 1 else f"rowx{cluster}/{text.split('G=')[1].split()[0]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--H", type=int, nargs="*", default=list(DEFAULT_H))
    parser.add_argument("--ops", nargs="*", default=list(OPS), choices=OPS)
    parser.add_argument("--elements", type=int, default=2**26, help="M·H of each shape")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), help="columns, by name (see VARIANTS), "
                        "or extra ones as name=key:value,key:value (e.g. w1c128=grid_waves:1,cta_threads:128)")
    args = parser.parse_args()
    variants = {}
    for name in args.variants:
        if "=" in name:
            name, spec = name.split("=", 1)
            variants[name] = {k: (v == "True") if v in ("True", "False") else int(v)
                              for k, v in (item.split(":") for item in spec.split(","))}
        else:
            variants[name] = VARIANTS[name]
    cols = list(variants) + ["tiled"]
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    weight = torch.tensor([0.3, -0.4, 0.9], device="cuda")
    bias = torch.tensor([0.1], device="cuda")
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
                settings = [(name, tuning, "auto") for name, tuning in variants.items()]
                settings += [("tiled", {}, "tiled")]
                for name, tuning, family in settings:
                    torch.ops.polynorm._tune_rows(**tuning)
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
                        print(f"# H={H} {op} {name}: {str(error).splitlines()[0]}")
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
