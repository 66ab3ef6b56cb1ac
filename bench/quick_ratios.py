#!/usr/bin/env python3
"""polynorm's forward and backward time over the same-run floors, against the first-cut targets.

PolyNorm (Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884). For each shape,
at M*H = 2^26 (H = 512 ... 65536 and the odd 5125) and at the seed shapes (M = 2048,
H = 1024 ... 32768), this times the copy and add floors and then the provider's forward and
backward exactly as ``bench.py`` does (``triton.testing.do_bench`` medians, L2 flushed before
each call), and prints one compact table:

- forward / floor_copy, PASS at <= 1.15;
- backward / floor_add, PASS at <= 1.25.

``--op poly_norm_mul`` does the same for the fused PolyNorm x mul (providers ``polynorm_mul``
and ``polynorm_mul_triton``) against its floors and issue 15's targets:

- forward / floor_add (read two, write one), PASS at <= 1.10;
- backward / (floor_add + floor_copy) (read three, write two), PASS at <= 1.15.

Through autograd, a backward costs the CPU about 0.15 ms (H200, torch 2.11), more than
do_bench's L2 flush lets it hide, so at the seed shapes the backward column measures that
cost rather than the kernels. ``--ops`` calls the provider's ops
(``torch.ops.polynorm.forward``/``backward``, or ``forward_triton``/``backward_triton``; for the
fused op ``mul_forward``/``mul_backward`` or their ``_triton`` twins) directly: the kernels alone.

Usage::

    python3 bench/quick_ratios.py                       # polynorm_cuda, bf16, about 20 s on an H200
    python3 bench/quick_ratios.py --ops                 # the kernels alone, without autograd
    python3 bench/quick_ratios.py --provider polynorm_triton
    python3 bench/quick_ratios.py --op poly_norm_mul --ops --provider polynorm_mul_triton
"""

import argparse
import functools
import sys

import torch

from bench import (
    BYTES_MH,
    DTYPES,
    OPS,
    POLY_NORM,
    SEED_H,
    SEED_M,
    check_provider,
    floor_fns,
    make_inputs,
    mode_fn,
    provider_factory,
    time_ms,
)

# time / same-run floor: PolyNorm's first cut, and issue 15's targets for the fused op.
TARGETS = {"poly_norm": {"forward": 1.15, "backward": 1.25}, "poly_norm_mul": {"forward": 1.10, "backward": 1.15}}
BYTES_H = (512, 1024, 2048, 4096, 5125, 8192, 16384, 32768, 65536)
SHAPES = [(BYTES_MH // H, H) for H in BYTES_H] + [(SEED_M, H) for H in SEED_H]
# Each provider's forward and backward ops under torch.ops.polynorm, by --op.
DIRECT_OPS = {
    "poly_norm": {"polynorm_cuda": ("forward", "backward"), "polynorm_triton": ("forward_triton", "backward_triton")},
    "poly_norm_mul": {
        "polynorm_mul": ("mul_forward", "mul_backward"),
        "polynorm_mul_triton": ("mul_forward_triton", "mul_backward_triton"),
    },
}


def op_fns(op: str, provider: str, inputs: tuple, grad, eps: float) -> dict:
    """The provider's forward and backward ops, called directly: no autograd. inputs: bench's
    make_inputs (x, weight, bias), or (x, mul, weight, bias) for the fused op."""
    forward_op, backward_op = (getattr(torch.ops.polynorm, name) for name in DIRECT_OPS[op][provider])
    inputs = tuple(t.detach() for t in inputs)
    _, rstd = forward_op(*inputs, eps)
    if op == "poly_norm":
        x, weight, _ = inputs
        backward_args = (grad, x, weight, rstd)
    else:
        backward_args = (grad, *inputs, rstd)  # grad_out, x, mul, weight, bias, rstd
    return {"forward": lambda: forward_op(*inputs, eps), "backward": lambda: backward_op(*backward_args)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", choices=tuple(DIRECT_OPS), default=POLY_NORM.name, help="poly_norm or poly_norm_mul")
    providers = tuple(p for by_provider in DIRECT_OPS.values() for p in by_provider)
    parser.add_argument("--provider", choices=providers, help="default polynorm_cuda, or polynorm_mul for the fused op")
    parser.add_argument("--ops", action="store_true", help="time the ops directly, without autograd")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    parser.add_argument("--warmup", type=float, default=25, help="do_bench warmup, ms")
    parser.add_argument("--rep", type=float, default=100, help="do_bench rep, ms")
    args = parser.parse_args(argv)
    op, targets = OPS[args.op], TARGETS[args.op]
    args.provider = args.provider or next(iter(DIRECT_OPS[args.op]))
    if args.provider not in DIRECT_OPS[args.op]:
        parser.error(f"--op {args.op} has the providers {', '.join(DIRECT_OPS[args.op])}, not {args.provider}")
    if not torch.cuda.is_available():
        sys.exit("quick_ratios: needs a CUDA device (the floors and targets are GPU bandwidth figures)")
    device, dtype = torch.device("cuda"), DTYPES[args.dtype]
    forward = provider_factory(args.provider, 1e-6, op)()
    warning = check_provider(forward, dtype, device, 1e-6, op)
    if warning:
        print(f"quick_ratios: warning: {args.provider}: {warning}")
    time = functools.partial(time_ms, device=device, warmup_ms=args.warmup, rep_ms=args.rep)

    how = "ops called directly" if args.ops else "through autograd"
    print(
        f"{args.provider} ({how}), {args.dtype}, on {torch.cuda.get_device_name()}: "
        "time / same-run floor, medians in ms"
    )
    print(
        f"targets: forward <= {targets['forward']} x {op.floor_label('forward')}, "
        f"backward <= {targets['backward']} x {op.floor_label('backward')}\n"
    )
    print(
        f"{'M':>7} {'H':>6} | {'fwd ms':>7} {'floor':>7} {'fwd x':>6}      | {'bwd ms':>7} {'floor':>7} {'bwd x':>6}"
    )
    passes = {mode: 0 for mode in targets}
    for M, H in SHAPES:
        inputs, grad = make_inputs(M, H, dtype, device, op=op)
        floor_ms = {name: time(fn)[0] for name, fn in floor_fns(inputs[0], grad).items()}
        floors = {mode: sum(floor_ms[name] for name in op.floors[mode]) for mode in targets}
        ops = op_fns(args.op, args.provider, inputs, grad, 1e-6) if args.ops else None
        cells = []
        for mode, target in targets.items():
            ms = time(ops[mode] if ops else mode_fn(mode, forward, inputs, grad))[0]
            ratio = ms / floors[mode]
            passes[mode] += ratio <= target
            cells.append(f"{ms:7.4f} {floors[mode]:7.4f} {ratio:6.2f} {'PASS' if ratio <= target else 'FAIL'}")
        print(f"{M:7d} {H:6d} | {cells[0]} | {cells[1]}", flush=True)
    print()
    for mode, target in targets.items():
        print(f"{mode}: {passes[mode]}/{len(SHAPES)} shapes at <= {target} x the floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
