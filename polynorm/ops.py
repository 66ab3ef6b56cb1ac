"""Python side of the polynorm ops: fake (meta) kernels, autograd, and the public function.

The kernels themselves are C++/CUDA (``csrc/``) and Triton (``polynorm/triton_kernels.py``);
importing :mod:`polynorm._C` registers ``torch.ops.polynorm.forward`` and
``torch.ops.polynorm.backward``.
"""

import torch
from torch import Tensor

from polynorm import reference
from polynorm._common import check_backward_args, check_forward_args, refuse_double_backward, rstd_dtype

try:  # registers torch.ops.polynorm.forward_triton and backward_triton
    from polynorm import triton_kernels as _triton_kernels
except ImportError as _error:  # Triton is optional: every other backend works without it
    _triton_kernels = None
    _TRITON_IMPORT_ERROR = f"{type(_error).__name__}: {_error}"

__all__ = ["poly_norm", "BACKENDS"]

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
    return grad_x, weight.new_empty((3,)), weight.new_empty((1,))


# polynorm::forward is differentiable through its C++ autograd kernel (csrc/polynorm_autograd.cpp).
refuse_double_backward(torch.ops.polynorm.backward.default)


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
        eps: added to each mean square inside the square root; a real number (Python or
            NumPy scalar; a one-element tensor in eager mode), finite and >= 0.
        backend: ``"auto"`` (the CUDA kernels for CUDA tensors, the C++ kernel for CPU
            tensors), ``"cuda"`` (the CUDA kernels; x must be on a CUDA device),
            ``"triton"`` (the Triton kernels, ``torch.ops.polynorm.forward_triton``; x on a
            CUDA device, or on the CPU under ``TRITON_INTERPRET=1``; needs the ``triton``
            package) or ``"reference"`` (:func:`polynorm.reference.poly_norm`, plain PyTorch).

    Returns:
        y: x's shape and dtype, contiguous. Its gradient gives ``grad_weight`` in
        weight's dtype and ``grad_bias`` in bias's dtype and shape.

    Raises:
        TypeError: eps not a real number, with backend ``"reference"`` (the ops' schemas
            refuse it with a RuntimeError for the other backends).
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
        eps = check_forward_args("polynorm.poly_norm", x, weight, bias, eps, traced=torch.compiler.is_compiling())
        return reference.poly_norm(x, weight, bias, eps)
    raise ValueError(f"polynorm.poly_norm: expected backend to be one of {', '.join(BACKENDS)}, got {backend!r}")
