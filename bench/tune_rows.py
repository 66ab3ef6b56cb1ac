"""The row kernels' tunings side by side, kernel-only, on a CUDA device (issues 13 and 15).

``torch.ops.polynorm._tune_rows(grid_waves, same_phase, ...)`` sets the grid of every row launch
(``w1``: persistent, as many blocks as fit once; ``w0``: a block per R rows; ``w2``: at most two
blocks per resident slot; the table's by default) and whether odd-H rows take the same-phase
path (``sp0``: without it). This script times
``torch.ops.polynorm.forward``/``backward`` (``--op poly_norm``) or ``mul_forward``/``mul_backward``
(``--op poly_norm_mul``) under each at M·H = 2^26 (bf16 by default) as ratios to floors timed
in the same run (medians of ``triton.testing.do_bench``): PolyNorm's forward over a copy and
backward over an add of the same bytes; the fused forward over an add (read two, write one)
and backward over an add plus a copy (read three, write two). Rows: aligned, odd H, and a view
that starts one element into its buffer (``mis``, unless ``--aligned-only``). Each variant's
output is checked against the float64 oracle on its first rows (``err``: the largest error
over the output dtype's rounding floor); every variant's backward gives the table's grad_x
bitwise (``err`` is inf otherwise) and its dW and dB within a few fp32 roundings. ``--no-trim``:
half-idle odd rows without their pack fewer (columns ``*-nt``; csrc/launch_plan.h ``row_packs``).
``--cluster8``: clusters of at most 8 CTAs, the portable size (columns ``*-k8``: the rows the table
puts on 16 then take the tiled kernels). ``--stagger N ...``: row grids started in four
quarters N clock cycles apart (a persistent grid all of it, a block per R rows its first wave;
columns ``*-s<N>``; ``-s0``: never staggered). ``--policy N ...``: rows of clusters launched with
cluster scheduling policy preference N (columns ``*-p<N>``: 0 the default, 1 spread, 2 load
balancing; csrc/launch_plan.h, row_cluster_policy). ``--stage N ...``: the fused backward's aligned rows
of clusters staged a row ahead (1) or not (0) (columns ``*-st<N>``; csrc/launch_plan.h, row_staged). ``--apart N ...``:
the backward's dW / dB partials summed by the row kernel's last block (0) or by a kernel of their
own (1), on the grid that choice takes (columns ``b-a<N>``), and apart on a persistent grid and on a
block per R rows too (``bw1-a1``, ``bw0-a1``; csrc/launch_plan.h, row_sum_apart). ``--narrow``: PolyNorm's forward of 2-byte rows
of whole packs at the narrow build's 8 packs a thread (column ``f-n8``; csrc/launch_plan.h, row_packs). ``--regs N ...``:
PolyNorm's aligned forward of the wide build (2- and 4-byte dtypes) on a build capped at N registers a thread, 96 or
80 (columns ``f-r<N>``; csrc/cuda/args.cuh, row_cap_threads), the table's bits. ``--no-tail``: the fused
backward's odd rows on the plans of before the thirtieth session, a slot for their partial pack, not fewer lanes
and the elements past their whole packs on the last lane (columns ``*-t0``; csrc/launch_plan.h, row_tail_plan).

    python3 bench/tune_rows.py [--op poly_norm_mul] [--dtype bfloat16] [--H 512 4096 ...] [--cta 128 64]
        [--table-only] [--aligned-only] [--no-trim] [--cluster8] [--stagger N ...] [--policy N ...] [--persistent] [--apart N ...]
        [--stage N ...] [--narrow] [--regs N ...] [--no-tail]
"""

import argparse

import torch
from triton.testing import do_bench

import polynorm  # noqa: F401  (registers torch.ops.polynorm.*)
from polynorm.reference import poly_norm as reference

DEFAULT_H = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 3000, 4097, 5125, 16385)
# Column name: _tune_rows keywords (forward, backward); {} is the table's.
POLY_NORM = {"f": {}, "fw0": {"grid_waves": 0}, "fw1": {"grid_waves": 1}, "fw2": {"grid_waves": 2}}
POLY_NORM_BWD = {"b": {}, "bw0": {"grid_waves": 0}, "bw2": {"grid_waves": 2}, "bw4": {"grid_waves": 4}}
MUL = {"mf": {}, "mfw0": {"grid_waves": 0}, "mfw1": {"grid_waves": 1}}
MUL_BWD = {"mb": {}, "mbw0": {"grid_waves": 0}, "mbw2": {"grid_waves": 2}}


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def worst_error(y: torch.Tensor, x: torch.Tensor, weight, bias, mul=None) -> float:
    """Largest |y - oracle| over the first rows, in units of the output dtype's half-ulp at 1."""
    rows = x[:64].double()
    ref = reference(rows, weight.double(), bias.double(), 1e-6)
    if mul is not None:
        ref = ref * mul[:64].double()
    floor = torch.finfo(y.dtype).eps / 2 * ref.abs().clamp_min(1.0)
    return float(((y[:64].double() - ref).abs() / floor).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--op", default="poly_norm", choices=["poly_norm", "poly_norm_mul"])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--H", type=int, nargs="*", default=list(DEFAULT_H))
    parser.add_argument("--elements", type=int, default=2**26, help="M·H of each shape")
    parser.add_argument("--aligned-only", action="store_true", help="skip the view that starts one element in")
    parser.add_argument("--cta", type=int, nargs="*", default=[],
                        help="also time rows split past this many threads a CTA (_tune_rows' cta_threads): columns "
                        "c<N>; their outputs are another reduction tree's, so err then also holds their largest "
                        "difference from the table's, relative to its largest value, in the dtype's eps")
    parser.add_argument("--table-only", action="store_true", help="only the table's grid (and --cta columns)")
    parser.add_argument("--no-trim", action="store_true", help="also without row_packs' pack fewer")
    parser.add_argument("--cluster8", action="store_true", help="also with clusters of at most 8 CTAs")
    parser.add_argument("--stagger", type=int, nargs="*", default=[],
                        help="also with row grids (persistent: all of it; a block per R rows: its first wave) "
                        "started in four quarters this many clock cycles apart (_tune_rows' stagger; 0: never "
                        "staggered): columns *-s<N>, the same bits as the table's; "
                        "with --persistent, also the forward on a persistent grid everywhere (columns *fw1-s<N>)")
    parser.add_argument("--policy", type=int, nargs="*", default=[], choices=[0, 1, 2],
                        help="also rows of clusters under this cluster scheduling policy preference (columns *-p<N>: "
                             "0 the default, 1 spread, 2 load balancing)")
    parser.add_argument("--persistent", action="store_true",
                        help="the forward also on a persistent grid (grid_waves 1: column fw1 / mfw1), and with "
                        "--stagger N staggered (fw1-s<N>): the table's forward runs one-CTA rows a block per R rows; "
                        "the backward is persistent in the table")
    parser.add_argument("--apart", type=int, nargs="*", default=[], choices=[0, 1],
                        help="also with the backward's partials summed by the last block (0) or apart (1): "
                        "columns b-a<N> (the grid that choice takes), bw1-a1 / bw0-a1 (persistent / a block per "
                        "R rows, apart)")
    parser.add_argument("--stage", type=int, nargs="*", default=[], choices=[0, 1],
                        help="also with the fused backward's aligned rows of clusters staged a row ahead (1) or not "
                        "(0) (_tune_rows' stage_rows; csrc/launch_plan.h, row_staged): columns mb-st<N> with --op "
                        "poly_norm_mul (PolyNorm's backward is never staged: its b-st<N> columns are the table's), the "
                        "same bits as the table's")
    parser.add_argument("--narrow", action="store_true",
                        help="also PolyNorm's forward of 2-byte rows of whole packs on the narrow build (8 packs a thread; "
                        "_tune_rows' narrow_forward): column f-n8, another reduction tree")
    parser.add_argument("--regs", type=int, nargs="*", default=[], choices=[96, 80],
                        help="also PolyNorm's aligned forward of the wide build capped at N registers a thread "
                        "(_tune_rows' forward_regs): columns f-r<N>, the same bits as the table's")
    parser.add_argument("--no-tail", action="store_true",
                        help="also the fused backward's odd rows without their tail plans (_tune_rows' tail_rows=False; "
                        "csrc/launch_plan.h, row_tail_plan): columns *-t0 (the forward's are the table's)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    fused = args.op == "poly_norm_mul"
    fwd_variants, bwd_variants = (dict(MUL), dict(MUL_BWD)) if fused else (dict(POLY_NORM), dict(POLY_NORM_BWD))
    if args.table_only:
        fwd_variants = {k: v for k, v in fwd_variants.items() if not v}
        bwd_variants = {k: v for k, v in bwd_variants.items() if not v}
    for cta in args.cta:
        fwd_variants[f"{'mf' if fused else 'f'}-c{cta}"] = {"cta_threads": cta}
        bwd_variants[f"{'mb' if fused else 'b'}-c{cta}"] = {"cta_threads": cta}
    f, b = ("mf", "mb") if fused else ("f", "b")
    extra = (({"nt": {"trim_packs": False}} if args.no_trim else {}) | ({"k8": {"max_cluster": 8}} if args.cluster8 else {})
             | ({"t0": {"tail_rows": False}} if args.no_tail else {}))
    for name, kw in extra.items():
        fwd_variants[f"{f}-{name}"] = kw
        bwd_variants[f"{b}-{name}"] = kw
    if args.narrow and not fused:
        fwd_variants["f-n8"] = {"narrow_forward": True}
    for n in args.regs if not fused else []:
        fwd_variants[f"f-r{n}"] = {"forward_regs": n}
    for n in args.stagger:
        fwd_variants[f"{f}-s{n}"] = {"stagger": n}
        bwd_variants[f"{b}-s{n}"] = {"stagger": n}
    for n in args.policy:
        fwd_variants[f"{f}-p{n}"] = {"cluster_policy": n}
        bwd_variants[f"{b}-p{n}"] = {"cluster_policy": n}
    for n in args.apart:
        bwd_variants[f"{b}-a{n}"] = {"sum_apart": n}
        if n > 0:
            bwd_variants[f"{b}w1-a{n}"] = {"grid_waves": 1, "sum_apart": n}
            bwd_variants[f"{b}w0-a{n}"] = {"grid_waves": 0, "sum_apart": n}
    for n in args.stage:
        bwd_variants[f"{b}-st{n}"] = {"stage_rows": n}
    if args.persistent:
        fwd_variants[f"{f}w1"] = {"grid_waves": 1}
        for n in args.stagger:
            fwd_variants[f"{f}w1-s{n}"] = {"grid_waves": 1, "stagger": n}
    torch.manual_seed(0)
    weight = torch.tensor([0.3, -0.4, 0.9], device="cuda")
    bias = torch.tensor([0.1], device="cuda")
    floors = "add, add+copy" if fused else "copy, add"
    sp0 = not fused and not args.table_only  # the same-phase path off, as its own columns
    cols = list(fwd_variants) + list(bwd_variants) + (["f-sp0", "b-sp0"] if sp0 else [])
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.op}, {args.dtype}, "
          f"M*H = {args.elements}; forward and backward over the same-run floors ({floors}), medians of "
          "do_bench; err: worst error of any variant over the rounding floor, or of its backward against the table's")
    print("| H | layout | floor fwd us | floor bwd us | " + " | ".join(cols) + " | err |")
    print("|" + "---|" * (5 + len(cols)))
    tune = torch.ops.polynorm._tune_rows
    try:
        for H in args.H:
            M = max(1, args.elements // H)
            buf = torch.randn(M * H + 8, device="cuda", dtype=dtype)
            layouts = [("aligned", buf[: M * H].view(M, H))]
            whole_packs = H * torch.finfo(dtype).bits // 8 % 16 == 0
            if whole_packs and not args.aligned_only:
                layouts.append(("mis", buf[1 : 1 + M * H].view(M, H)))
            for name, x in layouts:
                g = torch.randn(M, H, device="cuda", dtype=dtype)
                mul = torch.randn(M, H, device="cuda", dtype=dtype) if fused else None
                out = torch.empty(M, H, device="cuda", dtype=dtype)
                out2 = torch.empty(M, H, device="cuda", dtype=dtype)
                t_copy = bench(lambda: out.copy_(x))
                t_add = bench(lambda: torch.add(x, g, out=out))
                if fused:
                    t_fwd_floor, t_bwd_floor = t_add, t_add + bench(lambda: out2.copy_(x))
                    forward = lambda: torch.ops.polynorm.mul_forward(x, mul, weight, bias, 1e-6)  # noqa: E731
                else:
                    t_fwd_floor, t_bwd_floor = t_copy, t_add
                    forward = lambda: torch.ops.polynorm.forward(x, weight, bias, 1e-6)  # noqa: E731
                cells, err = [], 0.0
                y_ref = None
                for kw in fwd_variants.values():
                    tune(**kw)
                    y, _ = forward()
                    err = max(err, worst_error(y, x, weight, bias, mul))
                    if y_ref is None:
                        y_ref = y
                    elif (set(kw) <= {"grid_waves", "stagger", "stage_rows", "cluster_policy", "forward_regs"}
                          and not torch.equal(y, y_ref)):
                        err = float("inf")  # the grid, a start's delay, the stages or a register cap never change a bit
                    cells.append(f"{bench(forward) / t_fwd_floor:.3f}")
                tune()
                _, rstd = forward()
                if fused:
                    backward = lambda: torch.ops.polynorm.mul_backward(g, x, mul, weight, bias, rstd)  # noqa: E731
                else:
                    backward = lambda: torch.ops.polynorm.backward(g, x, weight, rstd)  # noqa: E731
                ref = None
                for kw in bwd_variants.values():
                    tune(**kw)
                    grads = backward()
                    if ref is None:
                        ref = grads
                    elif {"cta_threads", "max_cluster", "trim_packs", "tail_rows"} & set(kw):  # another split: another tree
                        for got, exp in zip(grads, ref):
                            rel = float((got.float() - exp.float()).abs().max() / exp.float().abs().max().clamp_min(1e-30))
                            err = max(err, rel / torch.finfo(exp.dtype).eps)
                    elif set(kw) in ({"stagger"}, {"stage_rows"}):  # a start's delay, or the stages: never a bit
                        if not all(torch.equal(got, exp) for got, exp in zip(grads, ref)):
                            err = float("inf")
                    elif not torch.equal(grads[0], ref[0]):  # the grid never changes a row's bits
                        err = float("inf")
                    else:  # dW and dB: the grid's partials, another summation order
                        for got, exp in zip(grads[-2:], ref[-2:]):
                            rel = float((got - exp).abs().max() / exp.abs().max().clamp_min(1e-30))
                            err = max(err, rel / torch.finfo(exp.dtype).eps)
                    cells.append(f"{bench(backward) / t_bwd_floor:.3f}")
                tune()
                if sp0:
                    # Without the same-phase path (odd H only: elsewhere it is not taken).
                    if not whole_packs:
                        tune(same_phase=False)
                        y0, _ = forward()
                        dx0 = backward()[0]
                        tune()
                        y1, _ = forward()
                        dx1 = backward()[0]
                        if not (torch.equal(y0, y1) and torch.equal(dx0, dx1)):
                            err = float("inf")  # the same-phase path must give the other path's bits
                        tune(same_phase=False)
                        cells.append(f"{bench(forward) / t_fwd_floor:.3f}")
                        cells.append(f"{bench(backward) / t_bwd_floor:.3f}")
                    else:
                        cells += ["-", "-"]
                    tune()
                print(f"| {H} | {name} | {t_fwd_floor * 1e3:.1f} | {t_bwd_floor * 1e3:.1f} | " + " | ".join(cells)
                      + f" | {err:.2f} |", flush=True)
    finally:
        tune()


if __name__ == "__main__":
    main()
