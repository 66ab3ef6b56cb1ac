#!/usr/bin/env python3
"""Motif-3's MoE activation (grouped fused-mul PolyNorm with its options) against its floors and baselines.

docs/MATH.md (16)-(26): for a row of expert e,
``out = output_scale * clamp(PolyNorm_e(clamp(x)) * clamp(mul))``, with Motif-3's options
(sigmoid weight, bias clamp 0.5, hidden clamp 1e6, output scale 0.5).

Inputs, for each hidden size H (Motif-3's ``moe_intermediate_size`` 1280, and 2048, 4096) and
each E: ``gate_up`` ``(M, 2H)`` randn in bf16, x and mul its two halves (``chunk``: views, read
in place, as the grouped GEMM leaves them), grad_out ``(M, H)``; weight ``[E, 3]`` and bias
``[E, 1]`` fp32; uneven group sizes (``grouped_timing.uneven_counts``: log-normal shares, about
one expert in eight empty) summing to M; offsets int64 on the device.

Providers, each timed on its ops directly, forward and backward apart:

- ``triton``: ``torch.ops.polynorm.grouped_mul_forward_triton`` / ``grouped_mul_backward_triton``
  (what ``poly_norm_grouped_mul`` runs on CUDA tensors), on the coefficients w~, b~;
- ``fp8`` (forward only): ``grouped_mul_forward_fp8_triton`` with fp32 1 x 128 scales;
- ``loop``: a Python loop over the non-empty experts of polynorm's single-expert fused op
  ``torch.ops.polynorm.mul_forward`` / ``mul_backward`` (no clamps, no output scale: a lower
  bound on a loop that had them), the row views and rstd slices made before timing;
- ``compiled``: ``torch.compile`` of the reference formula
  (``polynorm.reference._poly_norm_grouped_mul`` in fp32), forward, and its compiled backward
  through ``torch.autograd.grad``.

Floors, timed right before the providers at each shape and E: forward, ``torch.add(x, mul)``
into an ``(M, H)`` buffer (read x and mul, write out: the op's bytes); backward, that add plus a
copy of grad_out (read three, write two: the op's bytes). The FP8 forward's floor is its own
bytes (read x and mul, write one byte an element and the scales) at the bandwidth of the
forward floor. Ratio = time / floor. Targets: forward <= 1.10, backward <= 1.15, FP8 forward
<= 1.10; ``triton`` at least 3x faster than ``loop`` and faster than ``compiled``.

Times are medians of ``triton.testing.do_bench`` on a GPU; ``--smoke`` runs tiny CPU tensors
(the C++ kernels stand in for ``triton``; ``fp8`` and ``compiled`` are skipped) to check the code
paths.

Usage::

    python3 bench/moe_timing.py --out out/moe_timing.json            # a GPU, a few minutes
    python3 bench/moe_timing.py --smoke                               # CPU smoke test
"""

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import torch

from bench import first_line, time_ms  # bench/bench.py (imports polynorm)
from grouped_timing import uneven_counts

from polynorm import reference

MOTIF3 = dict(sigmoid_weight=True, bias_clamp=0.5, hidden_clamp=1e6, output_scale=0.5)
ROWS = 8192 * 8  # 8192 tokens, top-8
HIDDEN = (1280, 2048, 4096)
EXPERTS = (8, 64, 384)
SMOKE = dict(rows=96, hidden=(40,), experts=(5,))
EPS = 1e-6
TARGETS = {"forward": 1.10, "backward": 1.15, "fp8": 1.10}
PROVIDERS = ("triton", "fp8", "loop", "compiled")


def make_case(M: int, H: int, E: int, device: torch.device, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    counts = uneven_counts(M, E, gen)
    gate_up = torch.randn(M, 2 * H, generator=gen).to(torch.bfloat16).to(device)
    x, mul = gate_up.chunk(2, dim=-1)
    g = torch.randn(M, H, generator=gen).to(torch.bfloat16).to(device)
    weight = (0.1 * torch.randn(E, 3, generator=gen)).to(device)
    bias = (0.3 * torch.randn(E, 1, generator=gen)).to(device)
    w, b = reference.expert_coefficients(weight, bias, sigmoid_weight=True, bias_clamp=MOTIF3["bias_clamp"])
    offsets = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(device)
    return {"counts": counts, "x": x, "mul": mul, "g": g, "w": w, "b": b, "offsets": offsets}


def provider_fns(name: str, case: dict, device: torch.device):
    """(forward, backward or None, out()) for a provider; raises where it cannot run here."""
    ops = torch.ops.polynorm
    x, mul, g, w, b, offsets = (case[k] for k in ("x", "mul", "g", "w", "b", "offsets"))
    clamp, scale = MOTIF3["hidden_clamp"], MOTIF3["output_scale"]
    if name == "triton":
        fwd, bwd = (
            (ops.grouped_mul_forward_triton, ops.grouped_mul_backward_triton)
            if device.type == "cuda"
            else (ops.grouped_mul_forward, ops.grouped_mul_backward)
        )
        _, rstd = fwd(x, mul, w, b, offsets, EPS, clamp, scale)
        return (
            lambda: fwd(x, mul, w, b, offsets, EPS, clamp, scale),
            lambda: bwd(g, x, mul, w, b, offsets, rstd, clamp, scale),
            lambda: fwd(x, mul, w, b, offsets, EPS, clamp, scale)[0],
        )
    if name == "fp8":
        if device.type != "cuda":
            raise RuntimeError("the FP8 kernel is timed on a GPU only")
        fwd = ops.grouped_mul_forward_fp8_triton
        return (lambda: fwd(x, mul, w, b, offsets, EPS, clamp, scale, "fp32")), None, None
    if name == "loop":
        experts, start = [], 0
        for e, n in enumerate(case["counts"]):
            if n:
                experts.append((x[start : start + n], mul[start : start + n], g[start : start + n], w[e], b[e]))
            start += n
        rstds = [ops.mul_forward(xe, me, we, be, EPS)[1] for xe, me, _, we, be in experts]

        def forward():
            for xe, me, _, we, be in experts:
                ops.mul_forward(xe, me, we, be, EPS)

        def backward():
            for (xe, me, ge, we, be), rstd in zip(experts, rstds):
                ops.mul_backward(ge, xe, me, we, be, rstd)

        return forward, backward, None
    if name == "compiled":
        if device.type != "cuda":
            raise RuntimeError("torch.compile is timed on a GPU only")

        def formula(x, mul, w, b):
            return reference._poly_norm_grouped_mul(x, mul, w, b, offsets, EPS, clamp, scale, torch.float32)

        compiled = torch.compile(formula, fullgraph=True)
        leaves = [t.detach().requires_grad_(True) for t in (x, mul, w, b)]
        out = compiled(*leaves)
        return (
            lambda: compiled(x, mul, w, b),
            lambda: torch.autograd.grad(out, leaves, g, retain_graph=True),
            lambda: compiled(x, mul, w, b),
        )
    raise ValueError(name)


def run_case(M: int, H: int, E: int, device: torch.device, args) -> tuple[list[dict], dict]:
    case = make_case(M, H, E, device, seed=args.seed + 1000 * E + H)
    timing = {"device": device, "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms}

    def median(fn):
        return time_ms(fn, **timing)[0]

    x, mul, g = case["x"], case["mul"], case["g"]
    out_buf, copy_buf = torch.empty(M, H, dtype=x.dtype, device=device), torch.empty_like(g)
    floor_ms = {"forward": median(lambda: torch.add(x, mul, out=out_buf))}
    floor_ms["backward"] = median(lambda: (torch.add(x, mul, out=out_buf), copy_buf.copy_(g)))
    # The FP8 forward's bytes at the forward floor's bandwidth (3 bf16 passes of 2 bytes).
    G = -(-H // 128)
    fp8_bytes = M * H * (2 + 2 + 1) + M * G * 4
    floor_ms["fp8"] = floor_ms["forward"] * fp8_bytes / (M * H * 6)
    expected = provider_fns("triton", case, device)[2]()
    records, skipped = [], {}
    for name in args.providers:
        try:
            forward, backward, out = provider_fns(name, case, device)
            if out is not None:
                torch.testing.assert_close(out().float(), expected.float(), rtol=2**-7, atol=2**-7)
        except (AttributeError, NotImplementedError, RuntimeError, AssertionError) as error:
            skipped[name] = first_line(error)
            continue
        for direction, fn in (("forward", forward), ("backward", backward)):
            if fn is None:
                continue
            floor = "fp8" if name == "fp8" else direction
            ms = median(fn)
            records.append({
                "M": M, "H": H, "E": E, "empty_experts": case["counts"].count(0), "direction": direction,
                "provider": name, "ms": ms, "floor_ms": floor_ms[floor], "ratio": ms / floor_ms[floor],
                "target": TARGETS[floor] if name in ("triton", "fp8") else None,
            })  # fmt: skip
    return records, skipped


def table(records: list[dict], providers: list[str]) -> str:
    """One row per H, E and direction: the floor, each provider's ratio to it, and the triton
    kernel's speed-up over the loop and over torch.compile."""
    head = ["H", "E", "empty", "dir", "floor us"] + [f"{p} x" for p in providers] + ["loop / triton", "compiled / triton"]
    rows = {}
    for r in records:
        rows.setdefault((r["H"], r["E"], r["direction"]), {})[r["provider"]] = r
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (H, E, direction), by in rows.items():
        any_r = by.get("triton") or next(iter(by.values()))
        cells = [str(H), str(E), str(any_r["empty_experts"]), direction, f"{any_r['floor_ms'] * 1e3:.1f}"]
        cells += [f"{by[p]['ratio']:.2f}" if p in by else "-" for p in providers]
        t = by.get("triton")
        for base in ("loop", "compiled"):
            cells.append(f"{by[base]['ms'] / t['ms']:.1f}" if t and base in by else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Method: see the module docstring.")
    parser.add_argument("--smoke", action="store_true", help="tiny CPU tensors, few repetitions: the code paths only")
    parser.add_argument("--rows", type=int, default=ROWS, help=f"M, rows in all (default {ROWS}: 8192 tokens, top-8)")
    parser.add_argument("--hidden", type=int, nargs="+", default=list(HIDDEN), help="values of H (default 1280 2048 4096)")
    parser.add_argument("--experts", type=int, nargs="+", default=list(EXPERTS), help="values of E (default 8 64 384)")
    parser.add_argument("--providers", nargs="+", choices=PROVIDERS, default=list(PROVIDERS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the records as JSON to this file")
    args = parser.parse_args(argv)
    args.warmup_ms, args.rep_ms = (1.0, 5.0) if args.smoke else (25.0, 100.0)
    if args.smoke:
        args.rows, args.hidden, args.experts = SMOKE["rows"], list(SMOKE["hidden"]), list(SMOKE["experts"])
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        print("moe_timing: expected a CUDA device (or --smoke for the CPU smoke test), found none", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    print(f"moe_timing on {name}: torch {torch.__version__}, triton {triton_version}, bf16, M = {args.rows}")
    records, skipped = [], {}
    for H in args.hidden:
        for E in args.experts:
            rows, why = run_case(args.rows, H, E, device, args)
            records += rows
            for provider, reason in why.items():
                skipped.setdefault(provider, reason)
            # Each case as it ends: a run cut short still leaves its finished cases.
            cells = ", ".join(f"{r['provider']} {r['direction']} {r['ratio']:.2f}" for r in rows)
            print(f"H={H} E={E}: x floor: {cells}", flush=True)
    print(table(records, [p for p in args.providers if p not in skipped]))
    for provider, reason in skipped.items():
        print(f"skipped {provider}: {reason}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "device": name, "torch": torch.__version__, "triton": triton_version, "dtype": "bfloat16", "eps": EPS,
            "options": MOTIF3, "rows": args.rows, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "smoke": args.smoke, "seed": args.seed, "targets": TARGETS,
        }  # fmt: skip
        args.out.write_text(json.dumps({"meta": meta, "records": records, "skipped": skipped}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
