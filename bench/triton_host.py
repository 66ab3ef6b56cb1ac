#!/usr/bin/env python3
"""Where the Triton backend's host time goes: microseconds per call, layer by layer,
and, from timestamps, where a forward + ``torch.autograd.grad`` step spends them.

Every figure is the best of 5 rounds: in each round ``--calls`` calls (steps), each timed alone
with ``time.perf_counter_ns``, then a synchronize. Columns of the timing tables:

- ``median us``: the best round's median single call: the host time of one call;
- ``mean us``: the best round's wall time (final synchronize included) / calls: where the GPU
  holds the host back, this is larger than the median.

The objects that exist once the inputs are made are frozen out of the garbage collector
(``gc.freeze()``), whose full passes over torch's objects would otherwise land in random calls.

Tables, in order:

1. Layers of the Triton path on tensors that need no grad (``bare launch``: the kernel alone,
   ``_forward_launch``/``_backward_launch``: outputs, configuration, launches; ``_forward_impl``/
   ``_backward_impl``: plus the argument checks; the autograd Function; ``poly_norm``; the
   registered ops), the CUDA backend's forward, and one ``torch.empty_like`` for scale.
2. Through autograd: x, weight and bias leaves that require grad, ``y = f(x, weight, bias)``
   then ``torch.autograd.grad(y, (x, weight, bias), grad_y)``:
   - (a) kernel-free: ``x.view_as(x)`` (a C++ node) and a Python ``torch.autograd.Function``
     whose forward returns ``x.view_as(x)`` and whose backward returns ``grad_y`` and two
     preallocated parameter gradients: no kernel at all, only autograd's engine. On CUDA the
     backward of a CUDA tensor runs on autograd's device thread; the ``cpu tensors`` rows are
     the same calls on CPU tensors, whose backward runs on the calling thread;
   - (b) that Function with a backward that calls ``_backward_impl`` (checks and launches);
   - the Triton backend (``poly_norm(backend="triton")``: ``PolyNormTritonFunction``), its
     forward alone with a backward recorded, the CUDA backend, and (d) Liger-Kernel's
     ``LigerPolyNormFunction`` (skipped, with a message, when ``liger_kernel`` is absent).
3. (c) Timestamps of the Triton step (and of the no-op Function's), ``--steps`` steps a round:
   ``perf_counter_ns`` (one clock for every thread) at the entry and exit of the Function's
   forward and backward, of autograd's engine call (``torch.autograd._engine_run_backward``),
   of the host helpers of ``polynorm.triton_kernels`` (checks, layouts, launch configuration,
   the device guard) and of each kernel launch, put in place by patching module attributes,
   so the library code runs unchanged. Each interval between consecutive timestamps is listed
   with the best round's median; the code between two helpers (allocations, mostly) shows as
   the interval between the first one's exit and the second one's entry. Then a summary by
   part, for the Triton step and for the no-op Function's: the wrappers around the Function
   (poly_norm, ``Function.apply``, ``torch.autograd.grad``'s Python), our code in the
   Function's forward and backward, the launches, the engine hand-off in (engine entry to
   Function.backward entry: the device thread, the GIL) and out (Function.backward's return
   to the engine's), and freeing y with its graph. The instrumented step's wall time beside
   the plain step's shows what the timestamps cost (about 0.5 us a stamped call); before the
   timed rounds, the instrumented step's gradients must equal the plain step's bit for bit.
4. A cProfile of ``--profile-steps`` plain Triton steps, the 25 functions of most own time.

Run on a GPU (under a minute on an H200, Triton compilation included)::

    python3 bench/triton_host.py                      # M=2048 H=1024 bf16
    python3 bench/triton_host.py --M 16384 --H 4096

Smoke test without a GPU: ``python3 bench/triton_host.py --device cpu`` sets
``TRITON_INTERPRET=1`` (the Triton path takes CPU tensors there) and replaces every kernel
launch by a no-op (the interpreter would run the kernels in Python): the outputs are
garbage, the figures are the host path alone (a before/after of a host-side change without a
GPU; under the interpreter ``_launchable`` also asks whether each tensor is fake, a few us
the GPU path does not pay), and the bare launch, CUDA and Liger rows are skipped.

PolyNorm: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import os
import platform
import pstats
import statistics
import sys
import threading
import time

REPEATS = 5
EPS = 1e-6

# Imported in main(), after --device cpu has chosen Triton's interpreter.
torch = triton = polynorm = tk = None


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a smoke test under TRITON_INTERPRET=1 with no-op launches")
    parser.add_argument("--M", type=int, default=None, help="rows (default 2048 on cuda, 4 on cpu)")
    parser.add_argument("--H", type=int, default=None, help="hidden size (default 1024 on cuda, 64 on cpu)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--calls", type=int, default=300, help="calls per round of each timing row")
    parser.add_argument("--steps", type=int, default=500, help="instrumented steps per round")
    parser.add_argument("--profile-steps", type=int, default=300, help="cProfile'd steps (0: none)")
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------


def timed(fn, calls: int, sync) -> tuple[float, float]:
    """(median us, mean us) of ``fn()``: best of REPEATS rounds (see the module docstring)."""
    fn()  # warm up: caches, compilation
    medians, means = [], []
    clock = time.perf_counter_ns
    for _ in range(REPEATS):
        sync()
        times = [0] * calls
        start = clock()
        for i in range(calls):
            t0 = clock()
            fn()
            times[i] = clock() - t0
        sync()
        means.append((clock() - start) / calls / 1e3)
        medians.append(statistics.median(times) / 1e3)
    return min(medians), min(means)


class Stamps:
    """Named timestamps (``perf_counter_ns``) of the points of one step, step after step. Names
    and times go to two flat lists per step: few objects for the garbage collector."""

    def __init__(self):
        self.steps: list[tuple[list[str], list[int]]] = []
        self._names: list[str] = []
        self._times: list[int] = []
        self.backward_threads: set[int] = set()

    def new_step(self) -> None:
        self._names, self._times = [], []
        self.steps.append((self._names, self._times))

    def __call__(self, name: str) -> None:
        self._names.append(name)
        self._times.append(time.perf_counter_ns())


# Phase boundaries: the category of every interval that starts at or after such a mark, up to
# the next one. An interval from "launch K(" to "launch K)" counts as a launch instead.
_PHASES = {
    "step: forward called": "forward: poly_norm / Function.apply around the body",
    "Function.forward entered": "forward: Function.forward body (our code)",
    "Function.forward returning": "forward: poly_norm / Function.apply around the body",
    "step: forward returned": "step loop",
    "step: autograd.grad called": "autograd.grad: Python wrapper",
    "engine entered": "engine hand-off in (engine entry -> Function.backward entry)",
    "Function.backward entered": "backward: Function.backward body (our code)",
    "Function.backward returning": "engine hand-off out (Function.backward return -> engine exit)",
    "engine returned": "autograd.grad: Python wrapper",
    "step: autograd.grad returned": "freeing y and its graph (Function ctx, saved tensors)",
}
_LAUNCH_CATEGORY = {"forward": "forward: kernel launch", "backward": "backward: kernel launches"}


def summarise(stamps: Stamps, rounds: list[tuple[int, int]]):
    """Per interval and per category: the best round's median (us).

    Args:
        rounds: (first step, end step) of each round in ``stamps.steps``.

    Returns:
        (intervals, categories, total): [(from, to, category, us)] in step order,
        {category: us}, and the best round's median step time (first to last stamp).
    """
    names = stamps.steps[rounds[0][0]][0]
    if any(step_names != names for step_names, _ in stamps.steps[rounds[0][0]:]):
        raise RuntimeError("triton_host: the instrumented steps did not all pass the same points")
    categories, phase = [], "step loop"
    for a, b in zip(names, names[1:]):
        phase = _PHASES.get(a, phase)
        if a.startswith("launch ") and a.endswith("(") and b == a[:-1] + ")":
            categories.append(_LAUNCH_CATEGORY["backward" if "backward" in phase or "engine" in phase else "forward"])
        else:
            categories.append(phase)
    best_interval = [float("inf")] * len(categories)
    best_category: dict[str, float] = {}
    best_total = float("inf")
    for lo, hi in rounds:
        deltas = [[b - a for a, b in zip(times, times[1:])] for _, times in stamps.steps[lo:hi]]
        for i in range(len(categories)):
            best_interval[i] = min(best_interval[i], statistics.median(d[i] for d in deltas) / 1e3)
        for cat in dict.fromkeys(categories):
            per_step = [sum(d[i] for i, c in enumerate(categories) if c == cat) for d in deltas]
            best_category[cat] = min(best_category.get(cat, float("inf")), statistics.median(per_step) / 1e3)
        best_total = min(best_total, statistics.median(sum(d) for d in deltas) / 1e3)
    intervals = list(zip(names, names[1:], categories, best_interval))
    return intervals, best_category, best_total


# ----------------------------------------------------------------------------------------
# Instrumentation: timestamps around the library's own functions, by patching attributes
# ----------------------------------------------------------------------------------------


class _Kernel:
    """A JIT kernel stand-in: ``kernel[grid](...)`` stamps around the real launch, or (``run``
    False: the CPU smoke test) launches nothing."""

    def __init__(self, kernel, name: str, stamps, run: bool):
        self.kernel, self.stamps, self.run = kernel, stamps, run
        self.enter, self.exit = f"launch {name}(", f"launch {name})"

    def __getitem__(self, grid):
        stamps, done = self.stamps, self.exit
        if stamps is not None:
            stamps(self.enter)
        launcher = self.kernel[grid] if self.run else None

        def launch(*args, **kwargs):
            if launcher is not None:
                launcher(*args, **kwargs)
            if stamps is not None:
                stamps(done)

        return launch


_KERNELS = ("_poly_norm_fwd_kernel", "_poly_norm_bwd_kernel", "_poly_norm_bwd_param_kernel")
# Host helpers of polynorm.triton_kernels stamped at entry and exit when the module has them.
_HELPERS = (
    "_forward_impl", "_forward_launch", "_backward_impl", "_backward_launch", "check_forward_args",
    "check_backward_args", "_saved_args_hold", "_check_runs_here", "_as_rows", "_launch_config",
    "_bwd_num_programs", "_launchable", "_as_param",
)  # fmt: skip


@contextlib.contextmanager
def patched(stamps: Stamps | None, run_kernels: bool):
    """Within: the kernels of ``polynorm.triton_kernels`` stand-ins (stamped and/or no-op), and,
    with ``stamps``, timestamps around its helpers, the Function's forward and backward and
    autograd's engine call. Restores everything on exit."""
    saved = []

    def put(owner, name, value):
        saved.append((owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)))
        setattr(owner, name, value)

    interpreted = tk._interpreted()
    try:
        put(tk, "_interpreted", lambda: interpreted)  # it looks at the forward kernel's type
        if interpreted:  # the ops' wrap_triton hands an interpreted kernel back as it is
            put(tk, "wrap_triton", lambda kernel: kernel)
        for name in _KERNELS:
            put(tk, name, _Kernel(getattr(tk, name), name.removeprefix("_poly_norm_"), stamps, run_kernels))
        if stamps is not None:
            for name in _HELPERS:
                if hasattr(tk, name):
                    put(tk, name, _stamped(getattr(tk, name), name, stamps))
            put(tk, "_on_device_of", _stamped_guard(tk._on_device_of, stamps))
            put(torch.autograd, "_engine_run_backward", _stamped_engine(torch.autograd._engine_run_backward, stamps))
            fn = tk.PolyNormTritonFunction
            put(fn, "forward", staticmethod(_stamped_forward(fn.forward, stamps)))
            put(fn, "backward", staticmethod(_stamped_backward(fn.backward, stamps)))
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def _stamped(fn, name, stamps):
    enter, exit_ = name + "(", name + ")"

    def call(*args, **kwargs):
        stamps(enter)
        out = fn(*args, **kwargs)
        stamps(exit_)
        return out

    return call


def _stamped_guard(on_device_of, stamps):
    class Guard:
        def __init__(self, inner):
            self.inner = inner

        def __enter__(self):
            stamps("device guard enter(")
            self.inner.__enter__()
            stamps("device guard enter)")

        def __exit__(self, *exc):
            stamps("device guard exit(")
            out = self.inner.__exit__(*exc)
            stamps("device guard exit)")
            return out

    def call(x):
        stamps("_on_device_of(")
        guard = Guard(on_device_of(x))
        stamps("_on_device_of)")
        return guard

    return call


def _stamped_engine(run_backward, stamps):
    def call(*args, **kwargs):
        stamps("engine entered")
        out = run_backward(*args, **kwargs)
        stamps("engine returned")
        return out

    return call


def _stamped_forward(forward, stamps):
    def call(ctx, *args):
        stamps("Function.forward entered")
        out = forward(ctx, *args)
        stamps("Function.forward returning")
        return out

    return call


def _stamped_backward(backward, stamps):
    def call(ctx, *grads):
        stamps("Function.backward entered")
        stamps.backward_threads.add(threading.get_ident())
        out = backward(ctx, *grads)
        stamps("Function.backward returning")
        return out

    return call


def make_noop_function():
    """(a): a Python autograd Function with no kernel: forward ``x.view_as(x)``, backward
    ``grad_y`` and two preallocated parameter gradients. ``stamps`` (a class attribute) set:
    timestamps at the entry and exit of forward and backward."""

    class NoOp(torch.autograd.Function):
        stamps = None
        grad_params = None  # (grad_weight, grad_bias), made once per shape

        @staticmethod
        def forward(ctx, x, weight, bias):
            if NoOp.stamps is not None:
                NoOp.stamps("Function.forward entered")
            y = x.view_as(x)
            if NoOp.stamps is not None:
                NoOp.stamps("Function.forward returning")
            return y

        @staticmethod
        def backward(ctx, grad_y):
            stamps = NoOp.stamps
            if stamps is not None:
                stamps("Function.backward entered")
                stamps.backward_threads.add(threading.get_ident())
            out = (grad_y, *NoOp.grad_params)
            if stamps is not None:
                stamps("Function.backward returning")
            return out

    return NoOp


def make_backward_impl_function(rstd):
    """(b): the no-op forward, with a backward that runs ``_backward_impl`` (checks, outputs,
    two launches) on a saved rstd, and hands back gradients as PolyNormTritonFunction does."""

    class BackwardImpl(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight)
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad_y):
            x, weight = ctx.saved_tensors
            grad_x, grad_weight, grad_bias = tk._backward_impl(grad_y, x, weight, rstd, tk._launch_directly)
            return grad_x, grad_weight, grad_bias

    return BackwardImpl


# ----------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda = args.device == "cuda"
    if not cuda:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("triton_host: --device cpu needs TRITON_INTERPRET=1 before triton is imported")
        os.environ["TRITON_INTERPRET"] = "1"
    global torch, triton, polynorm, tk
    import torch
    import triton

    import polynorm
    from polynorm import triton_kernels as tk

    M = args.M if args.M is not None else (2048 if cuda else 4)
    H = args.H if args.H is not None else (1024 if cuda else 64)
    dtype = getattr(torch, args.dtype)
    dev = torch.device(args.device)
    if cuda and not torch.cuda.is_available():
        raise SystemExit("triton_host: no CUDA device (use --device cpu for the smoke test)")
    if not cuda:
        torch.set_num_threads(1)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    calls = args.calls

    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(M, H, device=dev, dtype=dtype, generator=gen)
    g = torch.randn(M, H, device=dev, dtype=dtype, generator=gen)
    w = torch.tensor([0.3, -0.4, 0.9], device=dev)
    b = torch.tensor([0.1], device=dev)
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    leaves = (xr, wr, br)

    # What exists now (torch's and triton's modules, the inputs) is never scanned again by the
    # garbage collector, whose full passes would otherwise land, at random, inside timed calls.
    gc.collect()
    gc.freeze()
    # On the CPU every launch is a no-op for the whole run: host path only.
    stack = contextlib.ExitStack()
    if not cuda:
        stack.enter_context(patched(None, run_kernels=False))
    with stack:
        device_name = torch.cuda.get_device_name() if cuda else (platform.processor() or platform.machine())
        print(f"# Triton host time, M={M} H={H} {args.dtype}, {args.device}: {device_name}; torch {torch.__version__}, "
              f"triton {triton.__version__}, Python {platform.python_version()} (GIL switch interval "
              f"{sys.getswitchinterval() * 1e3:g} ms); best of {REPEATS} rounds")
        if not cuda:
            print("# CPU smoke test: TRITON_INTERPRET=1 and every kernel launch a no-op (outputs are garbage): "
                  "host path only")
        layer_rows(args, x, w, b, g, sync, calls)
        autograd_rows(args, x, w, b, g, leaves, sync, calls)
        stamp_rows(args, leaves, g, sync)
        if args.profile_steps:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.profile_steps):
                torch.autograd.grad(polynorm.poly_norm(*leaves, EPS, backend="triton"), leaves, g)
            sync()
            prof.disable()
            print(f"\n# cProfile of {args.profile_steps} forward+backward steps (triton), by own time")
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return 0


def _print_rows(title: str, rows, sync, calls: int) -> dict[str, float]:
    print(f"\n| {title} | median us | mean us |\n|---|---|---|")
    medians = {}
    for name, fn in rows:
        if isinstance(fn, str):  # a reason to skip
            print(f"| {name} | skipped: {fn} | |")
            continue
        median, mean = timed(fn, calls, sync)
        medians[name] = median
        print(f"| {name} | {median:.1f} | {mean:.1f} |", flush=True)
    return medians


def layer_rows(args, x, w, b, g, sync, calls: int) -> None:
    cuda = args.device == "cuda"
    M, H = x.shape
    y, rstd = tk._forward_impl(x, w, b, EPS, tk._launch_directly)
    no_gpu = "no GPU: launches are no-ops here"
    if cuda:
        fwd_m, fwd_h, fwd_one, fwd_warps = tk._launch_config(H, x.dtype, "forward")
        bwd_m, bwd_h, bwd_one, bwd_warps = tk._launch_config(H, x.dtype, "backward")
        programs, cap = tk._bwd_num_programs((M + bwd_m - 1) // bwd_m, bwd_warps, x.device)
        grad_x = torch.empty_like(x)
        partials = torch.empty((cap, 4), device=x.device)
        grad_w, grad_b = torch.empty(3, device=x.device), torch.empty(1, device=x.device)

        def bare_forward():  # the arguments _forward_launch passes, without mul
            tk._poly_norm_fwd_kernel[((M + fwd_m - 1) // fwd_m,)](
                x, H, x, H, y, rstd, w, 1, b, M, H, EPS,
                BLOCK_M=fwd_m, BLOCK_H=fwd_h, ONE_BLOCK=fwd_one, HAS_MUL=False, num_warps=fwd_warps,
            )  # fmt: skip

        def bare_backward():  # the two launches of _backward_launch, without mul
            tk._poly_norm_bwd_kernel[(programs,)](
                g, H, g, H, x, H, rstd, w, 1, w, grad_x, g, partials, M, H,
                BLOCK_M=bwd_m, BLOCK_H=bwd_h, ONE_BLOCK=bwd_one, HAS_MUL=False, num_warps=bwd_warps,
            )  # fmt: skip
            tk._poly_norm_bwd_param_kernel[(1,)](partials, programs, grad_w, grad_b, BLOCK_P=256, num_warps=4)

    launch = tk._launch_directly
    rows = [
        ("forward: bare launch", bare_forward if cuda else no_gpu),
        ("forward: _forward_launch (outputs, config, launch)", lambda: tk._forward_launch(x, None, w, b, EPS, launch)),
        ("forward: _forward_impl (+ checks)", lambda: tk._forward_impl(x, w, b, EPS, launch)),
        ("forward: PolyNormTritonFunction.apply, no backward recorded",
         lambda: tk.PolyNormTritonFunction.apply(x, w, b, EPS, False)),
        ("forward: poly_norm(backend='triton'), no backward recorded",
         lambda: polynorm.poly_norm(x, w, b, EPS, backend="triton")),
        ("forward: torch.ops.polynorm.forward_triton", lambda: torch.ops.polynorm.forward_triton(x, w, b, EPS)),
        ("backward: bare launches (2)", bare_backward if cuda else no_gpu),
        ("backward: _backward_launch (outputs, config, launches)",
         lambda: tk._backward_launch(g, x, None, w, None, rstd, launch)),
        ("backward: _backward_impl (+ checks)", lambda: tk._backward_impl(g, x, w, rstd, launch)),
        ("backward: torch.ops.polynorm.backward_triton", lambda: torch.ops.polynorm.backward_triton(g, x, w, rstd)),
        ("forward: poly_norm(backend='cuda'), no backward recorded",
         (lambda: polynorm.poly_norm(x, w, b, EPS, backend="cuda")) if cuda else "CUDA backend"),
        ("torch.empty_like(x) (one allocation)", lambda: torch.empty_like(x)),
    ]  # fmt: skip
    _print_rows("layer (no grad)", rows, sync, calls)


def autograd_rows(args, x, w, b, g, leaves, sync, calls: int) -> None:
    cuda = args.device == "cuda"
    dev = x.device
    _, rstd = tk._forward_impl(x, w, b, EPS, tk._launch_directly)
    NoOp = make_noop_function()
    BackwardImpl = make_backward_impl_function(rstd)

    def on(device):
        """Leaves on ``device`` and the no-op Function's parameter gradients there."""
        ls = tuple(t.detach().to(device).requires_grad_() for t in leaves)
        return ls, g.to(device), (torch.zeros_like(ls[1]), torch.zeros_like(ls[2]))

    def noop_full(device):
        ls, gd, grad_params = on(device)

        def full():
            NoOp.grad_params = grad_params
            torch.autograd.grad(NoOp.apply(*ls), ls, gd)

        return full

    def view_full(device):
        ls, gd, _ = on(device)
        return lambda: torch.autograd.grad(ls[0].view_as(ls[0]), ls[0], gd)

    def full(fn, ls=leaves):
        return lambda: torch.autograd.grad(fn(*ls), ls, g)

    def triton_forward():
        return polynorm.poly_norm(*leaves, EPS, backend="triton")

    liger = "liger_kernel is not installed" if cuda else "no GPU"
    if cuda:
        try:
            from liger_kernel.ops.poly_norm import LigerPolyNormFunction
        except ImportError as error:
            liger = f"liger_kernel.ops.poly_norm does not import ({error})"
        else:
            # bias 0-d: Liger returns a 0-d grad_bias, which autograd refuses for a (1,) bias;
            # in_place=False: Liger would otherwise write dx over grad_y, reused by every call.
            liger_leaves = (leaves[0], leaves[1], leaves[2].detach().reshape(()).requires_grad_())
            liger = full(lambda *ls: LigerPolyNormFunction.apply(*ls, EPS, False), liger_leaves)
    dev_label = "cuda tensors" if cuda else "cpu tensors"
    rows = [
        (f"(a) kernel-free: x.view_as(x) (C++ node, grad of x only), {dev_label}", view_full(dev)),
        (f"(a) kernel-free: no-op Python Function, {dev_label}", noop_full(dev)),
    ]
    if cuda:
        rows += [
            ("(a) kernel-free: x.view_as(x) (C++ node, grad of x only), cpu tensors", view_full(torch.device("cpu"))),
            ("(a) kernel-free: no-op Python Function, cpu tensors", noop_full(torch.device("cpu"))),
        ]
    rows += [
        ("(b) no-op forward, backward = _backward_impl", full(BackwardImpl.apply)),
        ("triton: forward only, backward recorded (graph dropped)", triton_forward),
        ("triton: poly_norm + autograd.grad", full(lambda *ls: polynorm.poly_norm(*ls, EPS, backend="triton"))),
        ("cuda: poly_norm + autograd.grad",
         full(lambda *ls: polynorm.poly_norm(*ls, EPS, backend="cuda")) if cuda else "CUDA backend"),
        ("(d) liger: LigerPolyNormFunction + autograd.grad", liger),
    ]
    _print_rows("through autograd: forward + torch.autograd.grad of (x, weight, bias)", rows, sync, calls)


def stamp_rows(args, leaves, g, sync) -> None:
    """(c): the instrumented Triton step and no-op step, interval by interval and by part."""
    cuda = args.device == "cuda"
    steps = args.steps

    def triton_step():
        return polynorm.poly_norm(*leaves, EPS, backend="triton")

    NoOp = make_noop_function()
    NoOp.grad_params = (torch.zeros_like(leaves[1]), torch.zeros_like(leaves[2]))

    def run(forward, stamps, patch):
        """REPEATS rounds of ``steps`` stamped steps; returns the rounds' step ranges and the
        best round's mean wall time per step (us)."""
        rounds, best_wall = [], float("inf")
        with patch:
            for r in range(REPEATS + 1):  # round 0 warms up and is dropped
                sync()
                lo, t0 = len(stamps.steps), time.perf_counter_ns()
                for _ in range(steps):
                    stamps.new_step()
                    stamps("step: forward called")
                    y = forward()
                    stamps("step: forward returned")
                    stamps("step: autograd.grad called")
                    torch.autograd.grad(y, leaves, g)
                    stamps("step: autograd.grad returned")
                    del y
                    stamps("step: y and its graph freed")
                sync()
                if r:
                    rounds.append((lo, len(stamps.steps)))
                    best_wall = min(best_wall, (time.perf_counter_ns() - t0) / steps / 1e3)
        return rounds, best_wall

    # The instrumented Triton step must compute what the plain one does (on the GPU).
    plain = torch.autograd.grad(triton_step(), leaves, g)
    triton_stamps = Stamps()
    with patched(triton_stamps, run_kernels=cuda):
        triton_stamps.new_step()
        same = all(torch.equal(p, q) for p, q in zip(plain, torch.autograd.grad(triton_step(), leaves, g)))
    if cuda and not same:
        raise RuntimeError("triton_host: the instrumented Triton step's gradients differ from the plain step's")
    triton_stamps = Stamps()
    triton_rounds, triton_wall = run(triton_step, triton_stamps, patched(triton_stamps, run_kernels=cuda))
    plain_median, plain_wall = timed(lambda: torch.autograd.grad(triton_step(), leaves, g), steps, sync)

    noop_stamps = Stamps()
    NoOp.stamps = noop_stamps
    noop_patch = contextlib.ExitStack()
    noop_patch.enter_context(_patch_engine_only(noop_stamps))
    noop_rounds, noop_wall = run(lambda: NoOp.apply(*leaves), noop_stamps, noop_patch)
    NoOp.stamps = None

    if "engine entered" not in triton_stamps.steps[-1][0]:
        print("\n# note: torch.autograd._engine_run_backward was not called: the engine's hand-off is counted "
              "in 'autograd.grad: Python wrapper'")
    intervals, triton_parts, triton_total = summarise(triton_stamps, triton_rounds)
    _, noop_parts, noop_total = summarise(noop_stamps, noop_rounds)
    print(f"\n# (c) Timestamps: the Triton step (poly_norm + autograd.grad), {steps} steps a round; "
          "best round's median per interval")
    print("| # | from | to | part | median us |\n|---|---|---|---|---|")
    for i, (a, b, cat, us) in enumerate(intervals):
        print(f"| {i} | {a} | {b} | {cat} | {us:.2f} |")
    def thread(s: Stamps) -> str:
        return "the calling thread" if s.backward_threads == {threading.get_ident()} else "autograd's device thread"

    print(f"\n# By part: best round's median per step (us). Function.backward ran on: triton {thread(triton_stamps)}, "
          f"no-op {thread(noop_stamps)}")
    print("| part | triton step | no-op Function step |\n|---|---|---|")
    for cat in dict.fromkeys([*triton_parts, *noop_parts]):
        t, n = triton_parts.get(cat), noop_parts.get(cat)
        print(f"| {cat} | {'' if t is None else f'{t:.1f}'} | {'' if n is None else f'{n:.1f}'} |")
    print(f"| sum of the intervals (first to last timestamp) | {triton_total:.1f} | {noop_total:.1f} |")
    print(f"| wall per instrumented step (mean, best round) | {triton_wall:.1f} | {noop_wall:.1f} |")
    print(f"| plain (uninstrumented) step: median, mean | {plain_median:.1f}, {plain_wall:.1f} | |")

    def part(parts, *prefixes):
        return sum(us for cat, us in parts.items() if cat.startswith(prefixes))

    hand_off = part(triton_parts, "engine hand-off")
    ours = part(triton_parts, "forward: Function.forward body", "backward: Function.backward body")
    launches = part(triton_parts, "forward: kernel", "backward: kernel")
    around = part(triton_parts, "forward: poly_norm", "autograd.grad:")
    print(f"\nTriton step: engine hand-off (in + out) {hand_off:.1f} us (no-op Function: "
          f"{part(noop_parts, 'engine hand-off'):.1f}); our code in the Function bodies {ours:.1f} us; "
          f"kernel launches {launches:.1f} us; poly_norm / Function.apply / autograd.grad wrappers {around:.1f} us.")


@contextlib.contextmanager
def _patch_engine_only(stamps):
    saved = torch.autograd._engine_run_backward
    torch.autograd._engine_run_backward = _stamped_engine(saved, stamps)
    try:
        yield
    finally:
        torch.autograd._engine_run_backward = saved


if __name__ == "__main__":
    raise SystemExit(main())
