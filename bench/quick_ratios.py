#!/usr/bin/env python3
"""polynorm's forward and backward time over the same-run floors, against the first-cut targets.

PolyNorm (Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884). For each shape,
at M*H = 2^26 (H = 512 ... 65536 and the odd 5125) and at the seed shapes (M = 2048,
H = 1024 ... 32768), this times the copy and add floors and then the provider's forward and
backward exactly as ``bench.py`` does (``triton.testing.do_bench`` medians, L2 flushed before
each call), and prints one compact table:

- forward / floor_copy, PASS at <= 1.15;
- backward / floor_add, PASS at <= 1.25.

Through autograd, a backward costs the CPU about 0.15 ms (H200, torch 2.11), more than
do_bench's L2 flush lets it hide, so at the seed shapes the backward column measures that
cost rather than the kernels. ``--ops`` calls the provider's ops
(``torch.ops.polynorm.forward``/``backward``, or ``forward_triton``/``backward_triton``)
directly: the kernels alone.

Usage::

    python3 bench/quick_ratios.py                       # polynorm_cuda, bf16, about 20 s on an H200
    python3 bench/quick_ratios.py --ops                 # the kernels alone, without autograd
    python3 bench/quick_ratios.py --provider polynorm_triton
"""

import argparse
import functools
import sys

import torch

from bench import (
    BYTES_MH,
    DTYPES,
    FLOOR_ADD,
    FLOOR_COPY,
    SEED_H,
    SEED_M,
    check_provider,
    floor_fns,
    make_inputs,
    mode_fn,
    provider_factory,
    time_ms,
)

TARGETS = {"forward": 1.15, "backward": 1.25}  # first cut: time / same-run floor
BYTES_H = (512, 1024, 2048, 4096, 5125, 8192, 16384, 32768, 65536)
SHAPES = [(BYTES_MH // H, H) for H in BYTES_H] + [(SEED_M, H) for H in SEED_H]
OPS = {"polynorm_cuda": ("forward", "backward"), "polynorm_triton": ("forward_triton", "backward_triton")}


def op_fns(provider: str, x, weight, bias, grad_y, eps: float) -> dict:
    """The provider's forward and backward ops, called directly: no autograd."""
    forward_op, backward_op = (getattr(torch.ops.polynorm, name) for name in OPS[provider])
    x, weight, bias = x.detach(), weight.detach(), bias.detach()
    _, rstd = forward_op(x, weight, bias, eps)
    return {
        "forward": lambda: forward_op(x, weight, bias, eps),
        "backward": lambda: backward_op(grad_y, x, weight, rstd),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", default="polynorm_cuda", choices=tuple(OPS))
    parser.add_argument("--ops", action="store_true", help="time the ops directly, without autograd")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    parser.add_argument("--warmup", type=float, default=25, help="do_bench warmup, ms")
    parser.add_argument("--rep", type=float, default=100, help="do_bench rep, ms")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("quick_ratios: needs a CUDA device (the floors and targets are GPU bandwidth figures)")
    device, dtype = torch.device("cuda"), DTYPES[args.dtype]
    forward = provider_factory(args.provider, 1e-6)()
    warning = check_provider(forward, dtype, device, 1e-6)
    if warning:
        print(f"quick_ratios: warning: {args.provider}: {warning}")
    time = functools.partial(time_ms, device=device, warmup_ms=args.warmup, rep_ms=args.rep)

    how = "ops called directly" if args.ops else "through autograd"
    print(
        f"{args.provider} ({how}), {args.dtype}, on {torch.cuda.get_device_name()}: "
        "time / same-run floor, medians in ms"
    )
    print(f"targets: forward <= {TARGETS['forward']} x copy, backward <= {TARGETS['backward']} x add\n")
    print(
        f"{'M':>7} {'H':>6} | {'fwd ms':>7} {'copy ms':>7} {'fwd x':>6}      | {'bwd ms':>7} {'add ms':>7} {'bwd x':>6}"
    )
    passes = {mode: 0 for mode in TARGETS}
    for M, H in SHAPES:
        x, weight, bias, grad_y = make_inputs(M, H, dtype, device)
        floor_fn = floor_fns(x, grad_y)
        floors = {"forward": time(floor_fn[FLOOR_COPY])[0], "backward": time(floor_fn[FLOOR_ADD])[0]}
        ops = op_fns(args.provider, x, weight, bias, grad_y, 1e-6) if args.ops else None
        cells = []
        for mode, target in TARGETS.items():
            ms = time(ops[mode] if ops else mode_fn(mode, forward, x, weight, bias, grad_y))[0]
            ratio = ms / floors[mode]
            passes[mode] += ratio <= target
            cells.append(f"{ms:7.4f} {floors[mode]:7.4f} {ratio:6.2f} {'PASS' if ratio <= target else 'FAIL'}")
        print(f"{M:7d} {H:6d} | {cells[0]} | {cells[1]}", flush=True)
    print()
    for mode, target in TARGETS.items():
        print(f"{mode}: {passes[mode]}/{len(SHAPES)} shapes at <= {target} x the floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
