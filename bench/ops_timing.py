"""Kernel-only ratios of the polynorm ops to same-run floors, bf16 (``--dtype``), on a CUDA device.

Calls ``torch.ops.polynorm.forward/backward`` (and the Triton ops, when registered)
directly, without autograd, and prints each time over a same-size copy (forward) and a
same-size ``torch.add`` (backward), all medians of ``triton.testing.do_bench`` in one run.
Shapes: M*H = 2^26 for H = 512..65536 and the irregular 3000, 5125, 16385; then the seed
shapes M = 2048, H = 1024..32768. Columns: copy and add floors in microseconds, then
time / floor for the CUDA (fwd/x, bwd/x) and Triton (trfwd/x, trbwd/x) ops.

``--op poly_norm_mul`` times the fused PolyNorm x mul the same way (issue 15):
``mul_forward`` and ``mul_backward`` (CUDA), ``mul_forward_triton`` and ``mul_backward_triton``,
over its floors: forward reads x and mul and writes out, as a same-size ``torch.add(a, b,
out=c)`` does (add); backward reads grad_out, x and mul and writes dx and dmul, as an add and
a copy timed apart and added do (add+copy, as in bench.py). Columns: the add floor in
microseconds, mfwd/x and trmfwd/x over it; the add+copy floor, mbwd/x and trmbwd/x over it.
An op without a kernel on this build (NotImplementedError) shows as nan.

``--graph`` times every op as the replay of a CUDA graph that holds one call of it (the
outputs in the graph's pool), so that the host's cost of a call stays out of the figure even
where it outlasts do_bench's L2 flush between calls (the Triton ops' ``torch.library`` dispatch
and launch on a slow host; bench/NOTES.md v22, v23). The floors stay eager: a copy captured in a
graph is a memcpy node, which ran at 1.45x the eager copy's time at the odd-H shapes
(bench/results/h200-2026-12-03d/call1/ops_timing_graph.log, whose floors were graphed).

    python3 bench/ops_timing.py
    python3 bench/ops_timing.py --op poly_norm_mul
    python3 bench/ops_timing.py --graph

This is the script behind bench/results/h200-2026-11-29/ops_timing*.log. The full
harness, with autograd, the peers and plots, is bench/bench.py.
"""
import argparse

import torch
from triton.testing import do_bench

import polynorm  # noqa: F401  (registers torch.ops.polynorm.*)

BYTES_H = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 3000, 4097, 5125, 16385)  # M·H = 2^26
SHAPES = [(2**26 // H, H) for H in BYTES_H] + [(2048, H) for H in (1024, 2048, 4096, 8192, 16384, 32768)]
N_BYTES_SHAPES = len(BYTES_H)


GRAPH = False  # --graph: time the replay of a one-call CUDA graph of each op (main sets it)


def graphed(fn):
    """The replay of a CUDA graph that holds one call of fn (its outputs in the graph's pool)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def bench(fn, floor: bool = False) -> float:
    """Median ms of fn; with --graph, of a one-call graph's replay, but for a floor (always eager)."""
    if GRAPH and not floor:
        try:
            fn = graphed(fn)
        except RuntimeError as error:  # an op that cannot be captured: nan in its column, the reason here
            print(f"# capture failed: {str(error).splitlines()[0]}", flush=True)
            return float("nan")
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def row(M: int, H: int, dtype: torch.dtype, weight: torch.Tensor, bias: torch.Tensor, triton: bool = True) -> str:
    x = torch.randn(M, H, device="cuda", dtype=dtype)
    g = torch.randn_like(x)
    out, out2 = torch.empty_like(x), torch.empty_like(x)
    t_copy = bench(lambda: out.copy_(x), floor=True)
    t_add = bench(lambda: torch.add(x, g, out=out2), floor=True)
    t_f = bench(lambda: torch.ops.polynorm.forward(x, weight, bias, 1e-6))
    _, rstd = torch.ops.polynorm.forward(x, weight, bias, 1e-6)
    t_b = bench(lambda: torch.ops.polynorm.backward(g, x, weight, rstd))
    tf = tb = float("nan")
    if triton and hasattr(torch.ops.polynorm, "forward_triton"):
        tf = bench(lambda: torch.ops.polynorm.forward_triton(x, weight, bias, 1e-6))
        tb = bench(lambda: torch.ops.polynorm.backward_triton(g, x, weight, rstd))
    return (
        f"{M:7d} {H:6d} {t_copy * 1e3:7.1f} {t_f / t_copy:6.2f} {tf / t_copy:7.2f} "
        f"{t_add * 1e3:7.1f} {t_b / t_add:6.2f} {tb / t_add:7.2f}"
    )


def mul_times(forward_name: str, backward_name: str, x, mul, g, weight, bias) -> tuple[float, float]:
    """(forward ms, backward ms) of the named fused ops, or nan where an op has no kernel."""
    forward_op, backward_op = (getattr(torch.ops.polynorm, name, None) for name in (forward_name, backward_name))
    try:
        _, rstd = forward_op(x, mul, weight, bias, 1e-6)
    except (NotImplementedError, TypeError):  # no CUDA kernel in this build; no Triton op registered
        return float("nan"), float("nan")
    t_f = bench(lambda: forward_op(x, mul, weight, bias, 1e-6))
    t_b = bench(lambda: backward_op(g, x, mul, weight, bias, rstd))
    return t_f, t_b


def mul_row(M: int, H: int, dtype: torch.dtype, weight: torch.Tensor, bias: torch.Tensor, triton: bool = True) -> str:
    x = torch.randn(M, H, device="cuda", dtype=dtype)
    mul = torch.randn_like(x)
    g = torch.randn_like(x)
    out, out2 = torch.empty_like(x), torch.empty_like(x)
    t_add = bench(lambda: torch.add(x, mul, out=out), floor=True)
    t_copy = bench(lambda: out2.copy_(x), floor=True)
    t_add_copy = t_add + t_copy  # read 3, write 2: the backward's bytes
    t_f, t_b = mul_times("mul_forward", "mul_backward", x, mul, g, weight, bias)
    tf = tb = float("nan")
    if triton:
        tf, tb = mul_times("mul_forward_triton", "mul_backward_triton", x, mul, g, weight, bias)
    return (
        f"{M:7d} {H:6d} {t_add * 1e3:7.1f} {t_f / t_add:6.2f} {tf / t_add:8.2f} "
        f"{t_add_copy * 1e3:8.1f} {t_b / t_add_copy:6.2f} {tb / t_add_copy:8.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", choices=("poly_norm", "poly_norm_mul"), default="poly_norm")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--no-seed-shapes", action="store_true", help="only the M*H = 2^26 shapes")
    parser.add_argument("--no-triton", action="store_true", help="the CUDA ops only (the Triton columns show nan)")
    parser.add_argument("--graph", action="store_true",
                        help="time each op as the replay of a one-call CUDA graph (no host cost); floors eager")
    args = parser.parse_args()
    global GRAPH
    GRAPH = args.graph
    dtype = getattr(torch, args.dtype)
    # The seed rows follow the 2^26 rows (2048 x 32768 is both: with --no-seed-shapes it stays once).
    shapes = SHAPES[:N_BYTES_SHAPES] if args.no_seed_shapes else SHAPES
    timing = ", each op a CUDA graph's replay, the floors eager" if args.graph else ""
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}{timing}")
    torch.manual_seed(0)
    weight = torch.tensor([0.3, -0.4, 0.9], device="cuda")
    bias = torch.tensor([0.1], device="cuda")
    if args.op == "poly_norm":
        print(f"{'M':>7} {'H':>6} {'copy':>7} {'fwd/x':>6} {'trfwd/x':>7} {'add':>7} {'bwd/x':>6} {'trbwd/x':>7}")
        for M, H in shapes:
            print(row(M, H, dtype, weight, bias, triton=not args.no_triton), flush=True)
    else:
        head = f"{'add':>7} {'mfwd/x':>6} {'trmfwd/x':>8} {'add+copy':>8} {'mbwd/x':>6} {'trmbwd/x':>8}"
        print(f"{'M':>7} {'H':>6} {head}")
        for M, H in shapes:
            print(mul_row(M, H, dtype, weight, bias, triton=not args.no_triton), flush=True)


if __name__ == "__main__":
    main()
