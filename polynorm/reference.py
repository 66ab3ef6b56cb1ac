"""The pure-PyTorch definition of PolyNorm: the oracle every backend is tested against.

PolyNorm (Zhuo et al., "Polynomial Composition Activations: Unleashing the Dynamics of
Large Language Models", arXiv:2411.03884)::

    y = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b
    norm(u) = u / sqrt(mean(u^2, dim=-1) + eps)

Computed in ``compute_dtype`` (promoted with x's dtype, so float64 inputs stay float64)
and rounded once to x's dtype. Autograd differentiates it, which makes it the oracle for
the backward too when run with ``compute_dtype=torch.float64``.
"""

import torch
from torch import Tensor

from polynorm._common import check_forward_args, check_mul_forward_args

__all__ = ["poly_norm", "poly_norm_mul", "rstd"]


def _compute_dtype(x: Tensor, compute_dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(x.dtype, compute_dtype)


def rstd(x: Tensor, eps: float = 1e-6, *, compute_dtype: torch.dtype = torch.float32) -> Tensor:
    """The per-row reciprocal RMS of x^3, x^2 and x.

    Args:
        x: ``(..., H)`` floating tensor.
        eps: added to each mean square inside the square root.
        compute_dtype: dtype of the computation (promoted with ``x.dtype``).

    Returns:
        ``(M, 3)`` tensor of ``compute_dtype``, ``M = x.numel() // H``, columns ordered
        ``[r_3, r_2, r_1]`` where ``r_p = 1 / sqrt(mean(x^(2p)) + eps)``.
    """
    xc = x.to(_compute_dtype(x, compute_dtype)).reshape(-1, x.shape[-1])
    powers = torch.stack([xc.pow(3), xc.pow(2), xc], dim=1)  # [M, 3, H]
    return torch.rsqrt(powers.pow(2).mean(dim=-1) + eps)


def poly_norm(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-6, *, compute_dtype: torch.dtype = torch.float32
) -> Tensor:
    """PolyNorm in plain PyTorch: ``y = w0 norm(x^3) + w1 norm(x^2) + w2 norm(x) + b``.

    ``norm(u) = u / sqrt(mean(u^2, dim=-1) + eps)`` over the last dimension H.

    Args:
        x: ``(..., H)`` tensor of float32, float64, float16 or bfloat16, H >= 1.
        weight: ``(3,)`` (any shape of 3 elements) ``[w0, w1, w2]``, any of those dtypes;
            w0 scales the cubic term.
        bias: ``(1,)`` or ``()``, any of those dtypes.
        eps: added to each mean square inside the square root; a real number (Python or
            NumPy scalar, one-element tensor), finite and >= 0.
        compute_dtype: dtype of the computation; promoted with ``x.dtype``, so the
            default float32 upcasts fp16/bf16 and leaves float64 alone.

    Returns:
        y, with x's shape and dtype (rounded once from ``compute_dtype``), contiguous.
        Autograd differentiates it: each parameter's gradient comes back in that
        parameter's dtype.

    Raises:
        TypeError: an argument not a tensor, or eps not a real number (a bool, a string).
        RuntimeError: x, weight or bias not float32/float64/float16/bfloat16, x 0-d or
            with H = 0, weight without 3 elements, bias without 1 element, tensors on
            different devices. The same checks and messages as the ops, naming
            ``polynorm.reference.poly_norm``.
        ValueError: eps negative, NaN or infinite.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    eps = check_forward_args(
        "polynorm.reference.poly_norm", x, weight, bias, eps, traced=torch.compiler.is_compiling()
    )
    return _poly_norm(x, weight, bias, eps, compute_dtype=compute_dtype)


def _poly_norm(
    x: Tensor, weight: Tensor, bias: Tensor, eps, *, compute_dtype: torch.dtype = torch.float32, out_dtype=None
) -> Tensor:
    # poly_norm without the argument checks (polynorm.poly_norm runs them under its own name).
    # out_dtype: y's dtype (x's when None); poly_norm_mul keeps y in the compute dtype.
    dtype = _compute_dtype(x, compute_dtype)
    # Contiguous, so that y is contiguous whatever x's strides (a copy only when x is not).
    xc = x.to(dtype, memory_format=torch.contiguous_format).contiguous()
    w = weight.to(dtype).reshape(3)
    b = bias.to(dtype).reshape(())

    def norm(u: Tensor) -> Tensor:
        # A division by the square root, as the paper writes it. Autograd of rsqrt would form
        # mean(u^2)^-1.5, which leaves fp32's range for |x| beyond ~3e4 (x^6 ~ 1e27) and
        # corrupts the gradient; this way its largest intermediate is mean(u^2) itself.
        return u / torch.sqrt(u.pow(2).mean(dim=-1, keepdim=True) + eps)

    y = w[0] * norm(xc.pow(3)) + w[1] * norm(xc.pow(2)) + w[2] * norm(xc) + b
    return y.to(x.dtype if out_dtype is None else out_dtype)


def poly_norm_mul(
    x: Tensor,
    mul: Tensor,
    weight: Tensor,
    bias: Tensor,
    eps: float = 1e-6,
    *,
    compute_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """PolyNorm times a gate, in plain PyTorch: ``out = poly_norm(x) * mul``.

    The fused op's oracle (Motif's ``FusedMulPolyNorm``): ``poly_norm(x)`` is formed in
    ``compute_dtype`` and multiplied by ``mul`` there, and the product is rounded once to
    x's dtype; PolyNorm's y is never rounded on its own.

    Args:
        x: ``(..., H)`` tensor of float32, float64, float16 or bfloat16, H >= 1.
        mul: x's shape and dtype, on x's device.
        weight, bias, eps, compute_dtype: as in :func:`poly_norm`.

    Returns:
        out, with x's shape and dtype, contiguous. Autograd differentiates it.

    Raises:
        As :func:`poly_norm`; RuntimeError also for mul of another shape, dtype or device.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    eps = check_mul_forward_args(
        "polynorm.reference.poly_norm_mul", x, mul, weight, bias, eps, traced=torch.compiler.is_compiling()
    )
    return _poly_norm_mul(x, mul, weight, bias, eps, compute_dtype=compute_dtype)


def _poly_norm_mul(x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, eps, *, compute_dtype: torch.dtype = torch.float32) -> Tensor:
    # poly_norm_mul without the argument checks.
    dtype = _compute_dtype(x, compute_dtype)
    y = _poly_norm(x, weight, bias, eps, compute_dtype=compute_dtype, out_dtype=dtype)
    # The product's backward saves mul: one made under torch.inference_mode() cannot be
    # saved, so it is copied (the copy a dtype change makes anyway). Dynamo cannot trace
    # is_inference(); a compiled graph copies nothing.
    copy = not torch.compiler.is_compiling() and mul.is_inference()
    return (y * mul.to(dtype, copy=copy)).to(x.dtype, memory_format=torch.contiguous_format).contiguous()


# ----------------------------------------------------------------------------------------
# Grouped PolyNorm (mixture of experts)
# ----------------------------------------------------------------------------------------
# The grouped ops' argument contract, in Python: shared by the reference, the fake kernels
# (polynorm/grouped.py) and the Triton ops (polynorm/triton_grouped.py), with the messages of
# the C++ checks (csrc/polynorm.cpp).

from polynorm._common import _check_float, _check_same_device, _require, check_eps, rstd_dtype  # noqa: E402

__all__ += ["poly_norm_grouped"]

_OFFSET_DTYPES = (torch.int32, torch.int64)


def _check_grouped_params(op: str, x: Tensor, weight: Tensor, offsets: Tensor, traced: bool) -> int:
    _check_float(op, "weight", weight)
    _require(
        weight.dim() == 2 and weight.shape[1] == 3,
        lambda: f"{op}: expected weight of shape [E, 3] (one [w0, w1, w2] row per expert), got {list(weight.shape)}",
        traced,
    )
    E = weight.shape[0]
    _require(E >= 1, lambda: f"{op}: expected weight to have at least one expert (E >= 1), got shape {list(weight.shape)}", traced)
    if not isinstance(offsets, Tensor):
        raise TypeError(f"{op}: expected offsets to be a Tensor, got {type(offsets).__name__}")
    if offsets.dtype not in _OFFSET_DTYPES:
        raise RuntimeError(f"{op}: expected offsets to be int32 or int64, got {offsets.dtype}")
    _require(
        offsets.dim() == 1 and offsets.shape[0] == E,
        lambda: f"{op}: expected offsets of shape [{E}] (one cumulative end offset per expert of weight), "
        f"got {list(offsets.shape)}",
        traced,
    )
    _check_same_device(op, x, weight=weight, offsets=offsets)
    return E


def _check_grouped_x(op: str, x: Tensor, traced: bool) -> None:
    _check_float(op, "x", x)
    _require(x.dim() >= 1, lambda: f"{op}: expected x to have at least 1 dimension (..., H), got a 0-d tensor", traced)
    _require(x.shape[-1] >= 1, lambda: f"{op}: expected x to have a last dimension H >= 1, got shape {list(x.shape)}", traced)


def check_grouped_forward_args(
    op: str, x: Tensor, weight: Tensor, bias: Tensor, offsets: Tensor, eps, *, traced: bool = False
) -> float:
    """The C++ checks of ``polynorm::grouped_forward``, in Python.

    x ``(..., H)`` of a float dtype with H >= 1; weight ``[E, 3]`` with E >= 1; bias ``[E]`` or
    ``[E, 1]``; offsets ``[E]`` of int32 or int64; all on x's device; eps finite and >= 0.

    Returns:
        eps as a Python float.

    Raises:
        TypeError: an argument of the wrong type, or eps not a real number.
        RuntimeError: naming ``op`` and the argument, with the expected and the actual value.
        ValueError: eps negative, NaN or infinite.
    """
    _check_grouped_x(op, x, traced)
    E = _check_grouped_params(op, x, weight, offsets, traced)
    _check_float(op, "bias", bias)
    _require(
        tuple(bias.shape) in ((E,), (E, 1)),
        lambda: f"{op}: expected bias of shape [{E}] or [{E}, 1] (weight's E experts), got {list(bias.shape)}",
        traced,
    )
    _check_same_device(op, x, bias=bias)
    return check_eps(op, eps)


def check_grouped_backward_args(op: str, grad_y: Tensor, x: Tensor, weight: Tensor, offsets: Tensor, rstd: Tensor) -> None:
    """The C++ checks of ``polynorm::grouped_backward``, in Python (see
    :func:`check_grouped_forward_args`); grad_y has x's shape, dtype and device, and rstd is
    ``[M, 3]`` of the accumulation dtype on x's device."""
    for name, t in (("grad_y", grad_y), ("rstd", rstd)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: expected {name} to be a Tensor, got {type(t).__name__}")
    _check_grouped_x(op, x, False)
    _check_grouped_params(op, x, weight, offsets, False)
    torch._check(
        grad_y.shape == x.shape,
        lambda: f"{op}: expected grad_y to have x's shape {list(x.shape)}, got {list(grad_y.shape)}",
    )
    if grad_y.dtype != x.dtype:
        raise RuntimeError(f"{op}: expected grad_y to have x's dtype {x.dtype}, got {grad_y.dtype}")
    M = x.numel() // x.shape[-1]
    torch._check(
        rstd.dim() == 2 and rstd.shape[0] == M and rstd.shape[1] == 3,
        lambda: f"{op}: expected rstd of shape [{M}, 3] (rows of x, then r_3, r_2, r_1), got {list(rstd.shape)}",
    )
    if rstd.dtype != rstd_dtype(x.dtype):
        raise RuntimeError(f"{op}: expected rstd of dtype {rstd_dtype(x.dtype)} for x of dtype {x.dtype}, got {rstd.dtype}")
    _check_same_device(op, x, grad_y=grad_y, rstd=rstd)


def poly_norm_grouped(
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    offsets: Tensor,
    eps: float = 1e-6,
    *,
    compute_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Grouped PolyNorm in plain PyTorch: each row with its own expert's parameters.

    Rows of x (flattened to ``(M, H)``) are sorted by expert; expert e owns rows
    ``[offsets[e-1], offsets[e])`` (``offsets[-1] := 0``), and for such a row::

        y = w[e,0] * norm(x^3) + w[e,1] * norm(x^2) + w[e,2] * norm(x) + b[e]
        norm(u) = u / sqrt(mean(u^2, dim=-1) + eps)

    Rows at or past ``offsets[E-1]`` belong to no expert: y is 0 there, and so is their
    gradient. Each row's expert is found with ``torch.searchsorted`` on x's device, without
    reading offsets on the host, so this also compiles (torch.compile, fullgraph). The oracle of the grouped ops when
    run with ``compute_dtype=torch.float64``; autograd differentiates it.

    Args:
        x: ``(..., H)`` tensor of float32, float64, float16 or bfloat16, H >= 1.
        weight: ``[E, 3]``, one ``[w0, w1, w2]`` per expert (w0 scales the cubic term), any
            of those dtypes.
        bias: ``[E]`` or ``[E, 1]``, any of those dtypes.
        offsets: ``[E]`` int32 or int64 on x's device: cumulative end offsets, non-decreasing
            and at most M (other values give undefined results), the convention of
            ``torch._grouped_mm``'s ``offs``.
        eps: added to each mean square inside the square root; finite and >= 0.
        compute_dtype: dtype of the computation; promoted with ``x.dtype``.

    Returns:
        y, with x's shape and dtype (rounded once from ``compute_dtype``), contiguous.

    Raises:
        TypeError, RuntimeError, ValueError: the checks of ``polynorm::grouped_forward``,
            naming ``polynorm.reference.poly_norm_grouped``.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    eps = check_grouped_forward_args(
        "polynorm.reference.poly_norm_grouped", x, weight, bias, offsets, eps, traced=torch.compiler.is_compiling()
    )
    return _poly_norm_grouped(x, weight, bias, offsets, eps, compute_dtype=compute_dtype)


def _poly_norm_grouped(
    x: Tensor, weight: Tensor, bias: Tensor, offsets: Tensor, eps, *, compute_dtype: torch.dtype = torch.float32
) -> Tensor:
    # poly_norm_grouped without the argument checks.
    dtype = _compute_dtype(x, compute_dtype)
    H = x.shape[-1]
    xc = x.to(dtype, memory_format=torch.contiguous_format).reshape(-1, H)
    E = weight.shape[0]
    rows = torch.arange(xc.shape[0], device=x.device)
    # The first e with offsets[e] > row: the row's expert, E for a row of no expert.
    expert = torch.searchsorted(offsets.to(torch.int64).contiguous(), rows, right=True)
    owned = (expert < E)[:, None]
    e = expert.clamp(max=E - 1)
    w = weight.to(dtype).reshape(E, 3)[e]  # [M, 3]
    b = bias.to(dtype).reshape(E, 1)[e]  # [M, 1]
    # Rows of no expert are never used: replaced by ones so that their statistics stay finite
    # (no NaN into the gradient through torch.where), and y set to 0 there.
    xs = torch.where(owned, xc, torch.ones((), dtype=dtype, device=x.device))

    def norm(u: Tensor) -> Tensor:
        return u / torch.sqrt(u.pow(2).mean(dim=-1, keepdim=True) + eps)  # as in _poly_norm

    y = w[:, 0:1] * norm(xs.pow(3)) + w[:, 1:2] * norm(xs.pow(2)) + w[:, 2:3] * norm(xs) + b
    y = torch.where(owned, y, torch.zeros((), dtype=dtype, device=x.device))
    return y.to(x.dtype).reshape(x.shape)
