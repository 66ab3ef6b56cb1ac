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
- Everything ``Replicate()`` is also accepted, and DTensor redistributes other layouts
  (a sharded last dimension, sharded parameters) to one of these before the op runs.

rstd is the forward's cache for backward, ``[rows, 3]`` with rows = x's leading
dimensions flattened. For d = 0 its ``Shard(0)`` is exact; for d > 0 each rank's rows are
its own shard's rows, so the global view of rstd lists the rows shard by shard. Backward
takes it back in that same layout, which is all rstd is for; do not redistribute it.

Registered on import of :mod:`polynorm` when ``torch.distributed`` is available, for
``polynorm::forward``/``backward`` and, when Triton is installed,
``polynorm::forward_triton``/``backward_triton``.
"""

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding

__all__ = ["register"]


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


def register() -> None:
    """Registers the rules above for every polynorm op that exists in this process."""
    pairs = [("forward", "backward"), ("forward_triton", "backward_triton")]
    for fwd, bwd in pairs:
        if hasattr(torch.ops.polynorm, fwd) and hasattr(torch.ops.polynorm, bwd):
            register_sharding(getattr(torch.ops.polynorm, fwd).default)(_forward_sharding)
            register_sharding(getattr(torch.ops.polynorm, bwd).default)(_backward_sharding)
