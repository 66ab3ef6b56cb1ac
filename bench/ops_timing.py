#!/usr/bin/env python3
"""Kernel-only time of the polynorm ops over same-run memory floors, on a CUDA device.

Calls the public ops directly, without autograd: PolyNorm's ``torch.ops.polynorm.forward`` and
``backward``, the fused PolyNorm x mul's ``mul_forward`` and ``mul_backward``, and their Triton
twins (``forward_triton``, ...) where registered. Each figure is a median of
``triton.testing.do_bench`` (the L2 cache flushed before every call) divided by a floor: a
torch op that moves the same bytes, timed on the same tensors in the same run.

=============  ===============================================  =======================================
op             forward floor                                    backward floor
=============  ===============================================  =======================================
poly_norm      ``out.copy_(x)``: read 1, write 1                ``torch.add(x, g, out=)``: read 2, write 1
poly_norm_mul  ``torch.add(x, mul, out=)``: read 2, write 1     add + copy, timed apart: read 3, write 2
=============  ===============================================  =======================================

The copy and the add are timed once per shape and serve both ops (g and mul have x's shape,
dtype and layout, so an add of x and either costs the same).

Rows, for each dtype (bfloat16, float16, float32; ``--dtype`` picks) and each op (``--op``):

- ``aligned``: M * H = 2^26 at H = 512, 1024, ..., 262144 and at H = 3000;
- ``odd``: M * H = 2^26 at H = 1025, 4097, 5125, 16385, 65537: H * element size is not a
  multiple of 16 bytes in any dtype, so most rows start off a 16-byte boundary;
- ``view``: M * H = 2^26 at H = 1024, 4096, 5125, 16384, with x, g and mul each
  ``torch.randn(M * H + 1)[1:].view(M, H)``: every tensor starts one element past a 16-byte
  boundary (the outputs are fresh tensors, aligned);
- the seed shapes, ``aligned``: M = 2048, H = 1024 ... 16384 (2048 x 32768 is a 2^26 row).

Every (op, dtype, M, H, layout) occurs once. ``--quick`` keeps one row of each layout and a seed
row, for a smoke run.

Output (``bench/compare_builds.py`` and ``bench/readme_tables.py`` parse it): comment lines
``# gpu:``, ``# torch:``, ``# triton:``, ``# commit:`` (the polynorm tree's git short hash, or
``unknown``), ``# date:`` (YYYY-MM-DD), ``# command:``, then other ``#`` lines (the imported
package, the timing, skipped ops, the wall time), then a header and one row per line::

    op dtype M H layout fwd_floor_us fwd_cuda fwd_triton bwd_floor_us bwd_cuda bwd_triton

Floors are in microseconds; each op column is the op's time over its floor; ``nan`` where the
op is absent (no Triton, ``--no-triton``, or no kernel for the dtype on this build).

``--graph`` times each op as the replay of a CUDA graph that holds one call of it, so the
host's cost of a call (the Triton ops' dispatch and launch on a slow host can outlast the L2
flush between calls) stays out of the figure. The floors stay eager: a copy captured in a
graph becomes a memcpy node, about 1.45x an eager copy at odd H.

Only public ops are called, so the script also times older builds of the extension: put the
build's folder (the one holding ``polynorm/``) first on PYTHONPATH.

    python3 bench/ops_timing.py                          # every row; prints its estimate first
    python3 bench/ops_timing.py --dtype bfloat16 --op poly_norm
    python3 bench/ops_timing.py --quick --no-triton
    python3 bench/ops_timing.py --graph
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = ("bfloat16", "float16", "float32")
OPS = ("poly_norm", "poly_norm_mul")
COLUMNS = ("op", "dtype", "M", "H", "layout", "fwd_floor_us", "fwd_cuda", "fwd_triton",
           "bwd_floor_us", "bwd_cuda", "bwd_triton")  # fmt: skip
ELEMENTS = 2**26  # M * H of the bandwidth rows: 128 MiB a tensor in 2-byte dtypes, far past any L2
ALIGNED_H = tuple(2**k for k in range(9, 19)) + (3000,)  # 512 ... 262144, and a width that is no power of two
ODD_H = (1025, 4097, 5125, 16385, 65537)  # odd: H * element size is never a multiple of 16 bytes
VIEW_H = (1024, 4096, 5125, 16384)
SEED_M, SEED_H = 2048, (1024, 2048, 4096, 8192, 16384)
EPS = 1e-6
DEVICE = "cuda"  # where the tensors live; a CPU test of the call paths sets "cpu"
WARMUP_MS, REP_MS = 10, 50  # do_bench's budgets: each call of it takes about their sum
# ops: name of the CUDA op, its Triton twin, and whether it takes mul
OP_NAMES = {
    "poly_norm": (("forward", "backward"), ("forward_triton", "backward_triton")),
    "poly_norm_mul": (("mul_forward", "mul_backward"), ("mul_forward_triton", "mul_backward_triton")),
}


@dataclass(frozen=True)
class Shape:
    M: int
    H: int
    layout: str  # aligned | odd | view


def shapes(quick: bool = False, seed: bool = False) -> list[Shape]:
    """The timed shapes, in the order they are timed (the same for every dtype). ``seed``: the
    M = SEED_M rows alone, the kernels of a few microseconds whose medians need more runs."""
    rows = [Shape(ELEMENTS // H, H, "aligned") for H in ALIGNED_H]
    rows += [Shape(ELEMENTS // H, H, "odd") for H in ODD_H]
    rows += [Shape(ELEMENTS // H, H, "view") for H in VIEW_H]
    rows += [Shape(SEED_M, H, "aligned") for H in SEED_H]
    if quick:
        keep = {(ELEMENTS // 4096, 4096, "aligned"), (ELEMENTS // 5125, 5125, "odd"),
                (ELEMENTS // 5125, 5125, "view"), (SEED_M, 1024, "aligned")}  # fmt: skip
        rows = [s for s in rows if (s.M, s.H, s.layout) in keep]
    if seed:
        rows = [s for s in rows if s.M == SEED_M]
    assert len({(s.M, s.H, s.layout) for s in rows}) == len(rows)
    return rows


def timings_per_shape(ops: tuple[str, ...], triton: bool) -> int:
    """do_bench calls per shape: the copy and the add, then forward and backward of each op and backend."""
    return 2 + len(ops) * 2 * (2 if triton else 1)


def header() -> str:
    return " ".join(COLUMNS)


def format_row(op: str, dtype: str, shape: Shape, floors: tuple[float, float], fwd: tuple[float, float],
               bwd: tuple[float, float]) -> str:  # fmt: skip
    """One row: floors in us (ms in), each op time (ms) over its floor, 3 decimals; nan where absent."""

    def ratio(t: float, floor: float) -> str:
        return "nan" if math.isnan(t) else f"{t / floor:.3f}"

    cells = [op, dtype, str(shape.M), str(shape.H), shape.layout, f"{floors[0] * 1e3:.2f}",
             ratio(fwd[0], floors[0]), ratio(fwd[1], floors[0]), f"{floors[1] * 1e3:.2f}",
             ratio(bwd[0], floors[1]), ratio(bwd[1], floors[1])]  # fmt: skip
    return " ".join(cells)


def git_commit(path: str) -> str:
    """The tree's git short hash; for a copy without .git, the first line of a COMMIT file at its root."""
    stamp = Path(path).resolve().parent / "COMMIT"
    if stamp.is_file():
        return stamp.read_text().split()[0]
    try:
        done = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


class Timer:
    def __init__(self, warmup: float, rep: float, graph: bool):
        from triton.testing import do_bench

        self.do_bench, self.warmup, self.rep, self.graph = do_bench, warmup, rep, graph

    def __call__(self, fn, floor: bool = False) -> float:
        """Median ms of fn; with --graph (not for a floor), of a one-call CUDA graph's replay."""
        if self.graph and not floor:
            fn()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    fn()
            except RuntimeError as error:  # an op that cannot be captured: nan, the reason as a comment
                print(f"# capture failed: {str(error).splitlines()[0]}", flush=True)
                return float("nan")
            fn = graph.replay
        return self.do_bench(fn, warmup=self.warmup, rep=self.rep, return_mode="median")


def op_or_none(name: str):
    try:
        return getattr(torch.ops.polynorm, name)
    except (AttributeError, RuntimeError):  # not registered by this build (e.g. no triton)
        return None


def time_op(timer, names: tuple[str, str], x, g, mul, weight, bias, label: str, warm_only: bool) -> tuple[float, float]:
    """(forward ms, backward ms) of one backend's pair of ops, nan where absent or failing."""
    forward, backward = (op_or_none(name) for name in names)
    if forward is None or backward is None:
        return math.nan, math.nan
    fwd_args = (x, weight, bias, EPS) if mul is None else (x, mul, weight, bias, EPS)
    try:
        _, rstd = forward(*fwd_args)
        bwd_args = (g, x, weight, rstd) if mul is None else (g, x, mul, weight, bias, rstd)
        backward(*bwd_args)
    except (NotImplementedError, RuntimeError) as error:  # no kernel for this dtype/device on this build
        print(f"# skipped {names[0]}/{names[1]} {label}: {str(error).splitlines()[0][:160]}", flush=True)
        return math.nan, math.nan
    if warm_only:
        if x.is_cuda:
            torch.cuda.synchronize()
        return math.nan, math.nan
    return timer(lambda: forward(*fwd_args)), timer(lambda: backward(*bwd_args))


def inputs(shape: Shape, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, g, mul of the shape's layout: fresh randn, or views one element into their buffers."""
    M, H = shape.M, shape.H

    def one() -> torch.Tensor:
        if shape.layout == "view":
            return torch.randn(M * H + 1, device=DEVICE, dtype=dtype)[1:].view(M, H)
        return torch.randn(M, H, device=DEVICE, dtype=dtype)

    return one(), one(), one()


def time_shape(timer, shape: Shape, dtype_name: str, ops: tuple[str, ...], triton: bool, weight, bias,
               warm_only: bool = False) -> list[str]:  # fmt: skip
    dtype = getattr(torch, dtype_name)
    x, g, mul = inputs(shape, dtype)
    out = torch.empty(shape.M, shape.H, device=DEVICE, dtype=dtype)
    if warm_only:
        t_copy = t_add = 1.0
    else:
        t_copy = timer(lambda: out.copy_(x), floor=True)
        t_add = timer(lambda: torch.add(x, mul, out=out), floor=True)
    lines = []
    for op in ops:
        fused = op == "poly_norm_mul"
        label = f"{dtype_name} {shape.M}x{shape.H} {shape.layout}"
        cuda_names, triton_names = OP_NAMES[op]
        cuda = time_op(timer, cuda_names, x, g, mul if fused else None, weight, bias, label, warm_only)
        tri = (math.nan, math.nan)
        if triton:
            tri = time_op(timer, triton_names, x, g, mul if fused else None, weight, bias, label, warm_only)
        floors = (t_add, t_add + t_copy) if fused else (t_copy, t_add)
        lines.append(format_row(op, dtype_name, shape, floors, (cuda[0], tri[0]), (cuda[1], tri[1])))
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--dtype", nargs="+", choices=DTYPES, default=list(DTYPES))
    parser.add_argument("--quick", action="store_true", help="one row of each layout and a seed row (smoke)")
    parser.add_argument("--seed", action="store_true", help=f"the M = {SEED_M} rows alone")
    parser.add_argument("--no-triton", action="store_true", help="the CUDA ops only (the Triton columns show nan)")
    parser.add_argument("--graph", action="store_true",
                        help="time each op as the replay of a one-call CUDA graph (no host cost); floors eager")
    parser.add_argument("--warmup", type=float, default=WARMUP_MS, help=f"do_bench warmup, ms (default {WARMUP_MS})")
    parser.add_argument("--rep", type=float, default=REP_MS, help=f"do_bench rep, ms (default {REP_MS})")
    parser.add_argument("--warm-only", action="store_true",
                        help="call every op once per row, time nothing: fills Triton's compile cache")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("ops_timing: needs a CUDA device")
    import polynorm  # registers torch.ops.polynorm.* (the first polynorm on sys.path: PYTHONPATH picks the build)

    triton = not args.no_triton
    try:
        import triton as triton_module

        triton_version = triton_module.__version__
    except ImportError:
        sys.exit("ops_timing: needs triton (triton.testing.do_bench)")
    ops, dtypes, rows = tuple(args.op), tuple(args.dtype), shapes(args.quick, args.seed)
    package = os.path.dirname(os.path.abspath(polynorm.__file__))
    n_bench = len(dtypes) * len(rows) * timings_per_shape(ops, triton)
    estimate = n_bench * (args.warmup + args.rep + 10) / 1e3  # ~10 ms a call beyond its budgets
    print(f"# gpu: {torch.cuda.get_device_name()}")
    print(f"# torch: {torch.__version__}")
    print(f"# triton: {triton_version}")
    print(f"# commit: {git_commit(package)}")
    print(f"# date: {datetime.date.today().isoformat()}")
    print(f"# command: {shlex.join(['python3'] + sys.argv)}")
    print(f"# polynorm: {package}")
    mode = ", each op a one-call CUDA graph's replay, the floors eager" if args.graph else ""
    print(f"# timing: do_bench median, warmup {args.warmup:g} ms, rep {args.rep:g} ms{mode}")
    if args.warm_only:
        print("# warm-only: every op called once per row, nothing timed")
    else:
        print(f"# plan: {len(dtypes) * len(rows) * len(ops)} rows, {n_bench} do_bench calls, about {estimate:.0f} s")
        print(header(), flush=True)
    t0 = time.perf_counter()
    timer = Timer(args.warmup, args.rep, args.graph)
    torch.manual_seed(0)
    weight = torch.tensor([0.3, -0.4, 0.9], device=DEVICE)
    bias = torch.tensor([0.1], device=DEVICE)
    for dtype_name in dtypes:
        for shape in rows:
            lines = time_shape(timer, shape, dtype_name, ops, triton, weight, bias, warm_only=args.warm_only)
            if not args.warm_only:
                print("\n".join(lines), flush=True)
    print(f"# wall: {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
