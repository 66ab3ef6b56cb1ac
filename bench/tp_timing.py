"""The sharded passes of tensor parallelism (polynorm.tp, docs/MATH.md (12)-(15)) timed on one GPU,
beside the unsharded op and the floor of their passes over memory; the collective is not counted.

For each H (the shard's width) at M * H = 2^26 elements (bf16 by default), kernel time only
(the median of triton.testing.do_bench):

- fwd: sharded_forward_stats + sharded_forward_apply: read x twice, write y: 3 passes;
- bwd: sharded_backward_stats + sharded_backward_apply: read x and g twice, write dx: 5 passes;
- mul fwd: the fused op's: read x, then x and mul, write out: 4 passes;
- mul bwd: read grad_out, x and mul twice, write dx and dmul: 8 passes.

The floor of n passes is n / 2 times the time of ``y.copy_(x)`` (one read and one write of
M * H elements) in the same run. ``unsharded`` is polynorm::forward / backward (mul_forward /
mul_backward) on the same rows: fewer passes when a row stays on chip, so below the sharded
floor. Prints a table; ``--log`` also writes it to a file.

    python3 bench/tp_timing.py --backend auto triton --log out/tp_timing.log
"""

import argparse

import torch
import triton
import triton.testing

import polynorm  # noqa: F401  (registers torch.ops.polynorm.*)

PASSES = {"fwd": 3, "bwd": 5, "mul fwd": 4, "mul bwd": 8}


def passes_of(backend: str):
    ops = torch.ops.polynorm
    if backend == "triton":
        from polynorm import triton_sharded  # noqa: F401

        return (ops.sharded_forward_stats_triton, ops.sharded_forward_apply_triton,
                ops.sharded_backward_stats_triton, ops.sharded_backward_apply_triton)  # fmt: skip
    return ops.sharded_forward_stats, ops.sharded_forward_apply, ops.sharded_backward_stats, ops.sharded_backward_apply


def bench(fn, warmup: int, rep: int) -> float:
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e3  # us


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--H", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--elements", type=int, default=2**26, help="M * H")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--backend", nargs="+", default=["auto", "triton"], choices=["auto", "triton"])
    parser.add_argument("--warmup", type=int, default=25)
    parser.add_argument("--rep", type=int, default=100)
    parser.add_argument("--log", default=None)
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    dev = torch.device("cuda")
    ops = torch.ops.polynorm
    lines = [f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  "
             f"{args.dtype}  M*H = {args.elements}  (us, median of do_bench; collective not counted)",
             f"{'backend':8} {'op':8} {'H':>6} {'M':>7} {'sharded':>9} {'floor':>9} {'/floor':>7} {'unsharded':>10}"]  # fmt: skip
    print("\n".join(lines), flush=True)
    worst = {}
    for H in args.H:
        M = args.elements // H
        gen = torch.Generator(device=dev).manual_seed(H)
        x = torch.randn(M, H, device=dev, dtype=dtype, generator=gen)
        mul = torch.randn(M, H, device=dev, dtype=dtype, generator=gen)
        g = torch.randn(M, H, device=dev, dtype=dtype, generator=gen)
        w = torch.tensor([0.7, -0.4, 0.9], device=dev)
        b = torch.tensor([0.1], device=dev)
        y = torch.empty_like(x)
        copy = bench(lambda: y.copy_(x), args.warmup, args.rep)
        _, rstd = ops.forward(x, w, b, 1e-6)
        unsharded = {
            "fwd": bench(lambda: ops.forward(x, w, b, 1e-6), args.warmup, args.rep),
            "bwd": bench(lambda: ops.backward(g, x, w, rstd), args.warmup, args.rep),
            "mul fwd": bench(lambda: ops.mul_forward(x, mul, w, b, 1e-6), args.warmup, args.rep),
            "mul bwd": bench(lambda: ops.mul_backward(g, x, mul, w, b, rstd), args.warmup, args.rep),
        }
        for backend in args.backend:
            fwd_stats, fwd_apply, bwd_stats, bwd_apply = passes_of(backend)
            for name, m in (("", None), ("mul ", mul)):
                sums = fwd_stats(x)
                _, srstd = fwd_apply(x, m, sums, w, b, H, 1e-6)
                gsums = bwd_stats(g, x, m, srstd)[0]
                timings = {
                    f"{name}fwd": bench(lambda: fwd_apply(x, m, fwd_stats(x), w, b, H, 1e-6), args.warmup, args.rep),
                    f"{name}bwd": bench(lambda: (bwd_stats(g, x, m, srstd), bwd_apply(g, x, m, w, b, srstd, gsums, H)),
                                        args.warmup, args.rep),
                }  # fmt: skip
                for op, t in timings.items():
                    floor = copy * PASSES[op] / 2
                    ratio = t / floor
                    worst[(backend, op)] = max(worst.get((backend, op), 0.0), ratio)
                    line = f"{backend:8} {op:8} {H:>6} {M:>7} {t:>9.1f} {floor:>9.1f} {ratio:>7.3f} {unsharded[op]:>10.1f}"
                    lines.append(line)
                    print(line, flush=True)
        del x, mul, g, y
    lines.append("worst /floor: " + ", ".join(f"{b} {op} {r:.3f}" for (b, op), r in sorted(worst.items())))
    print(lines[-1])
    if args.log:
        with open(args.log, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
