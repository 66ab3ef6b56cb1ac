"""The seed shapes (M = 2048) timed two ways (twentieth session, call 1; the committed table, no
patch): each op called eagerly, as bench/ops_timing.py does, and as the replay of a CUDA graph
that holds that one call. Both are medians of triton.testing.do_bench (L2 flushed before each
call). If the host's cost of a call leaks into the eager figure (the flush kernel no longer hides
it), the eager ratio reads above the graph's; if the two agree, the seed shapes' ratios are the
kernels' own. torch's rms_norm (one reduction a row, torch's own kernel) is a second reduction
kernel beside ours, over the same floors.

Columns: the floors in microseconds (copy: read 1 write 1; add: read 2 write 1; add+copy: read
3 write 2), then each op over its floor, eager / graph: PolyNorm forward (copy), backward (add),
the fused forward (add), backward (add+copy), rms_norm forward (copy).

    python3 bench/results/h200-2026-12-03c/exp_small.py
"""

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import polynorm  # noqa: F401


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def graphed(fn):
    """A CUDA graph of one call of fn (its outputs in the graph's pool); returns its replay."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def both(fn) -> tuple[float, float]:
    return bench(fn), bench(graphed(fn))


def main() -> None:
    w = torch.tensor([0.3, -0.5, 0.8], device="cuda")
    b = torch.tensor([0.1], device="cuda")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16; eager / graph")
    print(f"{'M':>6} {'H':>6} {'copy':>11} {'add':>11} {'add+copy':>11} {'fwd':>11} {'bwd':>11} "
          f"{'mfwd':>11} {'mbwd':>11} {'rms':>11}")
    for M, H in ((2048, 1024), (2048, 2048), (2048, 4096), (2048, 8192), (2048, 16384), (16384, 4096)):
        x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
        g, mul = torch.randn_like(x), torch.randn_like(x)
        out, out2 = torch.empty_like(x), torch.empty_like(x)
        rw = torch.randn(H, device="cuda", dtype=torch.bfloat16)
        copy = both(lambda: out.copy_(x))
        add = both(lambda: torch.add(x, g, out=out2))
        add_copy = (add[0] + copy[0], add[1] + copy[1])
        _, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
        _, mrstd = torch.ops.polynorm.mul_forward(x, mul, w, b, 1e-6)
        ops = [
            (both(lambda: torch.ops.polynorm.forward(x, w, b, 1e-6)), copy),
            (both(lambda: torch.ops.polynorm.backward(g, x, w, rstd)), add),
            (both(lambda: torch.ops.polynorm.mul_forward(x, mul, w, b, 1e-6)), add),
            (both(lambda: torch.ops.polynorm.mul_backward(g, x, mul, w, b, mrstd)), add_copy),
            (both(lambda: F.rms_norm(x, (H,), rw, 1e-6)), copy),
        ]
        floors = " ".join(f"{e * 1e3:5.1f}/{gr * 1e3:5.1f}" for e, gr in (copy, add, add_copy))
        ratios = " ".join(f"{t[0] / f[0]:5.2f}/{t[1] / f[1]:5.2f}" for t, f in ops)
        print(f"{M:>6} {H:>6} {floors} {ratios}", flush=True)


if __name__ == "__main__":
    main()
