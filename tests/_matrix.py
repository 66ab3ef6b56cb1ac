"""The shared test matrix and float64 oracle for every polynorm backend.

Every backend (the C++ CPU kernel, the CUDA kernels, Triton) is checked through the
helpers here: the same shapes, dtypes and layouts, the same oracle
(:func:`polynorm.reference.poly_norm` run in float64 and differentiated by autograd),
and the same dtype-derived tolerances.
"""

import contextlib
import dataclasses
import hashlib
import importlib.util
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import polynorm
from polynorm import reference

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (torch.cuda.is_available() is False)")
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
requires_triton = pytest.mark.skipif(not HAS_TRITON, reason="needs the triton package")
# Triton runs CPU tensors only in its interpreter, which conftest.py turns on when there is
# no CUDA device (it must be chosen before polynorm is imported).
requires_interpreter = pytest.mark.skipif(
    not INTERPRET,
    reason="Triton runs CPU tensors only under TRITON_INTERPRET=1 (conftest sets it when CUDA is absent)",
)
# (device, backend) pairs that run a kernel of this project, for the shared matrix.
BACKENDS = [
    ("cpu", "auto"),
    pytest.param("cpu", "triton", marks=[requires_triton, requires_interpreter]),
    pytest.param("cuda", "cuda", marks=requires_cuda),
    pytest.param("cuda", "triton", marks=[requires_triton, requires_cuda]),
]

# Layouts of x (and grad_y) that every backend must accept.
# - contiguous: a fresh (M, H) tensor.
# - sliced: rows of a wider buffer, (M, H + 3)[:, :H]: strided rows, read in place.
# - misaligned: buf[1:].view(M, H): rows start off a 16-byte boundary.
# - transposed: (H, M).t(): last-dim stride M, copied once.
# - 3d / 4d: leading dims that collapse into one row stride.
LAYOUTS = ["contiguous", "sliced", "misaligned", "transposed", "3d", "4d"]

# Unit roundoff of the accumulation: fp32 for fp16/bf16/fp32, fp64 for fp64.
def compute_eps(dtype: torch.dtype) -> float:
    return torch.finfo(torch.float64).eps / 2 if dtype == torch.float64 else torch.finfo(torch.float32).eps / 2


def seed_for(*key) -> int:
    """A fresh, reproducible seed per test case (a failure replays exactly)."""
    return int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:4], "little")


def make_rows(M: int, H: int, dtype, device, layout: str, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Random normal values (never zeros) in the requested layout, logical shape (M, H) or 3-D/4-D."""

    def randn(*shape):
        return (torch.randn(*shape, generator=gen, dtype=torch.float32) * scale).to(dtype).to(device)

    if layout == "contiguous":
        return randn(M, H)
    if layout == "sliced":
        return randn(M, H + 3)[:, :H]
    if layout == "misaligned":
        return randn(M * H + 1)[1:].view(M, H)
    if layout == "transposed":
        return randn(H, M).t()
    if layout == "3d":
        return randn(M, 2, H + 1)[:, :, :H]
    if layout == "4d":
        return randn(2, M, 2, H)
    raise ValueError(layout)


def make_params(dtype, device, gen: torch.Generator):
    """weight (3,) and bias (1,) with random values of both signs, in ``dtype``."""
    w = torch.randn(3, generator=gen, dtype=torch.float32) * 0.5 + torch.tensor([0.3, -0.4, 0.9])
    b = torch.randn(1, generator=gen, dtype=torch.float32) * 0.1
    return w.to(dtype).to(device), b.to(dtype).to(device)


@contextlib.contextmanager
def poisoned_outputs():
    """Every torch.empty / at::empty inside (the ops' outputs, rstd, the row partials, from
    Python, C++ or a Triton launcher) comes back filled with NaN (integers with their maximum),
    so an element a kernel fails to write shows up, as a NaN or as a nonzero where a 0 is
    expected. torch's deterministic mode does the filling; warn_only, as only the filling is
    wanted."""
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.utils.deterministic.fill_uninitialized_memory = saved[2]


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    denom = b.norm().item()
    return (a - b).norm().item() / denom if denom > 0 else (a - b).norm().item()


@dataclass
class Grads:
    y: torch.Tensor
    dx: torch.Tensor
    dw: torch.Tensor
    db: torch.Tensor


def closed_form(x, g, w, b, eps):
    """docs/MATH.md's formulas written out in float64, not through autograd.

    Returns the results and, for the tolerances, each result's scale: the sum of the
    magnitudes of the terms it adds up (an fp computation's error is a few units of
    roundoff times that, however much the terms cancel).
    """
    x = x.double().reshape(-1, x.shape[-1])
    g = g.double().reshape(-1, x.shape[-1])
    w = w.double().reshape(3)
    b = b.double().reshape(())
    H = x.shape[-1]
    r = {p: 1.0 / torch.sqrt((x ** (2 * p)).mean(-1, keepdim=True) + eps) for p in (1, 2, 3)}
    wp = {3: w[0], 2: w[1], 1: w[2]}
    y_terms = [wp[p] * x**p * r[p] for p in (1, 2, 3)]
    y = sum(y_terms) + b
    y_scale = sum(t.abs() for t in y_terms) + b.abs()
    S = {p: (g * x**p).sum(-1, keepdim=True) for p in (1, 2, 3)}
    dx_terms = []
    for p in (1, 2, 3):
        c = wp[p] * p * r[p]
        dx_terms.append(c * x ** (p - 1) * g)
        dx_terms.append(-c * x ** (2 * p - 1) * r[p] ** 2 * S[p] / H)
    dx = sum(dx_terms)
    dx_scale = sum(t.abs() for t in dx_terms)
    dw = torch.stack([(r[3] * S[3]).sum(), (r[2] * S[2]).sum(), (r[1] * S[1]).sum()])
    dw_scale = torch.stack([(r[p] * (g * x**p).abs().sum(-1, keepdim=True)).sum() for p in (3, 2, 1)])
    db = g.sum().reshape(1)
    db_scale = g.abs().sum().reshape(1)
    return Grads(y, dx, dw, db), Grads(y_scale, dx_scale, dw_scale, db_scale)


def autograd_reference(x, g, w, b, eps, compute_dtype):
    """y, dx, dw, db from polynorm.reference and autograd, computed in ``compute_dtype``.

    With float64 the inputs are upcast first (exactly), so the results stay float64:
    that is the oracle. Otherwise y is rounded to x's dtype as a user would get it.
    """
    if compute_dtype == torch.float64:
        x, g, w, b = x.double(), g.double(), w.double(), b.double()
    x_ = x.detach().clone().requires_grad_(True)
    w_ = w.detach().clone().requires_grad_(True)
    b_ = b.detach().clone().requires_grad_(True)
    y = reference.poly_norm(x_, w_, b_, eps, compute_dtype=compute_dtype)
    dx, dw, db = torch.autograd.grad(y, (x_, w_, b_), g)
    return Grads(y.detach(), dx, dw, db)


def run_backend(backend: str, x, g, w, b, eps):
    """y, dx, dw, db from a polynorm backend through the public API (autograd included),
    every buffer allocated on the way filled with NaN first (:func:`poisoned_outputs`), so an
    unwritten output element fails the oracle check. x reaches the kernels in its own layout,
    storage offset (so alignment) included."""
    x_ = _same_layout_leaf(x)
    w_ = w.detach().clone().requires_grad_(True)
    b_ = b.detach().clone().requires_grad_(True)
    with poisoned_outputs():
        y = polynorm.poly_norm(x_, w_, b_, eps, backend=backend)
        dx, dw, db = torch.autograd.grad(y, (x_, w_, b_), g)
    return Grads(y.detach(), dx, dw, db)


def _same_layout_leaf(x):
    """A leaf that requires grad and keeps x's strides and storage offset (so the kernels see
    the layout, a row start off a 16-byte boundary included)."""
    base = x.detach()
    storage = torch.empty(base.untyped_storage().nbytes() // base.element_size(), dtype=base.dtype, device=base.device)
    leaf = storage.as_strided(base.size(), base.stride(), base.storage_offset())
    leaf.copy_(base)
    return leaf.detach().requires_grad_(True)


def check_against_oracle(out: Grads, x, g, w, b, eps, what: str = ""):
    """Asserts a backend's results against the float64 oracle, with dtype-derived tolerances.

    - y and dx: relative L2 error at most 1.05x that of the fp32-upcast reference rounded
      to x's dtype, plus 16 units of accumulation roundoff times the terms' scale. The
      second term is the error any fp32 (fp64) computation of these sums may make in a
      different order; it is ~1e-6 relative, negligible next to the first for fp16/bf16
      (1e-4..1e-3), and what bounds fp32/fp64, where the rounding to x's dtype is no
      larger than the computation's own error.
    - dw and db: accumulated in fp32 (fp64), within 1e-5 relative, plus the same
      roundoff-times-scale term, plus the one rounding to the parameter's dtype.
    """
    oracle = autograd_reference(x, g, w, b, eps, torch.float64)
    ref32 = autograd_reference(x, g, w, b, eps, torch.float32)
    _, scale = closed_form(x, g, w, b, eps)
    u = compute_eps(x.dtype)
    for name in ("y", "dx"):
        got = getattr(out, name)
        exp = getattr(oracle, name)
        assert got.shape == exp.shape and got.dtype == x.dtype, (what, name, got.shape, got.dtype)
        assert torch.isfinite(got).all(), f"{what} {name}: non-finite values"
        err = rel_l2(got, exp)
        err_ref = rel_l2(getattr(ref32, name).to(x.dtype), exp)
        slack = 16 * u * getattr(scale, name).norm().item() / max(exp.double().norm().item(), 1e-300)
        bound = 1.05 * err_ref + slack
        assert err <= bound, f"{what} {name}: rel L2 error {err:.3e} > bound {bound:.3e} (fp32 reference {err_ref:.3e})"
    for name in ("dw", "db"):
        got = getattr(out, name).double().reshape(-1)
        exp = getattr(oracle, name).double().reshape(-1)
        sc = getattr(scale, name).double().reshape(-1).to(exp.device)
        u_out = torch.finfo(getattr(out, name).dtype).eps / 2
        tol = (1e-5 + u_out) * exp.abs() + 16 * u * sc * math.log2(max(2, x.numel()))
        assert torch.all((got - exp).abs() <= tol), f"{what} {name}: got {got.tolist()}, expected {exp.tolist()}"


# ---------------------------------------------------------------------------------------
# The fused PolyNorm x mul, out = poly_norm(x) * mul: the same oracle and tolerances
# ---------------------------------------------------------------------------------------
# The oracle is polynorm.reference.poly_norm_mul in float64, differentiated by autograd. The
# output-rounding floor of out, dx and dmul is that of the fp32 reference, which forms y and
# y * mul in fp32 and rounds each result once to x's dtype.


@dataclass
class MulGrads:
    out: torch.Tensor
    dx: torch.Tensor
    dmul: torch.Tensor
    dw: torch.Tensor
    db: torch.Tensor


def _leaf(t: torch.Tensor) -> torch.Tensor:
    """A leaf that requires grad and keeps t's layout: expanded (stride-0) rows included,
    which cannot be copied into, so the leaf is then t's own detached view."""
    if any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape)):
        return t.detach().requires_grad_(True)
    return _same_layout_leaf(t)


def autograd_reference_mul(x, mul, g, w, b, eps, compute_dtype) -> MulGrads:
    """out, dx, dmul, dw, db from polynorm.reference.poly_norm_mul and autograd (float64:
    the oracle, as :func:`autograd_reference`)."""
    if compute_dtype == torch.float64:
        x, mul, g, w, b = (t.double() for t in (x, mul, g, w, b))
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, mul, w, b)]
    out = reference.poly_norm_mul(*leaves, eps, compute_dtype=compute_dtype)
    return MulGrads(out.detach(), *torch.autograd.grad(out, leaves, g))


def run_backend_mul(backend: str, x, mul, g, w, b, eps, fn=None, poison: bool = True) -> MulGrads:
    """out, dx, dmul, dw, db through the public API (autograd included), x and mul in their
    own layouts; ``fn(x, mul, weight, bias, eps)`` replaces ``polynorm.poly_norm_mul``. With
    ``poison``, every buffer allocated on the way is filled with NaN first
    (:func:`poisoned_outputs`), so an unwritten output element fails the oracle check."""
    leaves = [_leaf(x), _leaf(mul), w.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)]
    with poisoned_outputs() if poison else contextlib.nullcontext():
        if fn is None:
            out = polynorm.poly_norm_mul(*leaves, eps, backend=backend)
        else:
            out = fn(*leaves, eps)
        return MulGrads(out.detach(), *torch.autograd.grad(out, leaves, g))


def closed_form_mul(x, mul, g, w, b, eps):
    """:func:`closed_form` for out = y * mul: PolyNorm's with the gradient g * mul, plus
    out = y * mul and dmul = g * y, and the scales (sums of the terms' magnitudes)."""
    x2 = x.double().reshape(-1, x.shape[-1])
    m = mul.double().reshape_as(x2)
    g2 = g.double().reshape_as(x2)
    exact, scale = closed_form(x2, g2 * m, w, b, eps)
    return (
        MulGrads(exact.y * m, exact.dx, g2 * exact.y, exact.dw, exact.db),
        MulGrads(scale.y * m.abs(), scale.dx, g2.abs() * scale.y, scale.dw, scale.db),
    )


def oracle_mul(x, mul, g, w, b, eps):
    """The float64 oracle, the fp32 reference and the terms' scales for out = y * mul."""
    oracle = autograd_reference_mul(x, mul, g, w, b, eps, torch.float64)
    ref32 = autograd_reference_mul(x, mul, g, w, b, eps, torch.float32)
    return oracle, ref32, closed_form_mul(x, mul, g, w, b, eps)[1]


def floor_errors_mul(got: MulGrads, x, mul, g, w, b, eps, oracle=None) -> dict:
    """For out, dx and dmul: (relative L2 error against the float64 oracle, its bound, the
    floor). The floor is the error of the fp32 reference, rounded once to x's dtype; the
    bound is 1.05x the floor plus 16 units of accumulation roundoff times the terms' scale,
    as in :func:`check_against_oracle`. ``oracle``: :func:`oracle_mul`'s result, if at hand."""
    oracle, ref32, scale = oracle or oracle_mul(x, mul, g, w, b, eps)
    u = compute_eps(x.dtype)
    errors = {}
    for name in ("out", "dx", "dmul"):
        exp = getattr(oracle, name)
        floor = rel_l2(getattr(ref32, name), exp)
        slack = 16 * u * getattr(scale, name).norm().item() / max(exp.double().norm().item(), 1e-300)
        errors[name] = (rel_l2(getattr(got, name), exp), 1.05 * floor + slack, floor)
    return errors


def check_against_oracle_mul(out: MulGrads, x, mul, g, w, b, eps, what: str = ""):
    """:func:`check_against_oracle` for the fused op: out, dx and dmul in x's shape and dtype
    within :func:`floor_errors_mul`'s bound; dw and db as there."""
    oracle, ref32, scale = computed = oracle_mul(x, mul, g, w, b, eps)
    for name, (err, bound, floor) in floor_errors_mul(out, x, mul, g, w, b, eps, computed).items():
        got = getattr(out, name)
        assert got.shape == x.shape and got.dtype == x.dtype, (what, name, got.shape, got.dtype)
        assert torch.isfinite(got).all(), f"{what} {name}: non-finite values"
        assert err <= bound, f"{what} {name}: rel L2 error {err:.3e} > bound {bound:.3e} (fp32 reference {floor:.3e})"
    # dw and db (4 values): within 1e-5 relative plus one rounding to each parameter's own
    # dtype, plus 16 units of accumulation roundoff times the scale, times log2 of the count.
    got = torch.cat([out.dw.double().reshape(-1), out.db.double().reshape(-1)]).cpu()
    exp = torch.cat([oracle.dw.reshape(-1), oracle.db.reshape(-1)]).double().cpu()
    sc = torch.cat([scale.dw.reshape(-1), scale.db.reshape(-1)]).double().cpu()
    u_out = torch.tensor([torch.finfo(out.dw.dtype).eps / 2] * 3 + [torch.finfo(out.db.dtype).eps / 2], dtype=torch.float64)
    tol = (1e-5 + u_out) * exp.abs() + 16 * compute_eps(x.dtype) * sc * math.log2(max(2, x.numel()))
    assert torch.all((got - exp).abs() <= tol), f"{what} [dw, db]: got {got.tolist()}, expected {exp.tolist()}"


# ---------------------------------------------------------------------------------------
# Argument checks: the Python copies (polynorm/_common.py) against the C++ ones
# ---------------------------------------------------------------------------------------

# c10's names of the dtypes, as the C++ messages print them.
_C10_DTYPE_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
                    "int8": "Char", "int16": "Short", "int32": "Int", "int64": "Long"}  # fmt: skip


def assert_python_checks_match_cpp(op, args) -> None:
    """``op`` (a ``torch.ops.polynorm`` op with a C++ CPU kernel) refuses ``args`` (CPU
    tensors) with the same RuntimeError from its C++ check and from its fake kernel's Python
    check (the same args on the meta device): the same argument named, the same values, the
    same words. The one difference allowed is how a dtype is printed (``torch.float32`` in
    Python, ``Float`` in C++)."""

    def message(run_args) -> str:
        with pytest.raises(RuntimeError) as info:
            op(*run_args)
        return str(info.value).splitlines()[0]

    cpp = message(args)
    assert cpp.startswith(f"polynorm.{op._qualified_op_name.split('::')[1]}: expected "), cpp
    fake = message([t.to("meta") if isinstance(t, torch.Tensor) else t for t in args])
    assert re.sub(r"torch\.(\w+)", lambda m: _C10_DTYPE_NAMES[m.group(1)], fake) == cpp, (fake, cpp)


# ---------------------------------------------------------------------------------------
# The README's examples
# ---------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def run_readme_block(marker: str, tmp_path) -> None:
    """Runs the README's one ```python block that contains ``marker`` as a user pasting it
    would: a fresh interpreter in an empty folder, nothing defined beforehand, this checkout
    on the path, no Triton interpreter. Asserts it exits cleanly and that the last line it
    prints (the block's own check, a maximum difference) is below 1e-5."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    (block,) = [b for b in blocks if marker in b]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-5, done.stdout


# ---------------------------------------------------------------------------------------
# Triton's GPU path traced without a GPU
# ---------------------------------------------------------------------------------------
# On a GPU the Triton ops are triton_ops: torch.compile traces their Python body with symbolic
# shapes and records each kernel launch. That tracing needs no GPU: a child process without
# the interpreter traces with fake tensors, and the captured graphs are never run.

_TRACE_CHILD = """
import torch
from torch._dynamo.backends.common import aot_autograd

import polynorm
from polynorm import triton_kernels

assert not triton_kernels._interpreted(), "TRITON_INTERPRET must be unset"
graphs = []


class Traced(Exception):
    pass


def capture(gm, example_inputs):  # keeps the traced graph; there is no GPU to run it on
    graphs.append(gm)

    def run(*args):
        raise Traced

    return run


backend = aot_autograd(fw_compiler=capture, bw_compiler=capture)
{body}
wrapper = torch.ops.higher_order.triton_kernel_wrapper_functional
print("LAUNCHES", *[sum(node.target is wrapper for node in gm.graph.nodes) for gm in graphs])
"""


def traced_triton_launches(body: str) -> list[int]:
    """Runs ``body`` in a fresh process without ``TRITON_INTERPRET``, after a preamble that
    defines ``backend`` (an aot_autograd backend that keeps each traced graph and raises
    ``Traced`` instead of running it), ``Traced``, ``torch`` and ``polynorm``. ``body``
    compiles with ``backend`` and calls the compiled function inside ``try: ... except
    Traced: pass``. Returns the number of Triton kernel launches in each graph traced, in
    order (forward graphs before their backward)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    script = _TRACE_CHILD.replace("{body}", body)
    child = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stdout + child.stderr
    (line,) = [line for line in child.stdout.splitlines() if line.startswith("LAUNCHES")]
    return [int(n) for n in line.split()[1:]]


# eps in every form eager mode takes, for the torch.compile tests (tests/test_pt2.py,
# tests/test_grouped.py). Dynamo turns a NumPy scalar into a 0-d tensor, and a tensor's value
# is data the trace cannot see: the ops then read eps when the graph runs.
EPS_FORMS = {
    "float": lambda v: v,
    "numpy.float32": lambda v: __import__("numpy").float32(v),
    "numpy.float64": lambda v: __import__("numpy").float64(v),
    "tensor-0d": lambda v: torch.tensor(v, dtype=torch.float64),
}


def compare_compiled_eps(run, fn, compiled, form: str, exact_first: bool, check) -> list:
    """For eps = 1e-3 and then 0.5 in ``form`` (a second value: a tensor eps is a graph input
    whose new value must be used), ``run(f, eps)`` gives a dataclass of outputs, the op's own
    output first. Eager with the form equals eager with its float; the compiled outputs meet
    the float64 oracle at that eps (``check(outputs, eps, what)``: check_against_oracle or
    check_against_oracle_mul, dtype-derived tolerances), the first one bitwise eager's when
    ``exact_first`` (the kernel backends). The compiled reference is Inductor's code for the
    eager formula: its sums (dw, db) run in another order than eager's, so it is held to the
    oracle, not to eager's bits or to assert_close's defaults (float32 dw differed from eager by
    2.7e-6 relative over 960 terms, torch 2.14 on the CPU). Returns ``[(eps, compiled outputs)]``."""
    results = []
    for value in (1e-3, 0.5):
        eps = EPS_FORMS[form](value)
        eager, comp = run(fn, eps), run(compiled, eps)
        names = [f.name for f in dataclasses.fields(eager)]
        assert torch.equal(getattr(eager, names[0]), getattr(run(fn, float(eps)), names[0]))  # the form holds its float
        if exact_first:
            first = names[0]
            assert torch.equal(getattr(comp, first), getattr(eager, first)), f"eps={eps!r}: {first} differs from eager"
        check(comp, value, f"compiled, eps={eps!r}")
        results.append((eps, comp))
    return results


def assert_second_device_matches_first(run):
    """``run(device)`` gives a dataclass of outputs. Run on cuda:0, then on cuda:1 with cuda:0
    current: the launchers' device guard must put every kernel and allocation on cuda:1
    (nothing allocated on cuda:0), with bitwise cuda:0's results. Returns cuda:1's outputs."""
    out0 = run("cuda:0")
    torch.cuda.synchronize(0)
    with torch.cuda.device(0):
        before = torch.cuda.memory_allocated(0)
        torch.cuda.reset_peak_memory_stats(0)
        out1 = run("cuda:1")
        torch.cuda.synchronize(1)
        assert torch.cuda.max_memory_allocated(0) == before, "allocated on cuda:0 for tensors on cuda:1"
    for name in (f.name for f in dataclasses.fields(out0)):
        t0, t1 = getattr(out0, name), getattr(out1, name)
        assert t1.device == torch.device("cuda:1"), name
        assert torch.equal(t0.cpu(), t1.cpu()), f"{name} differs between cuda:0 and cuda:1"
    return out1


def assert_graph_replay_matches_eager(x, g, w, b, fresh_x, fresh_g=None):
    """Captures polynorm::forward and backward on CUDA x, g (after a warm-up on a side stream),
    refills x with ``fresh_x()`` (and g with ``fresh_g()``), replays, and asserts y, rstd, grad_x, grad_weight and
    grad_bias bitwise equal to eager calls on the new x: no host synchronisation or allocation
    outside the caching allocator, and nothing the capture froze but the pointers."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up outside the capture
            y, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
            torch.ops.polynorm.backward(g, x, w, rstd)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
        dx, dw, db = torch.ops.polynorm.backward(g, x, w, rstd)
    x.copy_(fresh_x())
    if fresh_g is not None:
        g.copy_(fresh_g())
    graph.replay()
    y_e, rstd_e = torch.ops.polynorm.forward(x, w, b, 1e-6)
    dx_e, dw_e, db_e = torch.ops.polynorm.backward(g, x, w, rstd_e)
    for name, got, eager in (("y", y, y_e), ("rstd", rstd, rstd_e), ("grad_x", dx, dx_e), ("grad_weight", dw, dw_e),
                             ("grad_bias", db, db_e)):  # fmt: skip
        assert torch.equal(got, eager), f"{name}: the graph's replay differs from eager calls"
