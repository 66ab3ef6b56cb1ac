#!/usr/bin/env python3
"""Why torch.compile(mode="reduce-overhead") of the CUDA backend's poly_norm ran at 35x its floor
at M = 2048, H = 1024 and 4.6x at M*H = 2^26 (h200-2026-12-01d/call4/sweep), slower than eager.

Issue 14, target 4. Times one training step (forward and torch.autograd.grad, as bench.py's
polynorm_cuda_reduce_overhead provider does) in several forms, each as the median of
triton.testing.do_bench over a copy + add floor of the same bytes timed here, with the host
time a step (wall clock of 200 steps, then a synchronize), and prints the inductor counters
(cudagraph skips) and a profile of 5 steps of the bench form. layer_norm's step, eager and
under reduce-overhead, is the native baseline. ``--forms``, ``--shapes`` and ``--no-profile``
run a part (tenth session). Diagnostic only.
"""
import argparse
import functools
import time

import torch
import triton.testing
from torch._dynamo.utils import counters

import polynorm

EPS = 1e-6


def inputs(M, H):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    w = torch.tensor([0.3, -0.4, 0.9], device="cuda", requires_grad=True)
    b = torch.zeros(1, device="cuda", requires_grad=True)
    gy = torch.randn(M, H, device="cuda", dtype=torch.bfloat16, generator=g)
    return x, w, b, gy


def floor_ms(x):
    y, a = torch.empty_like(x), torch.empty_like(x)
    copy = triton.testing.do_bench(lambda: y.copy_(x), warmup=25, rep=100, return_mode="median")
    add = triton.testing.do_bench(lambda: torch.add(x, x, out=a), warmup=25, rep=100, return_mode="median")
    return copy + add


def host_us(step, n=200):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        step()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


def forms(M, H):
    torch.compiler.reset()
    x, w, b, gy = inputs(M, H)
    eager = functools.partial(polynorm.poly_norm, eps=EPS, backend="cuda")

    def eager_step():
        return torch.autograd.grad(eager(x, w, b), (x, w, b), gy)

    ro = torch.compile(eager, mode="reduce-overhead", dynamic=False)

    def ro_bench_step():  # bench.py's form
        torch.compiler.cudagraph_mark_step_begin()
        return torch.autograd.grad(ro(x, w, b), (x, w, b), gy)

    def ro_backward_step():  # .backward() into .grad, grads dropped each step
        torch.compiler.cudagraph_mark_step_begin()
        for t in (x, w, b):
            t.grad = None
        ro(x, w, b).backward(gy)

    xs, ws, bs, gys = inputs(M, H)
    for t in (xs, ws, bs, gys):
        torch._dynamo.mark_static_address(t)
    def eager_static(x, w, b):  # a code object of its own: its own dynamo cache entries
        return polynorm.poly_norm(x, w, b, eps=EPS, backend="cuda")

    ro_static = torch.compile(eager_static, mode="reduce-overhead", dynamic=False)

    def ro_static_step():  # inputs at fixed addresses: no copies into the graph's buffers
        torch.compiler.cudagraph_mark_step_begin()
        return torch.autograd.grad(ro_static(xs, ws, bs), (xs, ws, bs), gys)

    # The native baseline: layer_norm (bf16 x, fp32 affine parameters as PolyNorm's), eager and
    # under reduce-overhead, the same step.
    wl = torch.ones(H, device="cuda", requires_grad=True)
    bl = torch.zeros(H, device="cuda", requires_grad=True)

    def layer_norm(t, w_, b_):
        return torch.nn.functional.layer_norm(t, (t.shape[-1],), w_.to(t.dtype), b_.to(t.dtype), EPS)

    ln_ro = torch.compile(layer_norm, mode="reduce-overhead", dynamic=False)

    def ln_eager_step():
        return torch.autograd.grad(layer_norm(x, wl, bl), (x, wl, bl), gy)

    def ln_ro_step():
        torch.compiler.cudagraph_mark_step_begin()
        return torch.autograd.grad(ln_ro(x, wl, bl), (x, wl, bl), gy)

    yield "layer_norm, eager", ln_eager_step
    yield "layer_norm, reduce-overhead", ln_ro_step
    yield "eager", eager_step
    yield "reduce-overhead, static inputs", ro_static_step
    yield "reduce-overhead, autograd.grad (bench)", ro_bench_step
    yield "reduce-overhead, .backward()", ro_backward_step

    torch.compiler.reset()
    lin1 = torch.nn.Linear(H, H, bias=False, device="cuda", dtype=torch.bfloat16)
    lin2 = torch.nn.Linear(H, H, bias=False, device="cuda", dtype=torch.bfloat16)
    norm = polynorm.PolyNorm(eps=EPS, backend="cuda").cuda()
    block = torch.compile(lambda t: lin2(norm(lin1(t))), mode="reduce-overhead", dynamic=False)
    xb = x.detach()

    def block_step():
        torch.compiler.cudagraph_mark_step_begin()
        for p in (*lin1.parameters(), *lin2.parameters(), *norm.parameters()):
            p.grad = None
        block(xb).backward(gy)

    def block_eager_step():
        for p in (*lin1.parameters(), *lin2.parameters(), *norm.parameters()):
            p.grad = None
        lin2(norm(lin1(xb))).backward(gy)

    yield "Linear-PolyNorm-Linear, eager", block_eager_step
    yield "Linear-PolyNorm-Linear, reduce-overhead", block_step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--forms", nargs="*", default=None, help="only the forms whose name starts with one of these")
    parser.add_argument("--shapes", nargs="*", default=["2048x1024", "2048x4096", "16384x4096"])
    parser.add_argument("--no-profile", action="store_true")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for M, H in (tuple(map(int, s.split("x"))) for s in args.shapes):
        x, *_ = inputs(M, H)
        floor = floor_ms(x.detach())
        print(f"\n## M={M} H={H}: floor (copy + add) {floor * 1e3:.1f} us")
        for name, step in forms(M, H):
            if args.forms is not None and not any(name.startswith(f) for f in args.forms):
                continue
            counters.clear()
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            host = host_us(step)
            ms = triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median")
            skips = dict(counters["inductor"])
            print(f"{name:45s} {ms * 1e3:8.1f} us  {ms / floor:6.2f}x floor  host {host:7.1f} us/step  "
                  f"inductor counters {skips}")
    if args.no_profile:
        return
    # Where a bench-form step's time goes.
    M, H = 2048, 1024
    for name, step in forms(M, H):
        if name == "reduce-overhead, autograd.grad (bench)":
            break
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
