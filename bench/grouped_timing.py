#!/usr/bin/env python3
"""Grouped PolyNorm (mixture of experts) against a loop over experts, as ratios to same-run floors.

PolyNorm (Zhuo et al., "Polynomial Composition Activations",
arXiv:2411.03884) with one ``[w0, w1, w2, b]`` per expert, rows sorted by expert (expert e
owns rows ``[offsets[e-1], offsets[e])``).

Inputs, for each shape (M rows in total, hidden size H) and each E: x and grad_y ``(M, H)``
randn in bf16; weight ``[E, 3]`` fp32 near ``[0.3, -0.4, 0.9]``, bias ``[E]`` fp32 near 0;
uneven group sizes drawn with a fixed seed (log-normal shares, about one expert in eight
empty, at least one), summing to M; offsets int64 on the device.

Providers, each timed on its ops directly (no autograd), forward and backward apart:

- ``grouped``: ``torch.ops.polynorm.grouped_forward`` / ``grouped_backward`` (the CUDA kernels
  on a GPU; the C++ kernels on the CPU, ``--smoke``);
- ``grouped_triton``: ``grouped_forward_triton`` / ``grouped_backward_triton`` (CPU tensors
  only under ``TRITON_INTERPRET=1``; skipped with the reason otherwise);
- ``loop``: a Python loop over the non-empty experts calling the single-expert op
  ``torch.ops.polynorm.forward`` / ``backward`` on each expert's rows (a view) with its
  parameters. Its row views, the rstd slices and the group sizes on the host are made before
  timing, and the per-expert outputs are not gathered into one tensor: a lower bound on a
  real loop, which must also copy the group sizes to the host (a synchronisation) each step;
- ``loop_triton``: the same loop over ``forward_triton`` / ``backward_triton``.

The loop is what a PolyNorm without a grouped kernel (eager, torch.compile, Liger) does for E
experts: one single-expert call per expert. ``loop`` runs it with polynorm's own single-expert
kernel, the fastest of them, so it is the strongest such baseline (the JSON's
``anchors_approach`` field names it).

Floors, timed at each shape and E right before the providers (``bench.py``'s
:func:`floor_fns`, same bytes as the op): forward, a copy of x (read M*H, write M*H);
backward, ``torch.add`` of x and grad_y (read two, write one). Ratio = time / floor.

The single-expert kernel's own ratios at the same M*H (``torch.ops.polynorm.forward`` /
``backward`` on all M rows with one expert's parameters) are in the same table. The target is
that the grouped op stays within 1.15x of them, so the column ``/single`` (a provider's ratio
over the single-expert kernel's, = its time over the single-expert kernel's time) is what to
read against 1.15, and ``ok`` says whether ``grouped`` holds it.

Times are medians of ``triton.testing.do_bench`` (which flushes L2 before each call) on a
GPU; ``--smoke`` runs tiny CPU tensors with ``torch.utils.benchmark`` and few repetitions
(the ratios mean nothing there; the code paths run, and each provider is checked against
``grouped`` first, as on a GPU).

Usage::

    python3 bench/grouped_timing.py --out out/grouped_timing.json                  # H200, ~1 min
    python3 bench/grouped_timing.py --smoke --out /tmp/grouped_smoke.json            # CPU smoke test
"""

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import torch

from bench import FLOOR_ADD, FLOOR_COPY, floor_fns, time_ms  # bench/bench.py (imports polynorm)

# (M, H): M*H = 2^26 at two hidden sizes, and the seed shape (M = 2048 rows in all, H = 4096).
SHAPES = [(2**26 // 1024, 1024), (2**26 // 4096, 4096), (2048, 4096)]
SMOKE_SHAPES = [(64, 33)]  # odd H; with E = 64, most experts empty
EXPERTS = (8, 64)
EPS = 1e-6
TARGET = 1.15  # the grouped op's floor ratio over the single-expert kernel's that passes (the ``ok`` column)
GROUPED, GROUPED_TRITON, LOOP, LOOP_TRITON = "grouped", "grouped_triton", "loop", "loop_triton"
PROVIDERS = (GROUPED, GROUPED_TRITON, LOOP, LOOP_TRITON)
# Each provider's (forward, backward) ops under torch.ops.polynorm.
OP_NAMES = {
    GROUPED: ("grouped_forward", "grouped_backward"),
    GROUPED_TRITON: ("grouped_forward_triton", "grouped_backward_triton"),
    LOOP: ("forward", "backward"),
    LOOP_TRITON: ("forward_triton", "backward_triton"),
}


def uneven_counts(M: int, E: int, gen: torch.Generator) -> list[int]:
    """M rows over E experts: log-normal shares (sigma 1), about one expert in eight with none
    (at least one), the rest drawn by a multinomial; sums to M."""
    shares = torch.exp(torch.randn(E, generator=gen, dtype=torch.float64))
    empty = torch.randperm(E, generator=gen)[: max(1, E // 8)]
    shares[empty] = 0.0
    rows = torch.multinomial(shares, M, replacement=True, generator=gen)
    return torch.bincount(rows, minlength=E).tolist()


def make_case(M: int, H: int, E: int, device: torch.device, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    counts = uneven_counts(M, E, gen)
    x = torch.randn(M, H, generator=gen).to(torch.bfloat16).to(device)
    g = torch.randn(M, H, generator=gen).to(torch.bfloat16).to(device)
    w = (torch.tensor([0.3, -0.4, 0.9]) + 0.1 * torch.randn(E, 3, generator=gen)).to(device)
    b = (0.1 * torch.randn(E, generator=gen)).to(device)
    offsets = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(device)
    return {"counts": counts, "x": x, "g": g, "w": w, "b": b, "offsets": offsets}


def provider_fns(name: str, case: dict):
    """(forward, backward, outputs) for a provider: forward() and backward() run its ops;
    outputs() returns (y, grad_x) over all M rows and (grad_weight [E, 3], grad_bias [E]),
    for the check against ``grouped``. Raises if the provider's ops are missing or cannot run."""
    ops = torch.ops.polynorm
    fwd, bwd = (getattr(ops, op) for op in OP_NAMES[name])  # AttributeError: not registered here
    x, g, w, b, offsets = case["x"], case["g"], case["w"], case["b"], case["offsets"]
    if name in (GROUPED, GROUPED_TRITON):
        _, rstd = fwd(x, w, b, offsets, EPS)

        def outputs():
            y, rstd_ = fwd(x, w, b, offsets, EPS)
            dx, dw, db = bwd(g, x, w, offsets, rstd_)
            return y, dx, dw, db

        return (lambda: fwd(x, w, b, offsets, EPS)), (lambda: bwd(g, x, w, offsets, rstd)), outputs
    # The loop: views of each non-empty expert's rows and its parameters, made before timing.
    experts, start = [], 0
    for e, n in enumerate(case["counts"]):
        if n:
            experts.append((e, x[start : start + n], g[start : start + n], w[e], b[e : e + 1]))
        start += n
    rstds = [fwd(xe, we, be, EPS)[1] for _, xe, _, we, be in experts]

    def forward():
        for _, xe, _, we, be in experts:
            fwd(xe, we, be, EPS)

    def backward():
        for (_, xe, ge, we, _), rstd in zip(experts, rstds):
            bwd(ge, xe, we, rstd)

    def outputs():
        y, dx = torch.zeros_like(x), torch.zeros_like(x)
        dw, db = torch.zeros_like(w), torch.zeros_like(b)
        start = 0
        for e, n in enumerate(case["counts"]):
            if n:
                y[start : start + n], rstd = fwd(x[start : start + n], w[e], b[e : e + 1], EPS)
                dx[start : start + n], dw[e], db_e = bwd(g[start : start + n], x[start : start + n], w[e], rstd)
                db[e] = db_e[0]
            start += n
        return y, dx, dw, db

    return forward, backward, outputs


def check_same(name: str, got, expected) -> None:
    """A provider computes what ``grouped`` does: y and grad_x within two bf16 roundings (the
    kernels round once, in other orders), grad_weight and grad_bias (fp32 sums in other orders)
    within 1e-3 relative. The tests do the exact checks; this catches a broken provider."""
    for what, a, e in zip(("y", "grad_x", "grad_weight", "grad_bias"), got, expected):
        if what in ("y", "grad_x"):
            torch.testing.assert_close(a.float(), e.float(), rtol=2**-7, atol=2**-7, msg=lambda m: f"{name} {what}: {m}")
        else:
            torch.testing.assert_close(a, e, rtol=1e-3, atol=1e-3 * e.abs().max().item(), msg=lambda m: f"{name} {what}: {m}")


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def run_case(M: int, H: int, E: int, device: torch.device, args) -> tuple[list[dict], dict]:
    """Records (one per direction and provider, the floors' and the single-expert kernel's
    figures in each) and the providers skipped here, with why."""
    case = make_case(M, H, E, device, seed=args.seed + 1000 * E + H)
    timing = {"device": device, "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms}

    def median(fn):
        return time_ms(fn, **timing)[0]

    floors = floor_fns(case["x"], case["g"])
    floor_ms = {"forward": median(floors[FLOOR_COPY]), "backward": median(floors[FLOOR_ADD])}
    # The single-expert kernel at the same M*H: every row with expert 0's parameters.
    x, g, w0, b0 = case["x"], case["g"], case["w"][0], case["b"][0:1]
    _, rstd = torch.ops.polynorm.forward(x, w0, b0, EPS)
    single_ms = {
        "forward": median(lambda: torch.ops.polynorm.forward(x, w0, b0, EPS)),
        "backward": median(lambda: torch.ops.polynorm.backward(g, x, w0, rstd)),
    }
    expected = provider_fns(GROUPED, case)[2]()
    records, skipped = [], {}
    for name in args.providers:
        try:
            forward, backward, outputs = provider_fns(name, case)
            check_same(name, outputs(), expected)
        except (AttributeError, NotImplementedError, RuntimeError) as error:  # not built, or no Triton here
            skipped[name] = first_line(error)
            continue
        for direction, fn in (("forward", forward), ("backward", backward)):
            ms = median(fn)
            ratio = ms / floor_ms[direction]
            single_ratio = single_ms[direction] / floor_ms[direction]
            records.append({
                "M": M, "H": H, "E": E, "empty_experts": case["counts"].count(0), "counts": case["counts"],
                "direction": direction, "provider": name, "ms": ms,
                "floor": "copy" if direction == "forward" else "add", "floor_ms": floor_ms[direction],
                "ratio": ratio, "single_ms": single_ms[direction], "single_ratio": single_ratio,
                "vs_single": ratio / single_ratio,
                "within_target": ratio <= TARGET * single_ratio if name in (GROUPED, GROUPED_TRITON) else None,
            })  # fmt: skip
    return records, skipped


def table(records: list[dict], providers: list[str]) -> str:
    """One row per shape, E and direction: the floor, the single-expert kernel's ratio, then each
    provider's ratio and its ratio over the single-expert kernel's (``/single``); ``ok``:
    ``grouped`` within 1.15x of the single-expert ratio."""
    head = ["M", "H", "E", "empty", "dir", "floor us", "single x"]
    for name in providers:
        head += [f"{name} x", "/single"]
    head.append("ok")
    rows = {}
    for r in records:
        rows.setdefault((r["M"], r["H"], r["E"], r["direction"]), {})[r["provider"]] = r
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (M, H, E, direction), by_provider in rows.items():
        any_r = next(iter(by_provider.values()))
        cells = [str(M), str(H), str(E), str(any_r["empty_experts"]), direction,
                 f"{any_r['floor_ms'] * 1e3:.1f}", f"{any_r['single_ratio']:.2f}"]  # fmt: skip
        for name in providers:
            r = by_provider.get(name)
            cells += [f"{r['ratio']:.2f}", f"{r['vs_single']:.2f}"] if r else ["-", "-"]
        grouped = by_provider.get(GROUPED)
        cells.append(("yes" if grouped["within_target"] else "NO") if grouped else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _shape(text: str) -> tuple[int, int]:
    try:
        M, H = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MxH, e.g. 2048x4096, got {text!r}") from None
    if M < 1 or H < 1:
        raise argparse.ArgumentTypeError(f"M and H must be positive, got {text!r}")
    return M, H


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Method: see the module docstring.")
    parser.add_argument("--smoke", action="store_true", help="tiny CPU tensors, few repetitions: the code paths only")
    parser.add_argument("--experts", type=int, nargs="+", default=list(EXPERTS), help="values of E (default 8 64)")
    parser.add_argument("--providers", nargs="+", choices=PROVIDERS, default=list(PROVIDERS))
    parser.add_argument("--seed", type=int, default=0, help="seed of the group sizes and inputs")
    parser.add_argument("--shapes", nargs="+", metavar="MxH", type=_shape,
                        help="(M, H) shapes on a GPU, e.g. 2048x4096 (default: " + " ".join(f"{m}x{h}" for m, h in SHAPES) + ")")
    parser.add_argument("--out", type=Path, help="write the records as JSON to this file")
    args = parser.parse_args(argv)
    args.warmup_ms, args.rep_ms = (1.0, 5.0) if args.smoke else (25.0, 100.0)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        device, shapes = torch.device("cpu"), SMOKE_SHAPES
    elif torch.cuda.is_available():
        device, shapes = torch.device("cuda"), args.shapes or SHAPES
    else:
        print("grouped_timing: expected a CUDA device (or --smoke for the CPU smoke test), found none", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    print(f"grouped_timing on {name}: torch {torch.__version__}, triton {triton_version}, bf16, eps {EPS}")
    records, skipped = [], {}
    for M, H in shapes:
        for E in args.experts:
            rows, why = run_case(M, H, E, device, args)
            records += rows
            for provider, reason in why.items():
                skipped.setdefault(provider, reason)
            print(f"M={M} H={H} E={E}: {len(rows)} timings", flush=True)
    print(table(records, [p for p in args.providers if p not in skipped]))
    for provider, reason in skipped.items():
        print(f"skipped {provider}: {reason}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "device": name, "torch": torch.__version__, "triton": triton_version, "dtype": "bfloat16", "eps": EPS,
            "date": datetime.datetime.now().isoformat(timespec="seconds"), "smoke": args.smoke, "seed": args.seed,
            "target_vs_single": TARGET, "timer": "triton.testing.do_bench median" if device.type == "cuda"
            else "torch.utils.benchmark median", "anchors_approach": LOOP,
        }  # fmt: skip
        args.out.write_text(json.dumps({"meta": meta, "records": records, "skipped": skipped}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
