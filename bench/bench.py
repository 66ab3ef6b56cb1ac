#!/usr/bin/env python3
"""Benchmark every PolyNorm provider against bandwidth floors measured in the same run.

Two ops: PolyNorm (``--op poly_norm``, the default) and the fused PolyNorm x mul of gated MLPs
(``--op poly_norm_mul``, below).

PolyNorm (Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884)::

    y = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b,   norm(u) = u / sqrt(mean(u^2) + eps)

Providers: ``polynorm_cuda`` and ``polynorm_triton`` (:func:`polynorm.poly_norm` with that
backend), ``eager`` (:func:`polynorm.reference.poly_norm`, PyTorch with an fp32 upcast),
``torch_compile`` (``torch.compile`` of eager) and ``liger`` (Liger-Kernel's Triton PolyNorm,
out of place). Two providers take the host out of the measurement, as a training step under
CUDA graphs does: ``polynorm_cuda_graph`` captures the timed call (forward, or forward and
backward, with the CUDA backend) once with ``torch.cuda.graph`` and times its replays;
``polynorm_cuda_reduce_overhead`` is ``torch.compile(mode="reduce-overhead")`` of the CUDA
backend's ``poly_norm`` (cudagraph trees replay its forward and backward graphs), timed in the
``full`` mode only (a retained graph cannot be replayed as a backward alone). On a machine without CUDA, ``polynorm_cpu`` (the C++ kernel) runs against
eager. An optional provider that is missing or fails its first call is skipped with a message.

The fused op, ``out = poly_norm(x) * mul`` (``--op poly_norm_mul``): providers
``polynorm_mul`` (:func:`polynorm.poly_norm_mul`, backend ``"auto"``: the CUDA kernels on a GPU,
the C++ kernel on the CPU), ``polynorm_mul_triton`` (backend ``"triton"``), ``polynorm_then_mul``
(``poly_norm(x)`` with backend ``"auto"``, then ``torch.mul``: the unfused form, five passes
forward instead of three), ``eager`` (:func:`polynorm.reference.poly_norm_mul`, fp32 upcast,
rounded once) and ``torch_compile`` (``torch.compile`` of eager). mul ``(M, H)`` is randn in the
activation dtype and requires grad; grad_out takes grad_y's place. Its floors, from the same two
timed kernels: forward = ``floor_add`` (read x and mul, write out); backward = ``floor_add`` +
``floor_copy``, read three (grad_out, x, mul) and write two (dx, dmul), as two kernels timed
separately and added (no single torch op moves exactly those bytes; at the small shapes the
sum holds two launch tails, so it is, if anything, a lenient floor there); full = both (eight
passes). Outputs as below, in files named ``polynorm_mul_bench.json``,
``polynorm_mul_speed_<sweep>_<mode>.png``, ..., ``polynorm_mul_summary.md``.

Method:

- x ``(M, H)`` and grad_y are randn in the activation dtype (bf16 by default); weight ``(3,)``
  is fp32 near ``[0.3, -0.4, 0.9]`` and bias ``()`` fp32 near 0. x, weight and bias require grad.
- Modes: ``forward`` (with autograd recording, as in training); ``backward`` (only
  ``torch.autograd.grad`` of a retained graph, for dx, dw and db); ``full`` (both).
- Speed: the median, 20th and 80th percentile ms of ``triton.testing.do_bench``, which
  flushes the L2 cache before every timed call, so even the small seed shapes (4 MB at
  M=2048, H=1024 bf16, well under the H200's 60 MB L2) are read from HBM. Those shapes run
  for a few microseconds, so the CPU cost of autograd and launches shows in them wherever
  it exceeds the ~0.1 ms head start that the flush gives the CPU.
- Floors, timed at each shape right before the providers: ``floor_copy`` (a same-size copy:
  read x, write y) for forward, ``floor_add`` (a same-size ``torch.add(a, b, out=c)``: read two,
  write one) for backward, and their sum for full. Ratio = time / floor; effective bandwidth
  = the floor's bytes (2, 3 or 5 passes over M*H elements) / time.
- Memory: the peak of ``torch.cuda.max_memory_allocated`` over one full pass, minus what was
  allocated before it (the inputs), in MiB.

Outputs, in ``--out``: ``polynorm_bench.json`` (a list of records in Liger-Kernel's benchmark
schema), ``speed_<sweep>_<mode>.png``, ``ratio_<sweep>.png``, ``memory.png`` and ``summary.md``,
which is printed at the end.

Usage::

    python3 bench/bench.py --quick                  # under 2 minutes on an H200
    python3 bench/bench.py                          # every sweep, mode and provider
    python3 bench/bench.py --sweep bytes --modes forward backward --providers polynorm_cuda eager
    python3 bench/bench.py --op poly_norm_mul --quick   # the fused PolyNorm x mul
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.metadata
import json
import platform
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch._functorch.config
from torch import Tensor
from torch.utils import benchmark as torch_benchmark

import polynorm
from polynorm import reference

try:
    import triton
    import triton.testing
except ImportError:  # the CPU path times with torch.utils.benchmark instead
    triton = None

try:
    from tqdm import tqdm
except ImportError:
    tqdm = None

QUANTILES = [0.5, 0.2, 0.8]  # do_bench returns them in this order: median, 20th, 80th
MODES = ("forward", "backward", "full")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
FLOOR_COPY, FLOOR_ADD = "floor_copy", "floor_add"
FLOORS = (FLOOR_COPY, FLOOR_ADD)
# Passes over the M*H elements that each floor kernel makes: copy reads one tensor and
# writes one (2); add reads two and writes one (3).
FLOOR_PASSES = {FLOOR_COPY: 2, FLOOR_ADD: 3}


@dataclass(frozen=True)
class Op:
    """One benchmarked op: its providers, the floors that bound each mode, its file names."""

    name: str  # --op
    kernel_name: str  # the records' kernel_name; names the output files
    gpu_providers: tuple[str, ...]  # the default on a GPU
    cpu_providers: tuple[str, ...]  # the default without CUDA
    providers: tuple[str, ...]  # every provider of the op, in the summary's column order
    main_providers: tuple[str, ...]  # whose effective bandwidth summary.md reports, by preference
    floors: dict  # mode -> the floor kernels whose times add up to its floor
    inputs: str  # what make_inputs draws, for summary.md
    floors_line: str  # how the floors are made, for summary.md
    grads: str  # what the backward computes
    # summary.md's speed-up columns: each of these providers' time / the main provider's
    speedup_over: tuple[str, ...] = ()

    def passes(self, mode: str) -> int:
        """Passes over the M*H elements that the mode's floor makes."""
        return sum(FLOOR_PASSES[name] for name in self.floors[mode])

    def floor_label(self, mode: str) -> str:
        return " + ".join(name.removeprefix("floor_") for name in self.floors[mode])

    @property
    def file_prefix(self) -> str:
        """PNGs and summary.md: unprefixed for PolyNorm (the original names), else the kernel name."""
        return "" if self.name == "poly_norm" else f"{self.kernel_name}_"


POLY_NORM = Op(
    name="poly_norm",
    kernel_name="polynorm",
    gpu_providers=(
        "polynorm_cuda", "polynorm_triton", "eager", "torch_compile", "liger", "polynorm_cuda_graph",
        "polynorm_cuda_reduce_overhead",
    ),  # fmt: skip
    cpu_providers=("polynorm_cpu", "eager"),
    providers=(
        "polynorm_cuda", "polynorm_triton", "polynorm_cpu", "eager", "torch_compile", "liger", "polynorm_cuda_graph",
        "polynorm_cuda_reduce_overhead",
    ),  # fmt: skip
    main_providers=("polynorm_cuda", "polynorm_cpu", "polynorm_triton"),
    # forward reads x and writes y (copy, 2 passes); backward reads x and grad_y and writes
    # dx (add, 3); full is both (5).
    floors={"forward": (FLOOR_COPY,), "backward": (FLOOR_ADD,), "full": (FLOOR_COPY, FLOOR_ADD)},
    inputs="x and grad_y randn",
    floors_line=(
        "forward = copy (read x, write y); backward = `torch.add(a, b, out=c)` (read 2, write 1); full = their sum"
    ),
    grads="dx, dw, db",
)
POLY_NORM_MUL = Op(
    name="poly_norm_mul",
    kernel_name="polynorm_mul",
    gpu_providers=("polynorm_mul", "polynorm_mul_triton", "polynorm_then_mul", "torch_compile", "eager"),
    cpu_providers=("polynorm_mul", "polynorm_then_mul", "eager"),
    providers=("polynorm_mul", "polynorm_mul_triton", "polynorm_then_mul", "torch_compile", "eager"),
    main_providers=("polynorm_mul", "polynorm_mul_triton"),
    # forward reads x and mul and writes out (add, 3 passes); backward reads grad_out, x and
    # mul and writes dx and dmul (add + copy, 5); full is both (8).
    floors={
        "forward": (FLOOR_ADD,),
        "backward": (FLOOR_ADD, FLOOR_COPY),
        "full": (FLOOR_ADD, FLOOR_ADD, FLOOR_COPY),
    },
    inputs="x, mul and grad_out randn",
    floors_line=(
        "forward = `torch.add(a, b, out=c)` (read 2, write 1); backward = add + copy, timed apart and added "
        "(read 3, write 2); full = their sum"
    ),
    grads="dx, dmul, dw, db",
    speedup_over=("polynorm_then_mul", "torch_compile"),  # the target: >= 1.5x faster than each
)
OPS = {op.name: op for op in (POLY_NORM, POLY_NORM_MUL)}
PROVIDERS = tuple(dict.fromkeys(p for op in OPS.values() for p in op.providers))

# The sweeps' x values, and the subsets that --quick runs.
SEED_M, SEED_H = 2048, (1024, 2048, 4096, 8192, 16384, 32768)
BYTES_MH = 2**26  # 128 MiB per bf16 tensor: twice the L2 even before do_bench flushes it
BYTES_H = (512, 1024, 2048, 3000, 4096, 5125, 8192, 16384, 16385, 32768, 65536)
TOKENS_H, TOKENS_M = 4096, (256, 1024, 4096, 16384, 65536)
CPU_M, CPU_H = 256, (512, 1024, 2048, 4096)
QUICK_X = {
    "seed": (1024, 4096, 32768),
    "bytes": (512, 4096, 5125, 65536),
    "tokens": (1024, 16384),
    "cpu": (512, 1024, 4096),
}
GPU_SWEEPS = ("seed", "bytes", "tokens")
# Timing budgets in ms: do_bench's warmup and rep on a GPU; on the CPU, rep is the
# min_run_time of torch.utils.benchmark.Timer.blocked_autorange.
TIMING = {  # (quick, device type) -> (warmup_ms, rep_ms)
    (False, "cuda"): (25, 100),
    (True, "cuda"): (10, 25),
    (False, "cpu"): (0, 200),
    (True, "cpu"): (0, 50),
}

CUDA_CAVEAT = (
    "- caveat: a call of a few µs (the seed shapes, tokens M <= 4096) also measures the CPU cost of autograd and "
    "launches wherever it exceeds the ~0.1 ms head start that do_bench's L2 flush gives the CPU (a backward through "
    "autograd costs about 0.15 ms of CPU on an H200 host); `bench/ops_timing.py` times the kernels alone"
)

ForwardFn = Callable[[Tensor, Tensor, Tensor], Tensor]


@dataclass
class BenchmarkData:
    """One benchmark record, in Liger-Kernel's schema (``benchmark/scripts/utils.py``).

    One record per (kernel_name, kernel_provider, metric_name, kernel_operation_mode,
    sweep); a value that could not be measured is None (null in the JSON).
    """

    kernel_name: str
    kernel_provider: str
    metric_name: str
    metric_unit: str
    gpu_name: str
    x_name: str
    x_label: str
    x_values: list[int]
    y_values_50: list[float | None]
    y_values_20: list[float | None]
    y_values_80: list[float | None]
    timestamp: str
    kernel_operation_mode: str | None = None
    extra_benchmark_config_str: str | None = None
    liger_version: str | None = None


@dataclass(frozen=True)
class Sweep:
    """One x axis: the (M, H) shapes it visits, in x order, and what stays fixed along it."""

    name: str
    x_name: str  # "H" or "M"
    x_label: str
    shapes: tuple[tuple[int, int], ...]  # (M, H) of each point
    fixed: dict = field(default_factory=dict)  # goes into extra_benchmark_config_str

    @property
    def x_values(self) -> list[int]:
        return [H if self.x_name == "H" else M for M, H in self.shapes]

    def config_str(self, dtype: torch.dtype, eps: float) -> str:
        """extra_benchmark_config_str: the sweep's name, its fixed M or H, the dtypes and eps."""
        config = {"sweep": self.name, **self.fixed, "dtype": dtype_name(dtype), "param_dtype": "float32", "eps": eps}
        return json.dumps(config)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def make_sweep(name: str, quick: bool) -> Sweep:
    """The named sweep; --quick keeps the x values in ``QUICK_X``."""

    def keep(xs):
        return tuple(x for x in xs if x in QUICK_X[name]) if quick else xs

    if name == "seed":
        return Sweep(
            name, "H", f"hidden size H (M = {SEED_M})", tuple((SEED_M, H) for H in keep(SEED_H)), {"M": SEED_M}
        )
    if name == "bytes":
        shapes = tuple((BYTES_MH // H, H) for H in keep(BYTES_H))
        # M varies along this sweep: the config lists it, point by point, beside M*H.
        return Sweep(name, "H", "hidden size H (M = 2^26 // H)", shapes, {"M*H": BYTES_MH, "M": [M for M, _ in shapes]})
    if name == "tokens":
        shapes = tuple((M, TOKENS_H) for M in keep(TOKENS_M))
        return Sweep(name, "M", f"rows M (H = {TOKENS_H})", shapes, {"H": TOKENS_H})
    if name == "cpu":
        return Sweep(name, "H", f"hidden size H (M = {CPU_M})", tuple((CPU_M, H) for H in keep(CPU_H)), {"M": CPU_M})
    raise ValueError(f"bench: unknown sweep {name!r}")


def make_inputs(
    M: int, H: int, dtype: torch.dtype, device: torch.device, seed: int = 0, op: Op = POLY_NORM
) -> tuple[tuple[Tensor, ...], Tensor]:
    """Fresh random inputs for one shape: never zeros.

    Returns:
        (inputs, grad): inputs = (x, weight, bias), or (x, mul, weight, bias) for the fused
        op; grad = grad_y (grad_out). x and mul ``(M, H)`` randn in dtype; weight ``(3,)``
        fp32 near ``[0.3, -0.4, 0.9]``; bias ``()`` fp32 near 0; grad ``(M, H)`` randn in
        dtype. Every input requires grad.
    """
    torch.manual_seed(seed)
    weight = torch.tensor([0.3, -0.4, 0.9]) + 0.05 * torch.randn(3)
    bias = 0.1 * torch.randn(())  # 0-d: Liger returns a 0-d grad_bias, which autograd rejects for a (1,) bias
    x = torch.randn(M, H, dtype=dtype, device=device, requires_grad=True)
    mul = torch.randn(M, H, dtype=dtype, device=device, requires_grad=True) if op is POLY_NORM_MUL else None
    grad = torch.randn(M, H, dtype=dtype, device=device)
    params = (weight.to(device).requires_grad_(), bias.to(device).requires_grad_())
    return ((x, *params) if mul is None else (x, mul, *params)), grad


def provider_factory(name: str, eps: float, op: Op = POLY_NORM) -> Callable[[], ForwardFn]:
    """A function that makes provider name's ``forward(*inputs) -> y``, anew for each shape:
    ``forward(x, weight, bias) -> y``, or ``forward(x, mul, weight, bias) -> out`` for the
    fused op.

    Raises:
        ImportError: the provider's package is not installed (liger).
        ValueError: a provider that is not op's.
    """
    if name not in op.providers:
        raise ValueError(f"bench: provider {name!r} is not one of --op {op.name}'s: {', '.join(op.providers)}")
    if op is POLY_NORM_MUL:
        return _mul_provider_factory(name, eps)
    if name in ("polynorm_cuda", "polynorm_triton", "polynorm_cpu"):
        backend = {"polynorm_cuda": "cuda", "polynorm_triton": "triton", "polynorm_cpu": "auto"}[name]
        return lambda: functools.partial(polynorm.poly_norm, eps=eps, backend=backend)
    if name == "eager":
        return lambda: functools.partial(reference.poly_norm, eps=eps)
    if name == "torch_compile":

        def compiled() -> ForwardFn:
            # A fresh, shape-specialised graph per shape; the reset keeps a long sweep
            # clear of dynamo's recompile limit, past which it would fall back to eager.
            torch.compiler.reset()
            # Timing a backward again and again needs retain_graph=True, which a compiled
            # backward refuses while it donates its saved buffers to its outputs.
            torch._functorch.config.donated_buffer = False
            return torch.compile(functools.partial(reference.poly_norm, eps=eps), fullgraph=True, dynamic=False)

        return compiled
    if name == "polynorm_cuda_graph":

        def graphed() -> ForwardFn:
            forward = functools.partial(polynorm.poly_norm, eps=eps, backend="cuda")
            forward.capture = "graph"
            return forward

        return graphed
    if name == "polynorm_cuda_reduce_overhead":

        def reduce_overhead() -> ForwardFn:
            torch.compiler.reset()
            forward = torch.compile(
                functools.partial(polynorm.poly_norm, eps=eps, backend="cuda"), mode="reduce-overhead", dynamic=False
            )
            call = functools.partial(_call, forward)  # a partial takes the capture attribute
            call.capture = "reduce-overhead"
            return call

        return reduce_overhead
    if name == "liger":
        from liger_kernel.ops.poly_norm import LigerPolyNormFunction

        # in_place=False: in place, Liger writes dx over grad_y, the buffer that every timed
        # backward reuses.
        return lambda: lambda x, weight, bias: LigerPolyNormFunction.apply(x, weight, bias, eps, False)
    raise ValueError(f"bench: unknown provider {name!r}")


def _mul_provider_factory(name: str, eps: float) -> Callable[[], ForwardFn]:
    """The fused op's providers (see the module docstring). polynorm.poly_norm_mul is looked
    up when a provider is made, so a checkout without it skips that provider with a message."""
    if name in ("polynorm_mul", "polynorm_mul_triton"):
        backend = "triton" if name == "polynorm_mul_triton" else "auto"
        return lambda: functools.partial(polynorm.poly_norm_mul, eps=eps, backend=backend)
    if name == "polynorm_then_mul":

        def then_mul(x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
            # The unfused form: y rounded to x's dtype, written, read back by torch.mul.
            return torch.mul(polynorm.poly_norm(x, weight, bias, eps=eps), mul)

        return lambda: then_mul
    if name == "eager":
        return lambda: functools.partial(reference.poly_norm_mul, eps=eps)
    if name == "torch_compile":

        def compiled() -> ForwardFn:
            # As for PolyNorm's torch_compile: a fresh, shape-specialised graph per shape, and
            # no donated buffers, so that a retained backward can be timed again and again.
            torch.compiler.reset()
            torch._functorch.config.donated_buffer = False
            return torch.compile(functools.partial(reference.poly_norm_mul, eps=eps), fullgraph=True, dynamic=False)

        return compiled
    raise ValueError(f"bench: unknown provider {name!r}")


def _call(fn, *args):
    return fn(*args)


def cuda_graphed(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` captured once in a CUDA graph (after warm-up calls on a side stream, as
    ``torch.cuda.graph`` requires); returns the graph's replay. The timed inputs are the same
    tensors on every call, so the captured addresses stay valid."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def check_provider(
    forward: ForwardFn, dtype: torch.dtype, device: torch.device, eps: float, op: Op = POLY_NORM
) -> str:
    """Run one forward and backward at M=64, H=4096; return a warning if y or dx (out, dx
    or dmul for the fused op) is off.

    The bound is 2 eps of dtype in relative L2 error against the float64 reference: about 9x
    what an fp32 computation rounded once to bf16 or fp16 achieves, 4x for fp32
    (docs/MATH.md). A provider over it is still timed.

    Raises:
        Exception: whatever the provider raises (missing backend, no CUDA build, ...).
    """
    inputs, grad = make_inputs(64, 4096, dtype, device, seed=1, op=op)
    tensors = inputs[:-2]  # x (and mul): the gradients checked
    y = forward(*inputs)
    grads = torch.autograd.grad(y, tensors, grad)
    inputs64 = [t.detach().double().requires_grad_() for t in inputs]
    oracle = reference.poly_norm if op is POLY_NORM else reference.poly_norm_mul
    y64 = oracle(*inputs64, eps)
    grads64 = torch.autograd.grad(y64, inputs64[: len(tensors)], grad.double())
    bound = 2 * torch.finfo(dtype).eps
    warnings = []
    names = ("y", "dx") if op is POLY_NORM else ("out", "dx", "dmul")
    for what, got, want in zip(names, (y, *grads), (y64, *grads64), strict=True):
        err = (torch.linalg.vector_norm(got.double() - want) / torch.linalg.vector_norm(want)).item()
        if not err <= bound:  # NaN fails too
            warnings.append(f"{what} {err:.2e}")
    if warnings:
        return f"relative L2 error against float64 over {bound:.1e}: {', '.join(warnings)}; timing it anyway"
    return ""


def mode_fn(mode: str, forward: ForwardFn, inputs: tuple[Tensor, ...], grad_y: Tensor):
    """The callable timed for a mode: forward, backward of a retained graph, or both.

    ``inputs``: make_inputs' (x, weight, bias), or (x, mul, weight, bias). torch.autograd.grad
    returns every input's gradient (dx, dw, db; and dmul) instead of accumulating them into
    ``.grad``, so no timed call adds to another's gradients.
    """
    capture = getattr(forward, "capture", None)
    if capture == "graph":
        if mode == "backward":
            # A backward alone would replay autograd on the stream its forward ran on, outside
            # the capture (seen on an H200: "operation failed due to a previous error during
            # capture"); the full mode captures both.
            raise NotImplementedError("backward: the CUDA-graph provider is timed forward and full")
        plain = functools.partial(polynorm.poly_norm, eps=forward.keywords["eps"], backend="cuda")
        return cuda_graphed(mode_fn(mode, plain, inputs, grad_y))
    if capture == "reduce-overhead":
        if mode != "full":
            raise NotImplementedError(f"{mode}: reduce-overhead is timed in the full mode only")

        def step():
            # Each timed call is one training step to cudagraph trees (the documented mark).
            # An H200 run without it ran at 40x the floor at M=2048, H=1024, slower than eager,
            # so the graphs were not replayed; that the mark fixes it is not yet measured.
            torch.compiler.cudagraph_mark_step_begin()
            return torch.autograd.grad(forward(*inputs), inputs, grad_y)

        return step
    if mode == "forward":
        return lambda: forward(*inputs)
    if mode == "backward":
        y = forward(*inputs)
        return lambda: torch.autograd.grad(y, inputs, grad_y, retain_graph=True)
    if mode == "full":
        return lambda: torch.autograd.grad(forward(*inputs), inputs, grad_y)
    raise ValueError(f"bench: unknown mode {mode!r}")


def floor_fns(x: Tensor, grad_y: Tensor) -> dict[str, Callable[[], Tensor]]:
    """The floors at x's size: the same bytes as the kernels, on detached tensors so that
    no autograd bookkeeping is timed.

    Returns:
        ``{"floor_copy": read x, write y; "floor_add": read x and grad_y, write a third}``.
    """
    x, grad_y = x.detach(), grad_y.detach()
    out = torch.empty_like(x)
    return {FLOOR_COPY: lambda: out.copy_(x), FLOOR_ADD: lambda: torch.add(x, grad_y, out=out)}


def time_ms(
    fn: Callable[[], object], device: torch.device, warmup_ms: float, rep_ms: float
) -> tuple[float, float, float]:
    """(median, 20th percentile, 80th percentile) of fn's time, in ms."""
    if device.type == "cuda":
        return tuple(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=QUANTILES))
    fn()  # first-call costs (allocations, lazy init) stay out of the timing
    measurement = torch_benchmark.Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=rep_ms / 1e3)
    times = torch.tensor(measurement.times, dtype=torch.float64)
    return tuple((1e3 * times.quantile(torch.tensor(QUANTILES, dtype=torch.float64))).tolist())


def peak_memory_mib(full: Callable[[], object]) -> tuple[float, float, float]:
    """Peak memory over one full pass beyond what was allocated before it, in MiB.

    The pass runs once first, so compilation and autotuning stay out. One measurement: the
    allocator's peak is deterministic, so the three quantiles are the same number.
    """
    full()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    full()
    torch.cuda.synchronize()
    mib = (torch.cuda.max_memory_allocated() - before) / 2**20
    return mib, mib, mib


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def bench_shape(
    M: int, H: int, providers: dict[str, Callable[[], ForwardFn]], args, device, log, op: Op = POLY_NORM
) -> dict:
    """Time the floors, then each provider, at one shape.

    Returns:
        ``{(provider, metric, mode): (p50, p20, p80)}``; a measurement that raised is absent
        (and logged), so one provider failing at one shape ends neither the shape nor the run.
    """
    inputs, grad_y = make_inputs(M, H, DTYPES[args.dtype], device, op=op)
    results = {}

    def measure(what: str, fn: Callable, *fn_args):
        try:
            return fn(*fn_args)
        except Exception as error:  # OOM, an H that a provider does not support, a compile failure
            log(f"  {what} failed at M={M} H={H}: {first_line(error)}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
            return None

    def time_mode(mode: str, forward: ForwardFn):
        # mode_fn runs inside measure, so a backward's retained graph lives only while it is timed.
        return time_ms(mode_fn(mode, forward, inputs, grad_y), device, args.warmup, args.rep)

    def memory(forward: ForwardFn):
        return peak_memory_mib(mode_fn("full", forward, inputs, grad_y))

    for name, fn in floor_fns(inputs[0], grad_y).items():
        timing = measure(name, time_ms, fn, device, args.warmup, args.rep)
        if timing:  # one floor bounds every mode's record
            results.update({(name, "speed", mode): timing for mode in args.modes})

    for name, make_forward in providers.items():
        forward = measure(f"{name} setup", make_forward)
        if forward is None:
            continue
        # The graph providers allocate from their graphs' private pools: not comparable.
        if device.type == "cuda" and not args.no_memory and getattr(forward, "capture", None) is None:
            peak = measure(f"{name} memory", memory, forward)
            if peak:
                results[(name, "memory", "full")] = peak
        for mode in args.modes:
            timing = measure(f"{name} {mode}", time_mode, mode, forward)
            if timing:
                results[(name, "speed", mode)] = timing
    return results


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def liger_version() -> str | None:
    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return None


def make_records(
    sweep: Sweep, results: list[dict], gpu_name: str, dtype: torch.dtype, eps: float, op: Op = POLY_NORM
) -> list[BenchmarkData]:
    """One record per (provider, metric, mode) measured anywhere along the sweep."""
    timestamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    keys = list(dict.fromkeys(key for point in results for key in point))
    records = []
    for provider, metric, mode in keys:
        values = [point.get((provider, metric, mode)) for point in results]
        records.append(
            BenchmarkData(
                kernel_name=op.kernel_name,
                kernel_provider=provider,
                metric_name=metric,
                metric_unit="ms" if metric == "speed" else "MB",
                gpu_name=gpu_name,
                x_name=sweep.x_name,
                x_label=sweep.x_label,
                x_values=sweep.x_values,
                y_values_50=[v[0] if v else None for v in values],
                y_values_20=[v[1] if v else None for v in values],
                y_values_80=[v[2] if v else None for v in values],
                timestamp=timestamp,
                kernel_operation_mode=mode,
                extra_benchmark_config_str=sweep.config_str(dtype, eps),
                liger_version=liger_version(),
            )
        )
    return records


def group_records(records: list[dict]) -> dict:
    """``{(config_str, x_name, x_label, x_values): {(metric, mode): {provider: record}}}``, in run order.

    Records pair up by the fields a floor shares with the providers it bounds:
    extra_benchmark_config_str (the sweep), x_name and x_values, and the mode.
    """
    groups: dict = {}
    for record in records:
        key = (record["extra_benchmark_config_str"], record["x_name"], record["x_label"], tuple(record["x_values"]))
        by_mode = groups.setdefault(key, {})
        by_mode.setdefault((record["metric_name"], record["kernel_operation_mode"]), {})[record["kernel_provider"]] = (
            record
        )
    return groups


def floor_values(mode: str, floors: dict, op: Op = POLY_NORM) -> list[float | None]:
    """The floor of a mode at each x: the sum of op's floor kernels for it (PolyNorm: copy
    forward, add backward, both full; the fused op: add, add + copy, and all three)."""
    names = op.floors[mode]
    if not all(name in floors for name in names):
        return []
    columns = zip(*(floors[name]["y_values_50"] for name in names), strict=True)
    return [None if None in column else sum(column) for column in columns]


def shape_at(config: dict, x_name: str, x: int, i: int) -> tuple[int, int]:
    """(M, H) of the i-th point of a sweep, from its config and x value."""
    if x_name == "M":
        return x, config["H"]
    M = config["M"]
    return (M[i] if isinstance(M, list) else M), x


def gb_per_s(gigabytes: float, ms: float | None) -> str:
    if not ms:
        return "—"
    rate = gigabytes / ms * 1e3
    return f"{rate:.0f}" if rate >= 100 else f"{rate:.3g}"


def summarize(records: list[dict], header: list[str], op: Op = POLY_NORM) -> str:
    """summary.md: per sweep, each shape and mode's floor and every provider's ratio to it."""
    lines = [f"# {op.kernel_name} benchmark", "", *header, ""]
    memory_rows = []
    for (config_str, x_name, _, x_values), by_mode in group_records(records).items():
        config = json.loads(config_str)
        itemsize = getattr(torch, config["dtype"]).itemsize
        speed_modes = [mode for mode in MODES if ("speed", mode) in by_mode]
        providers = [p for p in op.providers if any(p in by_mode[("speed", mode)] for mode in speed_modes)]
        main = next((p for p in op.main_providers if p in providers), None)
        fixed = ", ".join(f"{k}={v}" for k, v in config.items() if k in ("M", "H", "M*H") and not isinstance(v, list))
        lines += [f"## sweep `{config['sweep']}` ({fixed}, {config['dtype']}, x = {x_name})", ""]
        head = ["M", "H", "mode", "floor ms", "floor GB/s"] + [f"{p} × (ms)" for p in providers]
        head += [f"{main} GB/s"] if main else []
        baselines = [p for p in op.speedup_over if main and p in providers]
        head += [f"{main} speed-up over {p}" for p in baselines]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        floors_by_mode = {mode: floor_values(mode, by_mode[("speed", mode)], op) for mode in speed_modes}
        for i, x in enumerate(x_values):
            M, H = shape_at(config, x_name, x, i)
            for mode in speed_modes:
                floor = floors_by_mode[mode][i] if floors_by_mode[mode] else None
                gigabytes = op.passes(mode) * M * H * itemsize / 1e9
                row = [str(M), str(H), mode, f"{floor:.4f}" if floor else "—", gb_per_s(gigabytes, floor)]
                for provider in providers:
                    record = by_mode[("speed", mode)].get(provider)
                    ms = record["y_values_50"][i] if record else None
                    if ms is None:
                        row.append("—")
                    else:
                        row.append(f"{ms / floor:.2f} ({ms:.4f})" if floor else f"— ({ms:.4f})")
                if main:
                    record = by_mode[("speed", mode)].get(main)
                    ms = record["y_values_50"][i] if record else None
                    row.append(gb_per_s(gigabytes, ms))
                for baseline in baselines:
                    record = by_mode[("speed", mode)].get(baseline)
                    other = record["y_values_50"][i] if record else None
                    row.append(f"{other / ms:.2f}×" if ms and other else "—")
                lines.append("| " + " | ".join(row) + " |")
        lines.append("")
        if ("memory", "full") in by_mode:
            memory = by_mode[("memory", "full")]
            for i, x in enumerate(x_values):
                M, H = shape_at(config, x_name, x, i)
                memory_rows.append((config["sweep"], M, H, M * H * itemsize / 2**20, memory, i))
    if memory_rows:
        providers = [p for p in op.providers if any(p in row[4] for row in memory_rows)]
        lines += ["## Peak extra memory of one full pass (forward + backward), MiB", ""]
        head = ["sweep", "M", "H", "one tensor"] + providers
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for sweep, M, H, one_tensor, memory, i in memory_rows:
            cells = []
            for provider in providers:
                value = memory[provider]["y_values_50"][i] if provider in memory else None
                cells.append("—" if value is None else f"{value:.0f}")
            lines.append("| " + " | ".join([sweep, str(M), str(H), f"{one_tensor:.0f}", *cells]) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(records: list[dict], out_dir: Path, log, op: Op = POLY_NORM) -> list[Path]:
    """Time vs x per sweep and mode, ratio to the floor per sweep, and memory: PNGs in out_dir."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("bench: matplotlib is not installed, so no plots")
        return []

    def nan(values):
        return [float("nan") if v is None else v for v in values]

    def style(ax, x_label, x_values, y_label):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(x_values, [str(x) for x in x_values], rotation=45, fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.grid(True, which="major", alpha=0.3)

    paths = []
    memory_panels = []
    for (config_str, _, x_label, x_values), by_mode in group_records(records).items():
        config = json.loads(config_str)
        sweep = config["sweep"]
        x_values = list(x_values)
        speed_modes = [mode for mode in MODES if ("speed", mode) in by_mode]
        for mode in speed_modes:
            fig, ax = plt.subplots(figsize=(7, 4.5))
            records_by_provider = by_mode[("speed", mode)]
            floor = floor_values(mode, records_by_provider, op)
            if floor:
                ax.plot(x_values, nan(floor), "k--", label=f"floor ({op.floor_label(mode)})")
            for provider, record in records_by_provider.items():
                if provider in FLOORS:
                    continue
                (line,) = ax.plot(x_values, nan(record["y_values_50"]), "-o", ms=3, label=provider)
                ax.fill_between(
                    x_values, nan(record["y_values_20"]), nan(record["y_values_80"]), color=line.get_color(), alpha=0.2
                )
            style(ax, x_label, x_values, "ms (median; band: 20th-80th percentile)")
            ax.set_title(f"{op.kernel_name} {mode}, sweep {sweep}, {config['dtype']}")
            ax.legend(fontsize=8)
            fig.tight_layout()
            paths.append(out_dir / f"{op.file_prefix}speed_{sweep}_{mode}.png")
            fig.savefig(paths[-1], dpi=120)
            plt.close(fig)

        fig, axes = plt.subplots(1, len(speed_modes), figsize=(5 * len(speed_modes), 4.5), squeeze=False)
        for ax, mode in zip(axes[0], speed_modes, strict=True):
            floor = nan(floor_values(mode, by_mode[("speed", mode)], op)) or [float("nan")] * len(x_values)
            for provider, record in by_mode[("speed", mode)].items():
                if provider not in FLOORS:
                    ax.plot(
                        x_values,
                        [t / f for t, f in zip(nan(record["y_values_50"]), floor, strict=True)],
                        "-o",
                        ms=3,
                        label=provider,
                    )
            ax.axhline(1.0, color="0.5", ls="--", lw=1)
            style(ax, x_label, x_values, "time / floor")
            ax.set_title(f"{mode} (floor: {op.floor_label(mode)})")
            ax.legend(fontsize=7)
        fig.suptitle(f"{op.kernel_name} ratio to the same-run floor, sweep {sweep}, {config['dtype']}")
        fig.tight_layout()
        paths.append(out_dir / f"{op.file_prefix}ratio_{sweep}.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
        if ("memory", "full") in by_mode:
            memory_panels.append((sweep, x_label, x_values, by_mode[("memory", "full")]))

    if memory_panels:
        fig, axes = plt.subplots(1, len(memory_panels), figsize=(5 * len(memory_panels), 4.5), squeeze=False)
        for ax, (sweep, x_label, x_values, memory) in zip(axes[0], memory_panels, strict=True):
            for provider, record in memory.items():
                ax.plot(x_values, nan(record["y_values_50"]), "-o", ms=3, label=provider)
            style(ax, x_label, x_values, "MiB")
            ax.set_title(f"sweep {sweep}")
            ax.legend(fontsize=7)
        fig.suptitle(f"{op.kernel_name} peak extra memory of one full pass")
        fig.tight_layout()
        paths.append(out_dir / f"{op.file_prefix}memory.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def header_lines(args, device: torch.device, gpu_name: str, op: Op = POLY_NORM) -> list[str]:
    """The run's provenance for summary.md: command, device, versions, date, method."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        l2 = getattr(props, "L2_cache_size", 0) / 2**20
        specs = f"{props.multi_processor_count} SMs, {l2:.0f} MiB L2, {props.total_memory / 2**30:.0f} GiB"
        device_line = f"{gpu_name} (sm_{props.major}{props.minor}, {specs})"
        timing = (
            f"`triton.testing.do_bench` (warmup {args.warmup} ms, rep {args.rep} ms, L2 flushed before each "
            "timed call); median ms, with the 20th and 80th percentiles in the JSON"
        )
    else:
        device_line = gpu_name
        timing = (
            f"`torch.utils.benchmark.Timer.blocked_autorange` (min_run_time {args.rep} ms); median ms, with "
            "the 20th and 80th percentiles in the JSON; no memory metric without CUDA"
        )
    versions = [
        f"torch {torch.__version__}",
        f"triton {triton.__version__ if triton else 'not installed'}",
        f"polynorm {polynorm.__version__}",
        f"liger-kernel {liger_version() or 'not installed'}",
        f"Python {platform.python_version()}",
    ]
    return [
        f"- command: `{shlex.join([Path(sys.orig_argv[0]).name, *sys.orig_argv[1:]])}`",
        f"- device: {device_line}",
        f"- software: {', '.join(versions)}",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        (
            f"- inputs: {op.inputs} {args.dtype}; weight fp32 near [0.3, -0.4, 0.9], bias fp32 near 0; "
            f"eps {args.eps}"
        ),
        f"- timing: {timing}",
        (
            f"- floors, same run, same bytes: {op.floors_line}. A cell is time / floor, with ms in brackets; "
            "GB/s = the floor's bytes / time"
        ),
        (
            "- modes: forward with autograd recording; backward = `torch.autograd.grad` of a retained graph "
            f"({op.grads}); full = both"
        ),
    ] + ([CUDA_CAVEAT] if device.type == "cuda" else [])


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Method: see the module docstring.")
    parser.add_argument(
        "--sweep",
        nargs="+",
        choices=(*GPU_SWEEPS, "cpu", "all"),
        default=["all"],
        help="sweeps to run (default all: seed, bytes and tokens on a GPU; cpu without CUDA)",
    )
    parser.add_argument(
        "--op",
        choices=tuple(OPS),
        default=POLY_NORM.name,
        help="the op: poly_norm (default), or poly_norm_mul, the fused PolyNorm x mul",
    )
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="activation dtype (default bf16)")
    defaults = "; ".join(
        f"{op.name}: {' '.join(op.gpu_providers)} on a GPU, {' '.join(op.cpu_providers)} without CUDA"
        for op in OPS.values()
    )
    parser.add_argument(
        "--providers",
        nargs="+",
        choices=PROVIDERS,
        help=f"providers to time, of the op's (default for {defaults}); floors are always timed",
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="modes to time (default all)")
    parser.add_argument(
        "--quick", action="store_true", help="fewer shapes and shorter timing: under 2 minutes on an H200"
    )
    parser.add_argument("--warmup", type=float, help="do_bench warmup, ms (default 25, or 10 with --quick)")
    parser.add_argument(
        "--rep",
        type=float,
        help="do_bench rep, ms; without CUDA, Timer's min_run_time (default 100/200, --quick 25/50)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory metric")
    parser.add_argument("--eps", type=float, default=1e-6)
    parser.add_argument("--out", type=Path, help="output directory (default out/bench-<device>-<date>/)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and triton is None:
        sys.exit("bench: timing on a GPU needs triton (triton.testing.do_bench); pip install triton")
    warmup, rep = TIMING[(args.quick, device.type)]
    args.warmup = warmup if args.warmup is None else args.warmup
    args.rep = rep if args.rep is None else args.rep
    dtype = DTYPES[args.dtype]
    op = OPS[args.op]
    others = [name for name in args.providers or () if name not in op.providers]
    if others:
        sys.exit(f"bench: --op {op.name} has the providers {', '.join(op.providers)}, not {', '.join(others)}")
    gpu_name = device_name(device)
    log = tqdm.write if tqdm else print

    names = args.sweep
    if "all" in names:
        names = list(GPU_SWEEPS) if device.type == "cuda" else ["cpu"]
    sweeps = [make_sweep(name, args.quick) for name in dict.fromkeys(names)]
    if device.type == "cpu" and any(s.name in GPU_SWEEPS for s in sweeps):
        log("bench: no CUDA device; the GPU sweeps' sizes will be slow on the CPU (the default there is --sweep cpu)")

    providers = {}
    for name in args.providers or (op.gpu_providers if device.type == "cuda" else op.cpu_providers):
        try:
            factory = provider_factory(name, args.eps, op)
            warning = check_provider(factory(), dtype, device, args.eps, op)
        except Exception as error:
            log(f"bench: skipping {name}: {first_line(error)}")
            continue
        if warning:
            log(f"bench: warning: {name}: {warning}")
        providers[name] = factory
    if not providers:
        log("bench: no provider could run; timing the floors only")

    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.split(" (")[0].lower()).strip("-")
    out_dir = args.out or Path("out") / f"bench-{slug}-{datetime.date.today().isoformat()}"
    out_dir.mkdir(parents=True, exist_ok=True)
    log(
        f"bench: {op.name}, {gpu_name}, {args.dtype}, providers {', '.join(providers) or 'none'}, "
        f"sweeps {', '.join(s.name for s in sweeps)}, modes {', '.join(args.modes)} -> {out_dir}"
    )

    points = [(sweep, M, H) for sweep in sweeps for M, H in sweep.shapes]
    bar = tqdm(total=len(points), unit="shape", dynamic_ncols=True) if tqdm else None
    records, results = [], {sweep.name: [] for sweep in sweeps}
    for i, (sweep, M, H) in enumerate(points, 1):
        if bar:
            bar.set_description(f"{sweep.name} M={M} H={H}")
        else:
            print(f"[{i}/{len(points)}] sweep {sweep.name}: M={M} H={H}", flush=True)
        results[sweep.name].append(bench_shape(M, H, providers, args, device, log, op))
        if bar:
            bar.update()
        if len(results[sweep.name]) == len(sweep.shapes):
            records += [asdict(r) for r in make_records(sweep, results[sweep.name], gpu_name, dtype, args.eps, op)]
    if bar:
        bar.close()

    json_path = out_dir / f"{op.kernel_name}_bench.json"
    json_path.write_text(json.dumps(records, indent=1) + "\n")
    pngs = plot(records, out_dir, log, op)
    summary = summarize(records, header_lines(args, device, gpu_name, op), op)
    summary_path = out_dir / f"{op.file_prefix}summary.md"
    summary_path.write_text(summary)
    print(summary)
    print(f"bench: wrote {json_path.name}, {summary_path.name} and {len(pngs)} PNGs to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
