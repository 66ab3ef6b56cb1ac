"""Grouped PolyNorm for mixture-of-experts layers: :func:`poly_norm_grouped` and :class:`GroupedPolyNorm`.

PolyNorm (Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884) with one
``[w0, w1, w2, b]`` per expert. The rows of x arrive sorted by expert (as a token dispatch
leaves them), and expert e owns rows ``[offsets[e-1], offsets[e])`` (``offsets[-1] := 0``)::

    y = w[e,0] * norm(x^3) + w[e,1] * norm(x^2) + w[e,2] * norm(x) + b[e]
    norm(u) = u / sqrt(mean(u^2, dim=-1) + eps)

This module holds the Python side of ``torch.ops.polynorm.grouped_forward`` /
``grouped_backward`` (C++ CPU and CUDA kernels, ``csrc/polynorm_grouped_*``) and of their
Triton twins (:mod:`polynorm.triton_grouped`): fake kernels, autograd, the public function
and the module; and ``torch.ops.polynorm.grouped_forward_tensor_eps``, the op that
torch.compile calls for a tensor or NumPy eps (read and checked when the graph runs).
"""

import torch
from torch import Tensor, nn

from polynorm import reference
from polynorm._common import (
    check_eps,
    check_grouped_backward_args,
    check_grouped_forward_args,
    eps_operand,
    param_grads,
    refuse_double_backward,
    rstd_dtype,
    save_param_meta,
    saveable,
)
from polynorm.ops import BACKENDS, _check_tensor_eps_fake

try:  # registers torch.ops.polynorm.grouped_forward_triton and grouped_backward_triton
    from polynorm import triton_grouped as _triton_grouped
except ImportError as _error:  # Triton is optional: every other backend works without it
    _triton_grouped = None
    _TRITON_IMPORT_ERROR = f"{type(_error).__name__}: {_error}"

__all__ = ["GroupedPolyNorm", "poly_norm_grouped"]


@torch.library.register_fake("polynorm::grouped_forward")
def _grouped_forward_fake(
    x: Tensor, weight: Tensor, bias: Tensor, offsets: Tensor, eps: float = 1e-6
) -> tuple[Tensor, Tensor]:
    check_grouped_forward_args("polynorm.grouped_forward", x, weight, bias, offsets, eps)
    M = x.numel() // x.shape[-1]
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), x.new_empty((M, 3), dtype=rstd_dtype(x.dtype))


@torch.library.register_fake("polynorm::grouped_backward")
def _grouped_backward_fake(
    grad_y: Tensor, x: Tensor, weight: Tensor, offsets: Tensor, rstd: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    check_grouped_backward_args("polynorm.grouped_backward", grad_y, x, weight, offsets, rstd)
    acc = rstd_dtype(x.dtype)
    E = weight.shape[0]
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return grad_x, x.new_empty((E, 3), dtype=acc), x.new_empty((E,), dtype=acc)


def _register_grouped_autograd(forward_op: str, backward_op=None, *, by_backend: dict | None = None) -> None:
    """Makes ``forward_op`` (``grouped_forward``'s schema, then any further inputs) differentiable
    in x, weight and bias through ``backward_op`` (``grouped_backward``'s schema).
    ``needs_input_grad`` is honoured; grad_weight ``[E, 3]`` and grad_bias ``[E]`` come from the
    op in the accumulation dtype and are rounded here once, each to its own parameter's dtype
    and shape. An x or offsets made under ``torch.inference_mode()`` cannot be saved for
    backward: it is copied once, only when a backward is recorded.

    Args:
        backward_op: the backward op; it is given an autograd kernel that refuses double
            backward.
        by_backend: instead of ``backward_op``, for a forward whose sixth input is a backend
            name (``grouped_forward_tensor_eps``): each backend's backward op name under
            ``torch.ops.polynorm``.
    """

    def setup_context(ctx, inputs, output) -> None:
        x, weight, bias, offsets = inputs[:4]
        _y, rstd = output
        ctx.mark_non_differentiable(rstd)
        ctx.save_for_backward(saveable(x), weight, saveable(offsets), rstd)
        save_param_meta(ctx, weight, bias)
        ctx.backward_op = backward_op if by_backend is None else getattr(torch.ops.polynorm, by_backend[inputs[5]])

    def backward(ctx, grad_y: Tensor, _grad_rstd: Tensor):
        need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
        rest = (None,) * (len(ctx.needs_input_grad) - 3)  # offsets, eps (and backend)
        if not (need_x or need_weight or need_bias):
            return (None, None, None) + rest
        x, weight, offsets, rstd = ctx.saved_tensors
        grad_x, grad_weight, grad_bias = ctx.backward_op(grad_y, x, weight, offsets, rstd)
        return (grad_x if need_x else None,) + param_grads(ctx, grad_weight, grad_bias, need_weight, need_bias) + rest

    torch.library.register_autograd(forward_op, backward, setup_context=setup_context)
    if by_backend is None:
        refuse_double_backward(backward_op)


_register_grouped_autograd("polynorm::grouped_forward", torch.ops.polynorm.grouped_backward.default)
if _triton_grouped is not None:
    _register_grouped_autograd("polynorm::grouped_forward_triton", torch.ops.polynorm.grouped_backward_triton.default)


# eps as a tensor under torch.compile, as polynorm::forward_tensor_eps does for poly_norm
# (polynorm/ops.py): a tensor eps, or a NumPy scalar (a 0-d tensor to Dynamo), is a graph input
# whose value the trace cannot see, and the C++ schema's float refuses a data-dependent
# symbolic float. This op takes eps as a tensor and reads and checks it when the graph runs.
# Eagerly, poly_norm_grouped never uses it.
_GROUPED_KERNEL_OPS = {"auto": "grouped_forward", "cuda": "grouped_forward", "triton": "grouped_forward_triton"}


@torch.library.custom_op("polynorm::grouped_forward_tensor_eps", mutates_args=())
def _grouped_forward_tensor_eps(
    x: Tensor, weight: Tensor, bias: Tensor, offsets: Tensor, eps: Tensor, backend: str
) -> tuple[Tensor, Tensor]:
    """``polynorm::grouped_forward`` (backend ``"auto"``/``"cuda"``) or ``grouped_forward_triton``
    (``"triton"``) with eps a one-element real tensor, read (and checked: finite and >= 0, else
    poly_norm_grouped's ValueError) when the op runs."""
    value = check_eps("polynorm.poly_norm_grouped", eps)
    y, rstd = getattr(torch.ops.polynorm, _GROUPED_KERNEL_OPS[backend])(x, weight, bias, offsets, value)
    return y, rstd


@_grouped_forward_tensor_eps.register_fake
def _grouped_forward_tensor_eps_fake(x: Tensor, weight: Tensor, bias: Tensor, offsets: Tensor, eps: Tensor, backend: str):
    _check_tensor_eps_fake("polynorm.grouped_forward_tensor_eps", "polynorm.poly_norm_grouped", backend, eps)
    return _grouped_forward_fake(x, weight, bias, offsets, 0.0)  # eps's value is checked when the op runs


_register_grouped_autograd(
    "polynorm::grouped_forward_tensor_eps",
    by_backend={"auto": "grouped_backward", "cuda": "grouped_backward", "triton": "grouped_backward_triton"},
)


def _offsets_from_counts(counts, x: Tensor, weight: Tensor, op: str = "polynorm.poly_norm_grouped") -> Tensor:
    if not isinstance(counts, Tensor):
        raise TypeError(f"{op}: expected counts to be a Tensor, got {type(counts).__name__}")
    if counts.dtype not in (torch.int32, torch.int64):
        raise RuntimeError(f"{op}: expected counts to be int32 or int64, got {counts.dtype}")
    E = weight.shape[0] if isinstance(weight, Tensor) and weight.dim() >= 1 else None
    if counts.dim() != 1 or (E is not None and counts.shape[0] != E):
        expected = f"[{E}]" if E is not None else "[E]"
        raise RuntimeError(
            f"{op}: expected counts of shape {expected} (rows per expert of weight), got {list(counts.shape)}"
        )
    if isinstance(x, Tensor) and counts.device != x.device:
        raise RuntimeError(f"{op}: expected counts on x's device {x.device}, got {counts.device}")
    # On counts' device, no host synchronisation; int64, so no sum can overflow.
    return torch.cumsum(counts, 0, dtype=torch.int64)


def poly_norm_grouped(
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    offsets: Tensor | None = None,
    *,
    counts: Tensor | None = None,
    eps: float = 1e-6,
    backend: str = "auto",
) -> Tensor:
    """Grouped PolyNorm for mixture-of-experts layers: each row with its own expert's parameters.

    The rows of x (its leading dimensions flattened: M rows of H) are sorted by expert. Expert
    e owns rows ``[offsets[e-1], offsets[e])`` (``offsets[-1] := 0``), and for such a row::

        y = w[e,0] * norm(x^3) + w[e,1] * norm(x^2) + w[e,2] * norm(x) + b[e]
        norm(u) = u / sqrt(mean(u^2, dim=-1) + eps)

    over the last dimension H, accumulated in fp32 (fp64 for fp64 x) and rounded once to x's
    dtype: for each expert, exactly what :func:`polynorm.poly_norm` computes on that expert's
    rows with ``weight[e]`` and ``bias[e]``, in one launch for all experts. Differentiable in
    x, weight and bias.

    Group boundaries are read on the device (a search of offsets per row): no host
    synchronisation, so it can be captured in a CUDA graph and compiled. Rows at or past
    ``offsets[E-1]`` (padding of a capacity-sized buffer) belong to no expert: they are not
    read, y is 0 there and so is their gradient. Empty experts are allowed (their weight and
    bias gradients are 0).

    Each expert's weight and bias gradients are sums over its own rows in fp32 (fp64 for fp64
    x), in an order that depends only on how many rows it has: bitwise the same on every run,
    and bitwise what the same backend gives for that expert's rows alone. On the CPU they are
    also bitwise :func:`polynorm.poly_norm`'s on that expert's rows (docs/MATH.md, "Grouped
    PolyNorm").

    Args:
        x: ``(..., H)`` tensor of float32, float64, float16 or bfloat16, on the CPU or a CUDA
            device, rows sorted by expert. Rows with a unit last-dim stride and any row stride
            are read in place; other layouts are copied once.
        weight: ``[E, 3]``, one ``[w0, w1, w2]`` per expert (w0 scales the cubic term), any of
            those dtypes, E >= 1.
        bias: ``[E]`` or ``[E, 1]``, any of those dtypes.
        offsets: ``[E]`` int32 or int64 on x's device: cumulative end offsets, the convention
            of ``torch._grouped_mm``'s ``offs``. Non-decreasing and at most M; other values
            give undefined results (never an out-of-bounds access).
        counts: instead of offsets, ``[E]`` int32 or int64 rows per expert (non-negative);
            ``offsets = cumsum(counts)`` is formed on the device. Exactly one of offsets and
            counts.
        eps: added to each mean square inside the square root; a real number (Python or NumPy
            int or float, one-element real tensor; not a bool), finite and >= 0. Under
            torch.compile a Python float is a graph constant, and a NumPy or tensor eps is
            read, and checked, when the graph runs (``polynorm::grouped_forward_tensor_eps``).
        backend: ``"auto"`` (the CUDA kernels for CUDA tensors, the C++ kernel for CPU
            tensors: ``torch.ops.polynorm.grouped_forward``), ``"cuda"`` (x must be on a CUDA
            device), ``"triton"`` (``torch.ops.polynorm.grouped_forward_triton``; CPU tensors
            only under ``TRITON_INTERPRET=1``) or ``"reference"``
            (:func:`polynorm.reference.poly_norm_grouped`, plain PyTorch).

    Returns:
        y: x's shape and dtype, contiguous. Its gradient gives each parameter's gradient in
        that parameter's own dtype and shape, summed in fp32 (fp64 for fp64 x) and rounded
        once.

    Raises:
        TypeError: offsets or counts not a tensor, both or neither given, eps not a real number.
        ValueError: an unknown backend, or eps negative, NaN or infinite.
        RuntimeError: x not float32/float64/float16/bfloat16, 0-d or with H = 0; weight not
            ``[E, 3]`` with E >= 1; bias not ``[E]`` or ``[E, 1]``; offsets or counts not
            int32/int64 of shape ``[E]``; tensors on different devices; backend ``"cuda"``
            with x not on a CUDA (or meta) device; backend ``"triton"`` without the triton
            package or with CPU tensors outside the interpreter. Each message names the op and
            the argument, with the expected and the actual value.

    Example::

        # Motif-style MoE MLP: tokens sorted by expert, one PolyNorm per expert.
        counts = torch.bincount(expert_ids, minlength=E)  # on the GPU, no sync
        offsets = torch.cumsum(counts, 0)                  # cumulative ends, still on the GPU
        h = torch._grouped_mm(x_sorted, w_up, offs=offsets.int())
        h = polynorm.poly_norm_grouped(h, weight, bias, offsets)  # or counts=counts

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    op_name = "polynorm.poly_norm_grouped"
    if (offsets is None) == (counts is None):
        raise TypeError(
            f"{op_name}: expected exactly one of offsets and counts, got {'both' if counts is not None else 'neither'}"
        )
    if counts is not None:
        offsets = _offsets_from_counts(counts, x, weight)
    elif not isinstance(offsets, Tensor):
        raise TypeError(f"{op_name}: expected offsets to be a Tensor, got {type(offsets).__name__}")
    if type(eps) is not float:  # the common case, a Python float, goes straight to the op
        eps = eps_operand(op_name, eps)  # a tensor only under torch.compile
    if backend in ("auto", "cuda"):
        if backend == "cuda" and not (x.is_cuda or x.is_meta):
            raise RuntimeError(f"{op_name}: backend 'cuda' expected x on a CUDA device (or the meta device), got {x.device}")
        op = torch.ops.polynorm.grouped_forward
    elif backend == "triton":
        if _triton_grouped is None:
            raise RuntimeError(f"{op_name}: backend 'triton' expected the triton package to import, got {_TRITON_IMPORT_ERROR}")
        op = torch.ops.polynorm.grouped_forward_triton
    elif backend == "reference":
        traced = torch.compiler.is_compiling()
        if isinstance(eps, Tensor):  # checked when the graph runs, by polynorm::checked_eps
            check_grouped_forward_args(op_name, x, weight, bias, offsets, 0.0, traced=traced)
            eps = torch.ops.polynorm.checked_eps(eps, op_name)
        else:
            eps = check_grouped_forward_args(op_name, x, weight, bias, offsets, eps, traced=traced)
        return reference._poly_norm_grouped(x, weight, bias, offsets, eps)
    else:
        raise ValueError(f"{op_name}: expected backend to be one of {', '.join(BACKENDS)}, got {backend!r}")
    if isinstance(eps, Tensor):
        return torch.ops.polynorm.grouped_forward_tensor_eps(x, weight, bias, offsets, eps, backend)[0]
    return op(x, weight, bias, offsets, eps)[0]


class GroupedPolyNorm(nn.Module):
    """PolyNorm with one set of parameters per expert, for mixture-of-experts layers.

    ``forward(x, offsets=None, counts=None)`` is :func:`poly_norm_grouped` with this module's
    parameters: x's rows sorted by expert, and exactly one of ``offsets`` (cumulative end
    offsets, ``[E]`` int32/int64 on x's device) or ``counts`` (rows per expert).
    (Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.)

    Args:
        num_experts: E, an int >= 1.
        eps: added to each mean square inside the square root; finite and >= 0, stored as a
            Python float.
        device, dtype: of the parameters (any float dtype, independent of the input's).
        backend: see :func:`poly_norm_grouped`.

    Parameters:
        weight: ``[E, 3]``, each row ``[w0, w1, w2]`` initialised to ``[1/3, 1/3, 1/3]``, as
            :class:`polynorm.PolyNorm` (PolyCom's initialisation) for each expert.
        bias: ``[E]``, initialised to 0. A state whose bias is ``[E, 1]`` (Motif-3's
            checkpoints) loads too.

    Shape:
        input ``(..., H)`` of float32, float64, float16 or bfloat16; output the same shape
        and dtype.

    Raises:
        TypeError: num_experts not an int, eps not a real number.
        ValueError: num_experts < 1, eps negative, NaN or infinite, or an unknown backend.
    """

    def __init__(self, num_experts: int, eps: float = 1e-6, device=None, dtype=None, backend: str = "auto") -> None:
        super().__init__()
        if not isinstance(num_experts, int) or isinstance(num_experts, bool):
            raise TypeError(f"polynorm.GroupedPolyNorm: expected num_experts to be an int, got {type(num_experts).__name__}")
        if num_experts < 1:
            raise ValueError(f"polynorm.GroupedPolyNorm: expected num_experts >= 1, got {num_experts}")
        if backend not in BACKENDS:
            raise ValueError(f"polynorm.GroupedPolyNorm: expected backend to be one of {', '.join(BACKENDS)}, got {backend!r}")
        factory = {"device": device, "dtype": dtype}
        self.num_experts = num_experts
        self.eps = check_eps("polynorm.GroupedPolyNorm", eps)
        self.backend = backend
        self.weight = nn.Parameter(torch.empty(num_experts, 3, **factory))
        self.bias = nn.Parameter(torch.empty(num_experts, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(1.0 / 3.0)
            self.bias.zero_()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # A bias stored as [E, 1] (Motif-3's checkpoints) loads into the [E] parameter.
        key = prefix + "bias"
        bias = state_dict.get(key)
        if isinstance(bias, Tensor) and tuple(bias.shape) == (self.num_experts, 1):
            state_dict[key] = bias.reshape(self.num_experts)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: Tensor, offsets: Tensor | None = None, counts: Tensor | None = None) -> Tensor:
        return poly_norm_grouped(x, self.weight, self.bias, offsets, counts=counts, eps=self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, eps={self.eps}, backend={self.backend!r}"
