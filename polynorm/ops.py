"""Python side of the polynorm ops: fake (meta) kernels, autograd, and the public function.

The kernels themselves are C++/CUDA (``csrc/``) and Triton (``polynorm/triton_kernels.py``);
importing :mod:`polynorm._C` registers ``torch.ops.polynorm.forward`` and ``backward``, and
the fused PolyNorm x mul's ``torch.ops.polynorm.mul_forward`` and ``mul_backward``.
"""

import torch
from torch import Tensor

from polynorm import reference
from polynorm._common import (
    check_backward_args,
    check_eps,
    check_forward_args,
    check_mul_backward_args,
    check_mul_forward_args,
    check_sharded_backward_apply_args,
    check_sharded_backward_stats_args,
    check_sharded_forward_apply_args,
    check_sharded_forward_stats_args,
    eps_operand,
    refuse_double_backward,
    register_autograd,
    register_mul_autograd,
    rstd_dtype,
)

try:  # registers torch.ops.polynorm.forward_triton, backward_triton, mul_forward_triton, mul_backward_triton
    from polynorm import triton_kernels as _triton_kernels
except ImportError as _error:  # Triton is optional: every other backend works without it
    _triton_kernels = None
    _TRITON_IMPORT_ERROR = f"{type(_error).__name__}: {_error}"

if torch.distributed.is_available():  # a DTensor x sharded on its last dimension: polynorm.tp
    from polynorm._sharding import shards_hidden as _shards_hidden
    from polynorm._sharding import sharded_poly_norm as _sharded_poly_norm
else:
    _shards_hidden = _sharded_poly_norm = None

__all__ = ["poly_norm", "poly_norm_mul", "BACKENDS"]


def _tp_backend(backend: str) -> str:
    # polynorm.tp's backends: "cuda" is its "auto" (the C++ ops dispatch by device).
    return "auto" if backend == "cuda" else backend

BACKENDS = ("auto", "cuda", "triton", "reference")


@torch.library.register_fake("polynorm::forward")
def _forward_fake(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    check_forward_args("polynorm.forward", x, weight, bias, eps)
    M = x.numel() // x.shape[-1]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = x.new_empty((M, 3), dtype=rstd_dtype(x.dtype))
    return y, rstd


@torch.library.register_fake("polynorm::backward")
def _backward_fake(grad_y: Tensor, x: Tensor, weight: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    check_backward_args("polynorm.backward", grad_y, x, weight, rstd)
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    # grad_weight and grad_bias in the accumulation dtype, whatever the parameters' dtypes.
    acc = rstd_dtype(x.dtype)
    return grad_x, x.new_empty((3,), dtype=acc), x.new_empty((1,), dtype=acc)


@torch.library.register_fake("polynorm::mul_forward")
def _mul_forward_fake(x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    check_mul_forward_args("polynorm.mul_forward", x, mul, weight, bias, eps)
    return _forward_fake(x, weight, bias, eps)


@torch.library.register_fake("polynorm::mul_backward")
def _mul_backward_fake(
    grad_out: Tensor, x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, rstd: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    check_mul_backward_args("polynorm.mul_backward", grad_out, x, mul, weight, bias, rstd)
    grad_x, grad_weight, grad_bias = _backward_fake(grad_out, x, weight, rstd)
    return grad_x, torch.empty(x.shape, dtype=x.dtype, device=x.device), grad_weight, grad_bias


# The sharded passes of tensor parallelism (polynorm/tp.py; csrc/ops.cpp has the schemas). The fake
# kernels run the C++ checks: they also serve a call whose one argument is on the meta device
# and the others not (the dispatcher picks Meta), which would otherwise return empty tensors.
@torch.library.register_fake("polynorm::sharded_forward_stats")
def _sharded_forward_stats_fake(x: Tensor) -> Tensor:
    M = check_sharded_forward_stats_args("polynorm.sharded_forward_stats", x)
    return x.new_empty((M, 3), dtype=rstd_dtype(x.dtype))


@torch.library.register_fake("polynorm::sharded_forward_apply")
def _sharded_forward_apply_fake(x, mul, sums, weight, bias, hidden_size, eps=1e-6) -> tuple[Tensor, Tensor]:
    M = check_sharded_forward_apply_args("polynorm.sharded_forward_apply", x, mul, sums, weight, bias, hidden_size, eps)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), x.new_empty((M, 3), dtype=rstd_dtype(x.dtype))


@torch.library.register_fake("polynorm::sharded_backward_stats")
def _sharded_backward_stats_fake(grad_out, x, mul, rstd) -> tuple[Tensor, Tensor, Tensor]:
    M = check_sharded_backward_stats_args("polynorm.sharded_backward_stats", grad_out, x, mul, rstd)
    acc = rstd_dtype(x.dtype)
    return x.new_empty((M, 3), dtype=acc), x.new_empty((3,), dtype=acc), x.new_empty((1,), dtype=acc)


@torch.library.register_fake("polynorm::sharded_backward_apply")
def _sharded_backward_apply_fake(grad_out, x, mul, weight, bias, rstd, sums, hidden_size) -> tuple[Tensor, Tensor]:
    check_sharded_backward_apply_args("polynorm.sharded_backward_apply", grad_out, x, mul, weight, bias, rstd, sums,
                                      hidden_size)  # fmt: skip
    grad_mul = torch.empty(x.shape, dtype=x.dtype, device=x.device) if mul is not None else x.new_empty(0)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), grad_mul


# polynorm::forward and mul_forward are differentiable through their C++ autograd kernels
# (csrc/autograd.cpp); their backward ops are not.
refuse_double_backward(torch.ops.polynorm.backward.default)
refuse_double_backward(torch.ops.polynorm.mul_backward.default)


# --------------------------------------------------------------------------------------
# eps as a tensor under torch.compile
# --------------------------------------------------------------------------------------
# The ops take eps as a float. Under torch.compile a tensor eps, or a NumPy scalar (which
# Dynamo turns into a 0-d tensor), is a graph input whose value the trace cannot see, and
# the C++ schema's float refuses a data-dependent symbolic float. This op takes eps as a
# tensor instead: the compiled graph keeps one call, which reads eps, checks it, and runs
# the backend's forward when the graph runs. Eagerly, poly_norm (poly_norm_mul) never uses it.
_KERNEL_OPS = {"auto": "forward", "cuda": "forward", "triton": "forward_triton"}
_MUL_KERNEL_OPS = {"auto": "mul_forward", "cuda": "mul_forward", "triton": "mul_forward_triton"}


def _check_tensor_eps_fake(op: str, public: str, backend: str, eps: Tensor) -> None:
    """The fake kernel's checks of a tensor-eps op named ``op``, for the function ``public``:
    a kernel backend, and eps one real element (its value is checked when the op runs)."""
    if backend not in _KERNEL_OPS:
        raise ValueError(f"{op}: expected backend to be one of auto, cuda, triton, got {backend!r}")
    if eps.numel() != 1 or eps.is_complex() or eps.dtype == torch.bool:
        raise TypeError(f"{public}: expected eps to be a real number, got a tensor of shape "
                        f"{list(eps.shape)} and dtype {eps.dtype}")


@torch.library.custom_op("polynorm::forward_tensor_eps", mutates_args=())
def _forward_tensor_eps(x: Tensor, weight: Tensor, bias: Tensor, eps: Tensor, backend: str) -> tuple[Tensor, Tensor]:
    """``polynorm::forward`` (backend ``"auto"``/``"cuda"``) or ``forward_triton``
    (``"triton"``) with eps a one-element real tensor, read when the op runs."""
    value = check_eps("polynorm.poly_norm", eps)
    y, rstd = getattr(torch.ops.polynorm, _KERNEL_OPS[backend])(x, weight, bias, value)
    return y, rstd


@_forward_tensor_eps.register_fake
def _forward_tensor_eps_fake(x: Tensor, weight: Tensor, bias: Tensor, eps: Tensor, backend: str):
    _check_tensor_eps_fake("polynorm.forward_tensor_eps", "polynorm.poly_norm", backend, eps)
    return _forward_fake(x, weight, bias, 0.0)  # eps's value is checked when the op runs


register_autograd(
    "polynorm::forward_tensor_eps",
    by_backend={"auto": "backward", "cuda": "backward", "triton": "backward_triton"},
)


@torch.library.custom_op("polynorm::mul_forward_tensor_eps", mutates_args=())
def _mul_forward_tensor_eps(
    x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, eps: Tensor, backend: str
) -> tuple[Tensor, Tensor]:
    """``polynorm::mul_forward`` (backend ``"auto"``/``"cuda"``) or ``mul_forward_triton``
    (``"triton"``) with eps a one-element real tensor, read when the op runs."""
    value = check_eps("polynorm.poly_norm_mul", eps)
    out, rstd = getattr(torch.ops.polynorm, _MUL_KERNEL_OPS[backend])(x, mul, weight, bias, value)
    return out, rstd


@_mul_forward_tensor_eps.register_fake
def _mul_forward_tensor_eps_fake(x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, eps: Tensor, backend: str):
    _check_tensor_eps_fake("polynorm.mul_forward_tensor_eps", "polynorm.poly_norm_mul", backend, eps)
    return _mul_forward_fake(x, mul, weight, bias, 0.0)  # eps's value is checked when the op runs


register_mul_autograd(
    "polynorm::mul_forward_tensor_eps",
    by_backend={"auto": "mul_backward", "cuda": "mul_backward", "triton": "mul_backward_triton"},
)


@torch.library.custom_op("polynorm::checked_eps", mutates_args=())
def _checked_eps(eps: Tensor, op: str = "polynorm.poly_norm") -> Tensor:
    """eps, a one-element real tensor, checked when the op runs (finite and >= 0; else
    the ValueError of the function ``op``, poly_norm or poly_norm_mul). The reference
    backend's guard for a tensor or NumPy eps under torch.compile: its value is
    data-dependent there, and torch 2.11's Dynamo drops a runtime assertion on a symbolic
    float (eps.item()), so an opaque op checks it instead, on every torch version. Eagerly,
    the functions never use it."""
    check_eps(op, eps)
    return eps.clone()


@_checked_eps.register_fake
def _checked_eps_fake(eps: Tensor, op: str = "polynorm.poly_norm") -> Tensor:
    return torch.empty_like(eps)


def _reference_eps(op: str, check, eps, *tensors):
    """The reference backend's argument checks, ``check(op, *tensors, eps, traced=...)``, and
    its eps: a Python float, or (under torch.compile, see :func:`eps_operand`) a tensor that
    ``polynorm::checked_eps`` checks when the graph runs."""
    traced = torch.compiler.is_compiling()
    if isinstance(eps, Tensor):
        check(op, *tensors, 0.0, traced=traced)
        return torch.ops.polynorm.checked_eps(eps, op)
    return check(op, *tensors, eps, traced=traced)


def _check_kernel_backend(op: str, backend: str, x: Tensor, **tensors) -> None:
    """Refuses what the kernel backends cannot run: x (or another tensor argument) neither a
    tensor nor None (TypeError, as the reference backend; None gets the op's own message), an
    unknown backend, ``"cuda"`` with x neither on a CUDA device nor on the meta device (shape
    inference: a module built under torch.device("meta")), ``"triton"`` without the triton
    package."""
    for name, t in (("x", x), *tensors.items()):
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{op}: expected {name} to be a Tensor, got {type(t).__name__}")
    if backend not in _KERNEL_OPS:
        raise ValueError(f"{op}: expected backend to be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "cuda" and isinstance(x, Tensor) and not (x.is_cuda or x.is_meta):
        raise RuntimeError(f"{op}: backend 'cuda' expected x on a CUDA device (or the meta device), got {x.device}")
    if backend == "triton" and _triton_kernels is None:
        raise RuntimeError(f"{op}: backend 'triton' expected the triton package to import, got {_TRITON_IMPORT_ERROR}")


def poly_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-6, backend: str = "auto") -> Tensor:
    """PolyNorm: ``y = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b``.

    ``norm(u) = u / sqrt(mean(u^2, dim=-1) + eps)``, over the last dimension H. Each row's
    three mean squares are accumulated in fp32 (fp64 for fp64 inputs); y is rounded once
    to x's dtype. Differentiable in x, weight and bias.

    Args:
        x: ``(..., H)`` tensor of float32, float64, float16 or bfloat16, on the CPU or a
            CUDA device. Any layout: rows with a row stride and a unit last-dim stride
            are read in place; other layouts are copied once.
        weight: ``(3,)`` tensor ``[w0, w1, w2]`` of any of those dtypes (w0 scales the
            cubic term); fp32 parameters with bf16 activations are the common case.
        bias: ``(1,)`` or ``()`` tensor of any of those dtypes.
        eps: added to each mean square inside the square root; a real number (a Python or
            NumPy int or float, or a one-element real tensor; not a bool), finite and >= 0.
            Under torch.compile a NumPy or tensor eps is read, and checked, when the graph
            runs (``polynorm::forward_tensor_eps``); a Python float is a graph constant.
        backend: ``"auto"`` (the CUDA kernels for CUDA tensors, the C++ kernel for CPU
            tensors), ``"cuda"`` (the CUDA kernels; x must be on a CUDA device),
            ``"triton"`` (the Triton kernels, ``torch.ops.polynorm.forward_triton``; x on a
            CUDA device, or on the CPU under ``TRITON_INTERPRET=1``; needs the ``triton``
            package) or ``"reference"`` (:func:`polynorm.reference.poly_norm`, plain PyTorch).

    Every backend also takes meta and fake tensors (shape inference, forward and backward),
    and an x made under ``torch.inference_mode()``: when a backward is recorded such an x is
    copied once, since autograd cannot save an inference tensor (``layer_norm`` and
    ``linear`` refuse such an x).

    Returns:
        y: x's shape and dtype, contiguous. Its gradient gives each parameter's gradient
        in that parameter's own dtype and shape, summed in fp32 (fp64 for fp64 x) and
        rounded once.

    Raises:
        TypeError: eps not a real number (a bool, a string, a complex number, a tensor of
            several elements).
        ValueError: an unknown backend, or eps negative, NaN or infinite.
        RuntimeError: x not float32/float64/float16/bfloat16, x 0-d or with H = 0,
            weight not ``(3,)``, bias not ``(1,)`` or ``()``, tensors on different
            devices, backend ``"cuda"`` with x neither on a CUDA device nor on the meta
            device, or backend
            ``"triton"`` without the triton package or with CPU tensors outside the
            interpreter. Each message names the op and the argument, with the expected
            and the actual value.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    if type(x) is not Tensor and _shards_hidden is not None and _shards_hidden(x):  # tensor parallelism
        return _sharded_poly_norm("polynorm.poly_norm", x, None, weight, bias, eps, _tp_backend(backend))
    if type(eps) is not float:  # the common case, a Python float, goes straight to the op
        eps = eps_operand("polynorm.poly_norm", eps)
    if backend == "reference":
        eps = _reference_eps("polynorm.poly_norm", check_forward_args, eps, x, weight, bias)
        return reference._poly_norm(x, weight, bias, eps)
    _check_kernel_backend("polynorm.poly_norm", backend, x, weight=weight, bias=bias)
    if isinstance(eps, Tensor):  # only under torch.compile (see eps_operand)
        return torch.ops.polynorm.forward_tensor_eps(x, weight, bias, eps, backend)[0]
    if backend != "triton":
        return torch.ops.polynorm.forward(x, weight, bias, eps)[0]
    if _triton_kernels.eager_fast_path(x, weight, bias, eps):  # the same kernels, without the dispatcher
        records = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or bias.requires_grad)
        return _triton_kernels.PolyNormTritonFunction.apply(x, weight, bias, eps, records)
    return torch.ops.polynorm.forward_triton(x, weight, bias, eps)[0]


def poly_norm_mul(
    x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-6, backend: str = "auto"
) -> Tensor:
    """Fused PolyNorm x mul, the gated MLP's activation: ``out = poly_norm(x) * mul``.

    ``poly_norm(x) = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b`` with
    ``norm(u) = u / sqrt(mean(u^2, dim=-1) + eps)`` over the last dimension H (see
    :func:`poly_norm`). PolyNorm's y is formed in fp32 (fp64 for fp64 inputs), multiplied by
    mul there, and the product is rounded once to x's dtype: y is never rounded on its own
    (rounding it to bf16 first, as a public fork did, doubles the error). One pass reads x
    and mul and writes out, where ``poly_norm`` then ``torch.mul`` makes five. Motif's
    ``FusedMulPolyNorm`` (:class:`polynorm.FusedMulPolyNorm`) computes the same.
    Differentiable in x, mul, weight and bias; the backward drives PolyNorm's backward with
    ``grad_out * mul`` (formed in fp32, never rounded) and gives
    ``grad_mul = grad_out * y``, y recomputed from x (docs/MATH.md, "Fused PolyNorm x mul").

    Example, a gated MLP ``down(PolyNorm(gate(x)) * up(x))`` (Motif's)::

        >>> import torch, polynorm
        >>> gate, up, down = torch.nn.Linear(64, 256), torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)
        >>> weight = torch.full((3,), 1 / 3, requires_grad=True)
        >>> bias = torch.zeros(1, requires_grad=True)
        >>> x = torch.randn(2, 10, 64)
        >>> out = down(polynorm.poly_norm_mul(gate(x), up(x), weight, bias))
        >>> out.shape
        torch.Size([2, 10, 64])

    Args:
        x: ``(..., H)`` tensor of float32, float64, float16 or bfloat16, on the CPU or a
            CUDA device. Any layout: rows with a row stride and a unit last-dim stride are
            read in place; other layouts are copied once.
        mul: x's shape, dtype and device (the gate's partner, ``up(x)``); any layout, read
            like x, independently of x's layout.
        weight: ``(3,)`` tensor ``[w0, w1, w2]`` of any of those dtypes (w0 scales the cubic
            term); fp32 parameters with bf16 activations are the common case.
        bias: ``(1,)`` or ``()`` tensor of any of those dtypes.
        eps: as in :func:`poly_norm` (a real number, finite and >= 0; under torch.compile a
            NumPy or tensor eps is read, and checked, when the graph runs, through
            ``polynorm::mul_forward_tensor_eps``).
        backend: ``"auto"`` (the CUDA kernels for CUDA tensors, the C++ kernel for CPU
            tensors: ``torch.ops.polynorm.mul_forward``), ``"cuda"``, ``"triton"``
            (``torch.ops.polynorm.mul_forward_triton``; CUDA tensors, or CPU tensors under
            ``TRITON_INTERPRET=1``) or ``"reference"``
            (:func:`polynorm.reference.poly_norm_mul`, plain PyTorch).

    Every backend also takes meta and fake tensors, and an x or mul made under
    ``torch.inference_mode()`` (copied once when a backward is recorded).

    Returns:
        out: x's shape and dtype, contiguous. Its gradient gives grad_x and grad_mul in x's
        dtype, and each parameter's gradient in that parameter's own dtype and shape,
        summed in fp32 (fp64 for fp64 x) in a fixed order (bitwise the same on every run)
        and rounded once.

    Raises:
        TypeError: eps not a real number (a bool, a string, a complex number, a tensor of
            several elements), or mul not a tensor.
        ValueError: an unknown backend, or eps negative, NaN or infinite.
        RuntimeError: as :func:`poly_norm`, and mul of another shape, dtype or device than
            x. Each message names the op and the argument, with the expected and the
            actual value.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    if type(x) is not Tensor and _shards_hidden is not None and _shards_hidden(x):  # tensor parallelism
        return _sharded_poly_norm("polynorm.poly_norm_mul", x, mul, weight, bias, eps, _tp_backend(backend))
    if type(eps) is not float:  # the common case, a Python float, goes straight to the op
        eps = eps_operand("polynorm.poly_norm_mul", eps)
    if backend == "reference":
        eps = _reference_eps("polynorm.poly_norm_mul", check_mul_forward_args, eps, x, mul, weight, bias)
        return reference._poly_norm_mul(x, mul, weight, bias, eps)
    _check_kernel_backend("polynorm.poly_norm_mul", backend, x, mul=mul, weight=weight, bias=bias)
    if isinstance(eps, Tensor):  # only under torch.compile (see eps_operand)
        return torch.ops.polynorm.mul_forward_tensor_eps(x, mul, weight, bias, eps, backend)[0]
    if backend == "triton":
        return torch.ops.polynorm.mul_forward_triton(x, mul, weight, bias, eps)[0]
    return torch.ops.polynorm.mul_forward(x, mul, weight, bias, eps)[0]
