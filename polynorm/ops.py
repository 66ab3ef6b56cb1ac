"""Python side of the polynorm ops: fake (meta) kernels, autograd, and the public function.

The kernels themselves are C++/CUDA (``csrc/``) and Triton (``polynorm/triton_kernels.py``);
importing :mod:`polynorm._C` registers ``torch.ops.polynorm.forward`` and
``torch.ops.polynorm.backward``.
"""

import torch
from torch import Tensor

from polynorm import reference

try:  # registers torch.ops.polynorm.forward_triton and backward_triton
    from polynorm import triton_kernels as _triton_kernels
except ImportError as _error:  # Triton is optional: every other backend works without it
    _triton_kernels = None
    _TRITON_IMPORT_ERROR = f"{type(_error).__name__}: {_error}"

__all__ = ["poly_norm", "BACKENDS"]

BACKENDS = ("auto", "cuda", "triton", "reference")


def _rstd_dtype(x_dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if x_dtype == torch.float64 else torch.float32


def _check_same_device(op: str, x: Tensor, **others: Tensor) -> None:
    # The fake kernels also run when one argument is on the meta device and x is not
    # (the dispatcher picks Meta); without this check that returned garbage CPU tensors.
    for name, t in others.items():
        if t.device != x.device:
            raise RuntimeError(f"{op}: expected {name} on x's device {x.device}, got {t.device}")


@torch.library.register_fake("polynorm::forward")
def _forward_fake(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    torch._check(x.dim() >= 1, lambda: "polynorm.forward: expected x to have at least 1 dimension, got 0-d")
    torch._check(x.shape[-1] >= 1, lambda: f"polynorm.forward: expected H >= 1, got shape {tuple(x.shape)}")
    torch._check(weight.numel() == 3, lambda: f"polynorm.forward: expected weight of 3 elements, got {weight.numel()}")
    torch._check(bias.numel() == 1, lambda: f"polynorm.forward: expected bias of 1 element, got {bias.numel()}")
    _check_same_device("polynorm.forward", x, weight=weight, bias=bias)
    M = x.numel() // x.shape[-1]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = x.new_empty((M, 3), dtype=_rstd_dtype(x.dtype))
    return y, rstd


@torch.library.register_fake("polynorm::backward")
def _backward_fake(grad_y: Tensor, x: Tensor, weight: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    torch._check(
        grad_y.shape == x.shape,
        lambda: f"polynorm.backward: expected grad_y of x's shape {tuple(x.shape)}, got {tuple(grad_y.shape)}",
    )
    _check_same_device("polynorm.backward", x, grad_y=grad_y, weight=weight, rstd=rstd)
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return grad_x, weight.new_empty((3,)), weight.new_empty((1,))


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, _eps = inputs
    _y, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(x, weight, rstd)
    ctx.bias_shape = bias.shape
    ctx.bias_dtype = bias.dtype


def _backward(ctx, grad_y: Tensor, _grad_rstd: Tensor):
    need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
    if not (need_x or need_weight or need_bias):
        return None, None, None, None
    x, weight, rstd = ctx.saved_tensors
    grad_x, grad_weight, grad_bias = torch.ops.polynorm.backward(grad_y, x, weight, rstd)
    return (
        grad_x if need_x else None,
        grad_weight if need_weight else None,
        grad_bias.to(ctx.bias_dtype).reshape(ctx.bias_shape) if need_bias else None,
        None,
    )


torch.library.register_autograd("polynorm::forward", _backward, setup_context=_setup_context)


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
        eps: added to each mean square inside the square root; finite and >= 0.
        backend: ``"auto"`` (the CUDA kernels for CUDA tensors, the C++ kernel for CPU
            tensors), ``"cuda"`` (the CUDA kernels; x must be on a CUDA device),
            ``"triton"`` (the Triton kernels, ``torch.ops.polynorm.forward_triton``; x on a
            CUDA device, or on the CPU under ``TRITON_INTERPRET=1``; needs the ``triton``
            package) or ``"reference"`` (:func:`polynorm.reference.poly_norm`, plain PyTorch).

    Returns:
        y: x's shape and dtype, contiguous. Its gradient gives ``grad_weight`` in
        weight's dtype and ``grad_bias`` in bias's dtype and shape.

    Raises:
        ValueError: an unknown backend, or eps negative, NaN or infinite.
        RuntimeError: x not float32/float64/float16/bfloat16, x 0-d or with H = 0,
            weight without 3 elements, bias without 1 element, tensors on different
            devices, backend ``"cuda"`` with x not on a CUDA device, or backend
            ``"triton"`` without the triton package or with CPU tensors outside the
            interpreter. Each message names the op and the argument, with the expected
            and the actual value.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    if backend == "auto":
        return torch.ops.polynorm.forward(x, weight, bias, eps)[0]
    if backend == "cuda":
        if not x.is_cuda:
            raise RuntimeError(f"polynorm.poly_norm: backend 'cuda' expected x on a CUDA device, got {x.device}")
        return torch.ops.polynorm.forward(x, weight, bias, eps)[0]
    if backend == "triton":
        if _triton_kernels is None:
            raise RuntimeError(
                "polynorm.poly_norm: backend 'triton' expected the triton package to import, "
                f"got {_TRITON_IMPORT_ERROR}"
            )
        return torch.ops.polynorm.forward_triton(x, weight, bias, eps)[0]
    if backend == "reference":
        return reference.poly_norm(x, weight, bias, eps)
    raise ValueError(f"polynorm.poly_norm: expected backend to be one of {', '.join(BACKENDS)}, got {backend!r}")
