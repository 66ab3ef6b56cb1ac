#!/usr/bin/env python3
"""Is the grouped op's gap to the single-expert kernel at M = 2048 (about 0.15 of the floor in
every run, whatever the kernel change: bench/NOTES.md v11) in the kernel or on the host?

For the single-expert op and the grouped op (E = 8 and 64, grouped_timing.py's inputs) at
M = 2048, H = 4096 (and at 16384 x 4096 for contrast), forward and backward:
- `do_bench`: triton.testing.do_bench's median, as grouped_timing.py times it (L2 flushed before
  each call; the host must launch the op within the flush's ~65 us or the GPU waits in the
  timed window);
- `graph`: the same calls captured in a CUDA graph, 20 of (L2 flush, op), replayed, minus a
  graph of the 20 flushes alone: the GPU time without the host;
- `host`: wall-clock us a call of the op on the host (1000 calls, then a synchronize).
Ratios over a copy (forward) or an add (backward) of the same bytes, timed both ways.
"""
import sys
import time
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/
from grouped_timing import EPS, make_case  # noqa: E402

import polynorm  # noqa: E402,F401

ops = torch.ops.polynorm
FLUSH = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")


def graph_us(fn, n=20, reps=20):
    def capture(with_fn):
        for _ in range(3):
            FLUSH.zero_()
            fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                FLUSH.zero_()
                if with_fn:
                    fn()
        return g

    def timed(g):
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]

    with_fn, flush_only = capture(True), capture(False)
    return (timed(with_fn) - timed(flush_only)) / n * 1e3


def host_us(fn, n=1000):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return us


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| M | H | E | dir | op | do_bench x | graph x | host us/call |")
    print("|---|---|---|---|---|---|---|---|")
    for M, H in ((2048, 4096), (16384, 4096)):
        for E in (8, 64):
            c = make_case(M, H, E, torch.device("cuda"), seed=0)
            x, g, w, b, off = c["x"], c["g"], c["w"], c["b"], c["offsets"]
            y, a = torch.empty_like(x), torch.empty_like(x)
            floors = {"forward": lambda: y.copy_(x), "backward": lambda: torch.add(x, g, out=a)}
            _, rstd1 = ops.forward(x, w[0], b[0:1], EPS)
            _, rstdg = ops.grouped_forward(x, w, b, off, EPS)
            fns = {
                ("forward", "single"): lambda: ops.forward(x, w[0], b[0:1], EPS),
                ("forward", "grouped"): lambda: ops.grouped_forward(x, w, b, off, EPS),
                ("backward", "single"): lambda: ops.backward(g, x, w[0], rstd1),
                ("backward", "grouped"): lambda: ops.grouped_backward(g, x, w, off, rstdg),
            }
            for d in ("forward", "backward"):
                fb = triton.testing.do_bench(floors[d], warmup=25, rep=100, return_mode="median") * 1e3
                fg = graph_us(floors[d])
                for name in ("single", "grouped"):
                    fn = fns[(d, name)]
                    tb = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
                    tg = graph_us(fn)
                    print(f"| {M} | {H} | {E} | {d} | {name} | {tb / fb:.2f} | {tg / fg:.2f} | {host_us(fn):.1f} |",
                          flush=True)
                print(f"| {M} | {H} | {E} | {d} | floor us | {fb:.1f} | {fg:.1f} | {host_us(floors[d]):.1f} |")


if __name__ == "__main__":
    main()
