#!/usr/bin/env python3
"""Host time of a PolyNorm call, in microseconds, measured on CPU tensors: no GPU needed.

A tiny x (4 x 64, fp32) makes the arithmetic negligible, so what is timed is what every
call pays on the host whatever the device: the Python wrapper, the argument checks, the
dispatcher, autograd's graph and the output allocations. A regression there shows here
without a GPU. Each figure is the best of ``--repeat`` rounds of ``--number`` calls
(``timeit``), on one thread, for:

- ``forward``: ``poly_norm(x, weight, bias)`` with x, weight and bias requiring grad;
- ``backward``: ``torch.autograd.grad`` of a retained graph for x, weight and bias;
- ``full``: both.

Rows: each polynorm backend that runs CPU tensors (``auto``: the C++ kernel; ``reference``:
plain PyTorch; ``triton`` under ``TRITON_INTERPRET=1`` only, where Triton's interpreter
runs the kernel itself in Python, so its row is an upper bound rather than host cost;
``triton-host``, also under ``TRITON_INTERPRET=1`` only: the same calls with every Triton
kernel launch replaced by a no-op, so the Triton backend's host path alone, without Triton's
launcher: outputs are garbage, and ``_launchable`` answers as on a GPU, without the per-tensor
fake-tensor test that only the interpreter needs), and ``torch.nn.functional.layer_norm``
with weight and bias as the native baseline for the same autograd work.

    python3 bench/host_overhead.py
    TRITON_INTERPRET=1 python3 bench/host_overhead.py --backends auto triton triton-host

PolyNorm: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import timeit

import torch

import polynorm

BACKENDS = ("auto", "reference", "triton", "triton-host", "layer_norm")
TRITON_ROWS = ("triton", "triton-host")  # rows that need TRITON_INTERPRET=1 on the CPU


class _NoLaunch:
    """A Triton kernel stand-in: ``kernel[grid](...)`` launches nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def no_triton_launches():
    """Within: every kernel of ``polynorm.triton_kernels`` (a module attribute named
    ``_*_kernel``) is a :class:`_NoLaunch`, so a Triton call runs its host path alone. The
    module's ``_interpreted`` (which looks at a kernel's type) and ``wrap_triton`` (which the
    registered ops hand a kernel to) keep working, and ``_launchable`` answers as it does on a
    GPU (tensors with data), without the interpreter's is_fake test of each tensor (about
    1 us each). Restores everything on exit."""
    from polynorm import triton_kernels as tk

    interpreted = tk._interpreted()
    names = [name for name in vars(tk) if name.startswith("_") and name.endswith("_kernel")]
    saved = {name: getattr(tk, name) for name in names + ["_interpreted", "wrap_triton", "_launchable"]}
    try:
        tk._interpreted = lambda: interpreted
        tk.wrap_triton = lambda kernel: kernel
        tk._launchable = lambda *tensors: not any(t.is_meta for t in tensors)
        for name in names:
            setattr(tk, name, _NoLaunch())
        yield
    finally:
        for name, value in saved.items():
            setattr(tk, name, value)


def make_call(backend: str, M: int, H: int):
    """(forward, backward, full): closures over fresh inputs for one backend."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(M, H, generator=gen).requires_grad_(True)
    grad_y = torch.randn(M, H, generator=gen)
    if backend == "layer_norm":
        weight = torch.randn(H, generator=gen).requires_grad_(True)
        bias = torch.randn(H, generator=gen).requires_grad_(True)

        def forward():
            return torch.nn.functional.layer_norm(x, (H,), weight, bias, 1e-6)

    else:
        weight = torch.tensor([0.3, -0.4, 0.9], requires_grad=True)
        bias = torch.tensor([0.1], requires_grad=True)

        kernel_backend = "triton" if backend == "triton-host" else backend

        def forward():
            return polynorm.poly_norm(x, weight, bias, 1e-6, backend=kernel_backend)

    leaves = (x, weight, bias)
    y = forward()

    def backward():  # a retained graph: the backward alone
        return torch.autograd.grad(y, leaves, grad_y, retain_graph=True)

    def full():  # a new graph each call, as in training
        return torch.autograd.grad(forward(), leaves, grad_y)

    return forward, backward, full


def best_us(fn, number: int, repeat: int) -> float:
    fn()  # warm up: first-call caches, Triton compilation
    return min(timeit.Timer(fn).repeat(repeat=repeat, number=number)) / number * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=None,
                        help="default: auto, reference, layer_norm, and triton, triton-host under TRITON_INTERPRET=1")
    parser.add_argument("--shape", default="4x64", help="MxH of x (default 4x64)")
    parser.add_argument("--number", type=int, default=2000, help="calls per round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; the best is reported")
    args = parser.parse_args(argv)
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    backends = args.backends or [b for b in BACKENDS if b not in TRITON_ROWS or interpret]
    if any(b in TRITON_ROWS for b in backends) and not interpret:
        parser.error("the triton backend runs CPU tensors only under TRITON_INTERPRET=1")
    M, H = (int(v) for v in args.shape.lower().split("x"))
    torch.set_num_threads(1)
    print(f"# host time per call on CPU tensors: x {M}x{H} fp32, 1 thread, best of {args.repeat} x {args.number} "
          f"calls; torch {torch.__version__}, {platform.processor() or platform.machine()}")
    print("| backend | forward us | backward us | full us |")
    print("|---|---|---|---|")
    labels = {"triton": " (interpreter: kernel included)", "triton-host": " (launches no-ops: host path alone)"}
    for backend in backends:
        with no_triton_launches() if backend == "triton-host" else contextlib.nullcontext():
            forward, backward, full = make_call(backend, M, H)
            # The interpreter runs the kernel in Python, ~100x slower: fewer calls.
            number = args.number if backend != "triton" else max(1, args.number // 100)
            times = [best_us(fn, number, args.repeat) for fn in (forward, backward, full)]
        label = backend + labels.get(backend, "")
        print(f"| {label} | " + " | ".join(f"{t:.1f}" for t in times) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
