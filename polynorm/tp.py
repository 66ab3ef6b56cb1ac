"""Tensor-parallel PolyNorm: the hidden dimension sharded over a process group.

In a tensor-parallel gated MLP the gate and up projections are column-parallel, so each rank
holds a slice of every row's H columns. PolyNorm normalises over the whole row; its statistics
are sums, which split over the shards (``docs/MATH.md`` (12)-(15)):

- forward: each rank sums x^2, x^4 and x^6 over its columns (``[M, 3]`` fp32, fp64 for fp64
  x), one ``all_reduce`` of those sums, and each rank finishes its own columns;
- backward: each rank sums g x, g x^2 and g x^3 over its columns, one ``all_reduce`` of
  ``[M, 3]``, and each rank writes its dx (and dmul);
- weight and bias gradients are each rank's share: sum them over the group (as DTensor's
  ``Partial()`` is reduced; Megatron-LM all-reduces its sequence-parallel norm weights' grads the
  same way) to get the gradient of the unsharded op.

Nothing else is communicated, and nothing waits on the host: the collectives are enqueued on the
device's stream (NCCL) like any other kernel. With gloo the same path runs on the CPU, and on CUDA
tensors too.

Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
"""

from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from polynorm import reference
from polynorm._common import check_eps, check_sharded_params

__all__ = ["BACKENDS", "poly_norm", "poly_norm_mul"]

BACKENDS = ("auto", "cuda", "triton", "reference")


class _Passes(NamedTuple):
    forward_stats: object
    forward_apply: object
    backward_stats: object
    backward_apply: object


def _passes(op: str, backend: str) -> _Passes:
    """The four sharded passes of ``backend``: ``"auto"`` the C++ ops (the CPU kernel for CPU
    tensors, the CUDA kernels for CUDA ones), ``"cuda"`` the same ops for CUDA tensors only
    (:func:`_check_device`), ``"triton"`` their Triton twins, ``"reference"`` the float64
    oracles (:mod:`polynorm.reference`)."""
    if backend == "reference":
        return _Passes(reference.sharded_forward_stats, reference.sharded_forward_apply,
                       reference.sharded_backward_stats, reference.sharded_backward_apply)  # fmt: skip
    if backend in ("auto", "cuda"):
        ops = torch.ops.polynorm
        return _Passes(ops.sharded_forward_stats, ops.sharded_forward_apply, ops.sharded_backward_stats,
                       ops.sharded_backward_apply)  # fmt: skip
    if backend == "triton":
        try:
            from polynorm import triton_sharded  # noqa: F401  (registers the *_triton ops)
        except ImportError as error:
            raise RuntimeError(f"{op}: backend 'triton' expected the triton package to import, got "
                               f"{type(error).__name__}: {error}") from error  # fmt: skip
        ops = torch.ops.polynorm
        return _Passes(ops.sharded_forward_stats_triton, ops.sharded_forward_apply_triton,
                       ops.sharded_backward_stats_triton, ops.sharded_backward_apply_triton)  # fmt: skip
    raise ValueError(f"{op}: expected backend to be one of {', '.join(BACKENDS)}, got {backend!r}")


def _check_device(op: str, backend: str, x: Tensor) -> None:
    # "auto" picks the CPU or CUDA kernels by x's device; "cuda" promises the CUDA ones.
    if backend == "cuda" and x.device.type not in ("cuda", "meta"):
        raise RuntimeError(f"{op}: backend 'cuda' expected x on a CUDA device (or the meta device), got {x.device}")


def _all_reduce(sums: Tensor, group) -> Tensor:
    # The one collective of each direction: the shards' [M, 3] sums, added (MATH.md (12), (13)).
    dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)
    return sums


class _ShardedPolyNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mul, weight, bias, group, hidden_size, eps, passes):
        sums = _all_reduce(passes.forward_stats(x), group)
        out, rstd = passes.forward_apply(x, mul, sums, weight, bias, hidden_size, eps)
        ctx.save_for_backward(x, mul, weight, bias, rstd)
        ctx.group, ctx.hidden_size, ctx.passes = group, hidden_size, passes
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, mul, weight, bias, rstd = ctx.saved_tensors
        passes = ctx.passes
        sums, grad_weight, grad_bias = passes.backward_stats(grad_out, x, mul, rstd)
        _all_reduce(sums, ctx.group)
        grad_x, grad_mul = passes.backward_apply(grad_out, x, mul, weight, bias, rstd, sums, ctx.hidden_size)
        need_x, need_mul, need_w, need_b = ctx.needs_input_grad[:4]
        return (
            grad_x if need_x else None,
            grad_mul if need_mul else None,
            grad_weight.to(weight.dtype).reshape(weight.shape) if need_w else None,
            grad_bias.to(bias.dtype).reshape(bias.shape) if need_b else None,
            None, None, None, None,
        )  # fmt: skip


def _check_hidden_size(op: str, x: Tensor, hidden_size) -> int:
    if isinstance(hidden_size, bool) or not isinstance(hidden_size, int):
        raise TypeError(f"{op}: expected hidden_size to be an int (the unsharded H), got {type(hidden_size).__name__}")
    if hidden_size < 1 or hidden_size < x.shape[-1]:
        raise ValueError(f"{op}: expected hidden_size (the unsharded H) >= 1 and >= x's shard width "
                         f"{x.shape[-1]}, got {hidden_size}")  # fmt: skip
    return hidden_size


def poly_norm(
    x: Tensor, weight: Tensor, bias: Tensor, group=None, *, hidden_size: int, eps: float = 1e-6, backend: str = "auto"
) -> Tensor:
    """PolyNorm of rows whose H columns are sharded over ``group``: this rank's columns of
    ``y = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b``,
    ``norm(u) = u / sqrt(mean(u^2 over all H columns) + eps)``.

    Every rank of ``group`` calls it with its shard of the same rows (any split of the columns,
    a rank with none too). One ``all_reduce`` of ``[M, 3]`` fp32 sums (fp64 for fp64 x) in
    forward and one in backward; nothing else is communicated.

    Args:
        x: ``(..., H_shard)``, float32, float64, float16 or bfloat16: this rank's columns of each
            row (``H_shard`` may be 0); the leading dimensions are the same on every rank.
        weight: ``(3,)`` ``[w0, w1, w2]``, bias ``(1,)`` or ``()``: the same on every rank.
        group: the process group the columns are sharded over (None: the default group).
        hidden_size: the unsharded H, the sum of the ranks' ``H_shard`` (a keyword: an uneven
            split cannot be inferred from one rank's shard without asking the others).
        eps: added to each mean square inside the square root; finite and >= 0.
        backend: ``"auto"`` (the C++ CPU or CUDA kernels, by x's device), ``"cuda"`` (the CUDA
            kernels: x on a CUDA device), ``"triton"`` (CUDA tensors, or CPU tensors under
            ``TRITON_INTERPRET=1``) or ``"reference"`` (float64).

    Returns:
        This rank's columns of y: x's shape and dtype. Differentiable in x, weight and bias.
        weight's and bias's gradients are **this rank's share**, in their own dtypes: sum them
        over ``group`` for the gradient of the unsharded op (docs/MATH.md (14)).

    Raises:
        ValueError: an unknown backend, hidden_size below 1 or below H_shard, eps negative
            or not finite. TypeError: x, weight or bias not a tensor, hidden_size not an int.
            RuntimeError: x not float32/float64/float16/bfloat16 or 0-d, weight not ``(3,)``,
            bias not ``(1,)`` or ``()``, or either not of a float dtype or not on x's device:
            checked for every backend, naming this function; backend ``"cuda"`` with x not on a
            CUDA (or meta) device.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    op = "polynorm.tp.poly_norm"
    passes = _passes(op, backend)
    # Checked here for every backend: the float64 oracles of backend "reference" check nothing.
    check_sharded_params(op, x, None, weight, bias)
    _check_device(op, backend, x)
    eps = check_eps(op, eps)
    return _ShardedPolyNorm.apply(x, None, weight, bias, group, _check_hidden_size(op, x, hidden_size), eps, passes)


def poly_norm_mul(
    x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, group=None, *, hidden_size: int, eps: float = 1e-6,
    backend: str = "auto",
) -> Tensor:  # fmt: skip
    """The fused PolyNorm x mul of rows whose H columns are sharded over ``group``: this
    rank's columns of ``out = poly_norm(x) * mul`` (the gated MLP's ``down(PolyNorm(gate(x)) *
    up(x))`` with gate and up column-parallel). y is formed in fp32 (fp64), multiplied by mul
    there and rounded once (docs/MATH.md (8)).

    Args:
        mul: x's shape, dtype and device: this rank's columns of the up projection.
        x, weight, bias, group, hidden_size, eps, backend: as in :func:`poly_norm`.

    Returns:
        This rank's columns of out, x's shape and dtype. Differentiable in x, mul, weight and
        bias; weight's and bias's gradients are this rank's share (sum them over ``group``).

    Raises:
        As :func:`poly_norm`; RuntimeError also for mul of another shape, dtype or device.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    op = "polynorm.tp.poly_norm_mul"
    passes = _passes(op, backend)
    if not isinstance(mul, Tensor):
        raise TypeError(f"{op}: expected mul to be a Tensor, got {type(mul).__name__}")
    check_sharded_params(op, x, mul, weight, bias)  # as in poly_norm
    _check_device(op, backend, x)
    eps = check_eps(op, eps)
    return _ShardedPolyNorm.apply(x, mul, weight, bias, group, _check_hidden_size(op, x, hidden_size), eps, passes)
