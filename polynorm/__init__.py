"""polynorm: PolyNorm kernels for PyTorch.

PolyNorm (Zhuo et al., "Polynomial Composition Activations: Unleashing the Dynamics of
Large Language Models", arXiv:2411.03884)::

    y = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b
    norm(u) = u / sqrt(mean(u^2, dim=-1) + eps)

The gated MLP's fused PolyNorm x mul, ``out = poly_norm(x) * mul``, is
:func:`poly_norm_mul` and :class:`FusedMulPolyNorm`; mixture-of-experts layers have
:func:`poly_norm_grouped` / :class:`GroupedPolyNorm`, and Motif-3's MoE activation is
:func:`poly_norm_grouped_mul` / :class:`GroupedMulPolyNorm`.

Importing this package loads the compiled library, which registers
``torch.ops.polynorm.forward`` and ``backward``, and ``mul_forward`` and ``mul_backward``.

:mod:`polynorm.layers` holds drop-ins for the modules of Motif's kernels (the kernels-hub
kernel ``Motif-Technologies/activation``), and :func:`patch_model` swaps the PolyNorm
modules of a model (Motif's, the hub's, Liger's) for polynorm's in one call.
Tensor parallelism (the hidden dimension sharded over a process group, one all-reduce of
``[M, 3]`` sums a direction) is :mod:`polynorm.tp`; a DTensor sharded on its last dimension
takes that path through :func:`poly_norm` and :func:`poly_norm_mul`.
"""

import torch

from polynorm import _C  # noqa: F401  (registers torch.ops.polynorm.*)
from polynorm import reference, tp
from polynorm.module import FusedMulPolyNorm, PolyNorm
from polynorm.ops import BACKENDS, poly_norm, poly_norm_mul
from polynorm.grouped import GroupedPolyNorm, poly_norm_grouped
from polynorm import layers
from polynorm.patch import patch_model
from polynorm.moe import GroupedMulPolyNorm, poly_norm_grouped_mul, poly_norm_grouped_mul_fp8, poly_norm_grouped_mul_topk

if torch.distributed.is_available():  # DTensor sharding rules: sequence parallelism needs no communication
    from polynorm import _sharding

    _sharding.register()

__all__ = [
    "BACKENDS",
    "FusedMulPolyNorm",
    "GroupedMulPolyNorm",
    "GroupedPolyNorm",
    "PolyNorm",
    "layers",
    "patch_model",
    "poly_norm",
    "poly_norm_grouped",
    "poly_norm_grouped_mul",
    "poly_norm_grouped_mul_fp8",
    "poly_norm_grouped_mul_topk",
    "poly_norm_mul",
    "reference",
    "tp",
]
__version__ = "0.1.0"
