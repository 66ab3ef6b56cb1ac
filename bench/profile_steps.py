#!/usr/bin/env python3
"""Where a PolyNorm training step's time goes: host time, launches and GPU idle gaps.

For each backend and shape, one step is ``y = poly_norm(x, weight, bias)`` then
``y.backward(grad_y)`` with x, weight and bias leaves that require grad (their ``.grad`` set
to None before each step, as an optimizer's ``zero_grad`` does). Reported per step:

- host us: wall-clock time of the Python calls alone (the forward call, the backward call),
  best of 5 rounds of 200 steps with no synchronisation inside a round, so the GPU never
  holds the host back at these sizes;
- kernels: the GPU kernels (and memsets/copies) that one forward+backward launches, by name,
  from a ``torch.profiler`` trace of 20 steps;
- GPU busy and idle: within those 20 steps, the time the GPU spent in kernels, and the gaps
  between consecutive GPU operations (idle time), per step;
- the kernel-only time per step, next to the same-run floor (copy + add of the same bytes,
  ``triton.testing.do_bench`` medians).

``layer_norm`` (``torch.nn.functional.layer_norm`` with a weight and bias of H elements) is
the native baseline: what PyTorch's own fused norm costs on the same host for the same
autograd work.

Usage (on a CUDA machine)::

    python3 bench/profile_steps.py                       # seed shape and a 2^26 shape, bf16
    python3 bench/profile_steps.py --shapes 2048x1024 --backends cuda --trace out/trace

PolyNorm: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

import torch
from torch.autograd import DeviceType
from triton.testing import do_bench

import polynorm

STEPS = 20


def parse_shape(text: str) -> tuple[int, int]:
    M, H = text.lower().split("x")
    return int(M), int(H)


def make_step(backend: str, M: int, H: int, dtype: torch.dtype):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, H, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
    grad_y = torch.randn(M, H, device="cuda", dtype=dtype, generator=gen)
    if backend == "layer_norm":  # the native baseline: the same autograd work, PyTorch's own kernels
        # layer_norm takes weight and bias in x's dtype
        weight = torch.randn(H, device="cuda", dtype=dtype, requires_grad=True)
        bias = torch.randn(H, device="cuda", dtype=dtype, requires_grad=True)
    else:
        weight = torch.tensor([0.3, -0.4, 0.9], device="cuda", requires_grad=True)
        bias = torch.tensor([0.1], device="cuda", requires_grad=True)
    leaves = (x, weight, bias)

    def forward():
        for t in leaves:
            t.grad = None
        if backend == "layer_norm":
            return torch.nn.functional.layer_norm(x, (H,), weight, bias, 1e-6)
        return polynorm.poly_norm(x, weight, bias, 1e-6, backend=backend)

    def step():
        forward().backward(grad_y)

    return forward, grad_y, step


def host_us(backend: str, M: int, H: int, dtype: torch.dtype) -> tuple[float, float]:
    forward, grad_y, step = make_step(backend, M, H, dtype)
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    best_f = best_b = float("inf")
    for _ in range(5):
        t_f = t_b = 0.0
        for _ in range(200):
            t0 = time.perf_counter()
            y = forward()
            t1 = time.perf_counter()
            y.backward(grad_y)
            t2 = time.perf_counter()
            t_f += t1 - t0
            t_b += t2 - t1
        torch.cuda.synchronize()
        best_f, best_b = min(best_f, t_f / 200 * 1e6), min(best_b, t_b / 200 * 1e6)
    return best_f, best_b


def gpu_profile(backend: str, M: int, H: int, dtype: torch.dtype, trace: Path | None) -> dict:
    _forward, _grad_y, step = make_step(backend, M, H, dtype)
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    if trace is not None:
        trace.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace / f"{backend}_{M}x{H}.json"))
    gpu = sorted(
        (e for e in prof.events() if e.device_type == DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    names = Counter(e.name for e in gpu)
    busy = sum(e.time_range.end - e.time_range.start for e in gpu)
    idle, last_end = 0.0, None
    for e in gpu:
        if last_end is not None and e.time_range.start > last_end:
            idle += e.time_range.start - last_end
        last_end = max(last_end or e.time_range.end, e.time_range.end)
    span = (gpu[-1].time_range.end - gpu[0].time_range.start) if gpu else 0.0
    return {
        "kernels_per_step": len(gpu) / STEPS,
        "names": {k: v / STEPS for k, v in names.most_common()},
        "busy_us": busy / STEPS,
        "idle_us": idle / STEPS,
        "span_us": span / STEPS,
    }


def floor_us(M: int, H: int, dtype: torch.dtype) -> float:
    a = torch.randn(M, H, device="cuda", dtype=dtype)
    b, out, out2 = torch.randn_like(a), torch.empty_like(a), torch.empty_like(a)
    t_copy = do_bench(lambda: out.copy_(a), warmup=25, rep=100, return_mode="median")
    t_add = do_bench(lambda: torch.add(a, b, out=out2), warmup=25, rep=100, return_mode="median")
    return (t_copy + t_add) * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", type=parse_shape, default=[(2048, 1024), (16384, 4096)],
                        help="MxH shapes (default: a seed shape and an M*H = 2^26 shape)")
    parser.add_argument("--backends", nargs="+", default=["cuda", "triton", "layer_norm"],
                        choices=["cuda", "triton", "reference", "layer_norm"],
                        help="polynorm backends, and layer_norm: torch.nn.functional.layer_norm as the native baseline")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--trace", type=Path, default=None, help="folder for chrome traces (one per run)")
    args = parser.parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}, x/weight/bias leaves, "
          f"{STEPS} profiled steps")
    rows = []
    for M, H in args.shapes:
        floor = floor_us(M, H, dtype)
        for backend in args.backends:
            f_us, b_us = host_us(backend, M, H, dtype)
            prof = gpu_profile(backend, M, H, dtype, args.trace)
            rows.append((M, H, backend, f_us, b_us, prof, floor))
            print(f"\n## {backend}, M={M}, H={H}")
            print(f"host: forward {f_us:.1f} us, backward {b_us:.1f} us per call")
            print(f"GPU per step: {prof['kernels_per_step']:.1f} operations, busy {prof['busy_us']:.1f} us, "
                  f"idle gaps {prof['idle_us']:.1f} us, span {prof['span_us']:.1f} us; floor (copy+add) {floor:.1f} us")
            for name, count in prof["names"].items():
                print(f"  {count:4.1f} x {name[:110]}")
    print("\n| M | H | backend | host fwd us | host bwd us | GPU ops/step | GPU busy us | GPU idle us | floor us | busy/floor |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for M, H, backend, f_us, b_us, prof, floor in rows:
        print(f"| {M} | {H} | {backend} | {f_us:.1f} | {b_us:.1f} | {prof['kernels_per_step']:.1f} | "
              f"{prof['busy_us']:.1f} | {prof['idle_us']:.1f} | {floor:.1f} | {prof['busy_us'] / floor:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
