"""DTensor sharding rules for the polynorm ops (sequence and data parallelism).

PolyNorm reduces over the last dimension only, so an input sharded on any other dimension
is computed shard by shard with no communication:

- forward ``(x, weight, bias, eps) -> (y, rstd)``: x ``Shard(d)`` for any d but the last,
  weight and bias ``Replicate()``; y comes out ``Shard(d)`` and rstd ``Shard(0)``.
- backward ``(grad_y, x, weight, rstd) -> (grad_x, grad_weight, grad_bias)``: grad_y and x
  ``Shard(d)``, weight ``Replicate()``, rstd ``Shard(0)``; grad_x comes out ``Shard(d)``,
  and grad_weight and grad_bias ``Partial()`` (each rank holds the sum over its rows; the
  sum over ranks is the gradient, reduced when the Partial is redistributed or read with
  ``full_tensor()``).
- The fused PolyNorm x mul, ``mul_forward (x, mul, weight, bias, eps) -> (out, rstd)``: mul
  is sharded like x (``Shard(d)``), out comes out ``Shard(d)`` and rstd ``Shard(0)``;
  ``mul_backward (grad_out, x, mul, weight, bias, rstd) -> (grad_x, grad_mul, grad_weight,
  grad_bias)``: grad_out, x and mul ``Shard(d)``, weight and bias ``Replicate()``, rstd
  ``Shard(0)``; grad_x and grad_mul come out ``Shard(d)``, grad_weight and grad_bias
  ``Partial()``. Each row of out is that row's PolyNorm times the same row of mul, so a
  shard's rows need nothing from another rank's.
- Everything ``Replicate()`` is also accepted, and DTensor redistributes other layouts
  (sharded parameters, an x and a mul sharded differently) to one of these before the op runs.

Tensor parallelism, x sharded on its last dimension (``Shard(-1)``, the hidden dimension, on
one mesh dimension; other mesh dimensions may shard the rows or replicate): PolyNorm needs
the whole row's sums, which no placement rule of one op can express without gathering x.
:func:`polynorm.poly_norm` and :func:`polynorm.poly_norm_mul` therefore route such an x to
:func:`sharded_poly_norm`, which runs :mod:`polynorm.tp` on the local shards over that mesh
dimension's process group: one all-reduce of ``[M, 3]`` sums in forward and one in backward,
y (out, dx, dmul) ``Shard(-1)`` like x, weight and bias gradients ``Partial()`` on every mesh
dimension that shards x (``Replicate()`` on the others). The ops themselves, called directly
on such an x, keep DTensor's default: x is gathered first.

rstd is the forward's cache for backward, ``[rows, 3]`` with rows = x's leading
dimensions flattened. For d = 0 its ``Shard(0)`` is exact; for d > 0 each rank's rows are
its own shard's rows, so the global view of rstd lists the rows shard by shard. Backward
takes it back in that same layout, which is all rstd is for; do not redistribute it.

The grouped PolyNorm (``grouped_forward (x, weight, bias, offsets, eps) -> (y, rstd)``,
``grouped_backward (grad_y, x, weight, offsets, rstd) -> (grad_x, grad_weight,
grad_bias)``) gets one rule: every tensor ``Replicate()``, every output ``Replicate()``.
Its offsets are global row indices into x, so a rank holding a shard of the rows would
read them against the wrong rows: no row sharding is right without rewriting offsets per
shard, which is the token dispatch's work, not the op's. An x sharded on its rows is
therefore gathered by DTensor (an all-gather in forward, and of grad_y in backward) and
every rank computes all rows: correct, not parallel. offsets must be a DTensor too
(``Replicate()``; DTensor refuses a plain tensor next to DTensors). For expert
parallelism, call :func:`polynorm.poly_norm_grouped` on each rank's local tokens and
offsets, as plain tensors.

Not registered: ``polynorm::forward_tensor_eps``, ``mul_forward_tensor_eps`` and
``grouped_forward_tensor_eps``. Eagerly the public functions turn every eps into a Python
float and call the ops above; those three are reached only from a graph that torch.compile
traced with a tensor eps.

Registered on import of :mod:`polynorm` when ``torch.distributed`` is available, for every
op above that exists in this process: ``polynorm::forward``/``backward``,
``mul_forward``/``mul_backward``, ``grouped_forward``/``grouped_backward`` and, when Triton
is installed, their ``_triton`` twins.
"""

import math

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding

__all__ = ["register", "shards_hidden", "sharded_poly_norm"]


_NOT_GIVEN = object()


def _forward_sharding(x, weight, bias, eps=_NOT_GIVEN):
    # Placements: outputs [y, rstd], then inputs [x, weight, bias] and eps when it was passed.
    scalar = [] if eps is _NOT_GIVEN else [None]
    rules = [([Replicate(), Replicate()], [Replicate(), Replicate(), Replicate(), *scalar])]
    for d in range(x.ndim - 1):
        rules.append(([Shard(d), Shard(0)], [Shard(d), Replicate(), Replicate(), *scalar]))
    return rules


def _backward_sharding(grad_y, x, weight, rstd):
    # Placements: outputs [grad_x, grad_weight, grad_bias], then inputs [grad_y, x, weight, rstd].
    rules = [([Replicate(), Replicate(), Replicate()], [Replicate(), Replicate(), Replicate(), Replicate()])]
    for d in range(x.ndim - 1):
        rules.append(([Shard(d), Partial(), Partial()], [Shard(d), Shard(d), Replicate(), Shard(0)]))
    return rules


def _mul_forward_sharding(x, mul, weight, bias, eps=_NOT_GIVEN):
    # Placements: outputs [out, rstd], then inputs [x, mul, weight, bias] and eps when it was passed.
    scalar = [] if eps is _NOT_GIVEN else [None]
    rules = [([Replicate(), Replicate()], [Replicate(), Replicate(), Replicate(), Replicate(), *scalar])]
    for d in range(x.ndim - 1):
        rules.append(([Shard(d), Shard(0)], [Shard(d), Shard(d), Replicate(), Replicate(), *scalar]))
    return rules


def _mul_backward_sharding(grad_out, x, mul, weight, bias, rstd):
    # Placements: outputs [grad_x, grad_mul, grad_weight, grad_bias], then inputs
    # [grad_out, x, mul, weight, bias, rstd].
    rules = [([Replicate()] * 4, [Replicate()] * 6)]
    for d in range(x.ndim - 1):
        rules.append((
            [Shard(d), Shard(d), Partial(), Partial()],
            [Shard(d), Shard(d), Shard(d), Replicate(), Replicate(), Shard(0)],
        ))
    return rules


def _grouped_forward_sharding(x, weight, bias, offsets, eps=_NOT_GIVEN):
    # Replicate only (offsets index x's global rows; see the module's docstring). Placements:
    # outputs [y, rstd], then inputs [x, weight, bias, offsets] and eps when it was passed.
    scalar = [] if eps is _NOT_GIVEN else [None]
    return [([Replicate(), Replicate()], [Replicate()] * 4 + scalar)]


def _grouped_backward_sharding(grad_y, x, weight, offsets, rstd):
    # Replicate only. Placements: outputs [grad_x, grad_weight, grad_bias], then inputs
    # [grad_y, x, weight, offsets, rstd].
    return [([Replicate()] * 3, [Replicate()] * 5)]


_RULES = {
    "forward": _forward_sharding,
    "backward": _backward_sharding,
    "mul_forward": _mul_forward_sharding,
    "mul_backward": _mul_backward_sharding,
    "grouped_forward": _grouped_forward_sharding,
    "grouped_backward": _grouped_backward_sharding,
}


def register() -> None:
    """Registers the rules above for every polynorm op that exists in this process (the
    ``_triton`` ops exist when Triton is installed); a forward and its backward together."""
    for fwd, bwd in [("forward", "backward"), ("mul_forward", "mul_backward"), ("grouped_forward", "grouped_backward")]:
        for suffix in ("", "_triton"):
            if hasattr(torch.ops.polynorm, fwd + suffix) and hasattr(torch.ops.polynorm, bwd + suffix):
                register_sharding(getattr(torch.ops.polynorm, fwd + suffix).default)(_RULES[fwd])
                register_sharding(getattr(torch.ops.polynorm, bwd + suffix).default)(_RULES[bwd])


# --------------------------------------------------------------------------------------
# Tensor parallelism: x sharded on its last dimension
# --------------------------------------------------------------------------------------


def shards_hidden(x) -> bool:
    """Whether x is a DTensor sharded on its last dimension (on any mesh dimension)."""
    return isinstance(x, DTensor) and any(p.is_shard() and p.dim % x.ndim == x.ndim - 1 for p in x.placements)


def sharded_poly_norm(op: str, x, mul, weight, bias, eps, backend: str):
    """PolyNorm (times mul) of a DTensor x sharded on its last dimension, through
    :mod:`polynorm.tp` on the local shards (see the module's docstring). weight and bias (and
    mul) are redistributed to the layout the op needs when they differ (weight and bias
    ``Replicate()``, mul like x); a plain weight or bias is taken as replicated."""
    from polynorm import tp

    mesh = x.device_mesh
    hidden = [i for i, p in enumerate(x.placements) if p.is_shard() and p.dim % x.ndim == x.ndim - 1]
    if len(hidden) != 1:
        raise ValueError(f"{op}: expected x's last dimension sharded on one mesh dimension, got placements "
                         f"{x.placements}")  # fmt: skip
    group = mesh.get_group(hidden[0])
    # A weight's gradient sums over the rows: a share per rank wherever x is sharded.
    grad_placements = [Partial() if p.is_shard() else Replicate() for p in x.placements]

    def local_param(t):
        if not isinstance(t, DTensor):
            return t
        if any(not p.is_replicate() for p in t.placements):
            t = t.redistribute(mesh, [Replicate()] * mesh.ndim)
        return t.to_local(grad_placements=grad_placements)

    if mul is not None:
        if not isinstance(mul, DTensor):
            raise TypeError(f"{op}: expected mul to be a DTensor like x, got {type(mul).__name__}")
        if mul.placements != x.placements:
            mul = mul.redistribute(mesh, x.placements)
        mul = mul.to_local()
    w, b = local_param(weight), local_param(bias)
    hidden_size = x.shape[-1]
    x_local = x.to_local()
    if mul is None:
        out = tp.poly_norm(x_local, w, b, group, hidden_size=hidden_size, eps=eps, backend=backend)
    else:
        out = tp.poly_norm_mul(x_local, mul, w, b, group, hidden_size=hidden_size, eps=eps, backend=backend)
    stride = tuple(math.prod(x.shape[d + 1:]) for d in range(x.ndim))  # out is contiguous
    return DTensor.from_local(out, mesh, x.placements, run_check=False, shape=x.shape, stride=stride)
