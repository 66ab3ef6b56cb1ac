"""Drop-ins for the ``layers`` of Motif's kernels, and the gated MLP the fused op serves.

``polynorm.layers`` stands where ``layers`` of the Hugging Face kernels-hub kernel
``Motif-Technologies/activation`` (``kernels.get_kernel("Motif-Technologies/activation")``)
stands: :class:`PolyNorm` and :class:`FusedMulPolyNorm` take its constructor arguments
(``eps``, then ``dtype``, float32 by default), hold its parameters under its state_dict keys
(``weight`` ``(3,)``, ``bias`` ``(1,)``) and have its forward signatures (``forward(x)``,
``forward(x, mul)``), so a checkpoint or a call written for one serves the other. They run
polynorm's ops (:func:`polynorm.poly_norm`, :func:`polynorm.poly_norm_mul`), whose fp32
parameters sit beside bf16 (or fp16, fp32, fp64) activations; the output has x's dtype.

:class:`GatedMLP` is Motif's gated MLP, ``down_proj(PolyNorm(gate_proj(x)) * up_proj(x))``,
with the product fused: :func:`polynorm.patch_model` puts it in the place of an MLP that
multiplies an eager PolyNorm's output by ``up_proj(x)``.

PolyNorm: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
"""

import torch
from torch import Tensor, nn

from polynorm import module

__all__ = ["FusedMulPolyNorm", "GatedMLP", "PolyNorm"]


class PolyNorm(module.PolyNorm):
    """PolyNorm, as ``layers.PolyNorm`` of the kernels-hub kernel ``Motif-Technologies/activation``.

    ``y = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b`` with
    ``norm(u) = u / sqrt(mean(u^2, dim=-1) + eps)`` over the last dimension, by
    :func:`polynorm.poly_norm` (sums in fp32, y rounded once to x's dtype). An instance is a
    :class:`polynorm.PolyNorm`; only the constructor's order and ``dtype``'s default differ.

    Args:
        eps: added to each mean square inside the square root; a real number, finite and
            >= 0, stored as a Python float.
        dtype: of the parameters, float32 by default whatever torch's default dtype is (as
            the hub's module); ``None`` takes torch's default dtype.
        device: of the parameters.
        backend: see :func:`polynorm.poly_norm` (``"auto"``: the CUDA kernels for CUDA
            tensors, the C++ kernel for CPU tensors).

    Parameters:
        weight: ``(3,)``, ``[w0, w1, w2]``, initialised to ``[1/3, 1/3, 1/3]``.
        bias: ``(1,)``, initialised to ``0``. (:func:`polynorm.patch_model` may set a
            ``()`` bias, Liger's, which the ops take as well.)

    Shape:
        input ``(..., H)`` of float32, float64, float16 or bfloat16; output the same shape
        and dtype.

    Raises:
        TypeError: eps not a real number.
        ValueError: eps negative, NaN or infinite, or an unknown backend.
    """

    def __init__(self, eps: float = 1e-6, dtype: torch.dtype | None = torch.float32, device=None,
                 backend: str = "auto") -> None:
        # module.PolyNorm's constructor takes (eps, device, dtype): its parent's takes the name.
        super(module.PolyNorm, self).__init__("polynorm.layers.PolyNorm", eps, device, dtype, backend)


class FusedMulPolyNorm(module.FusedMulPolyNorm):
    """``forward(x, mul) = poly_norm(x) * mul``, as ``layers.FusedMulPolyNorm`` of the hub's kernel.

    By :func:`polynorm.poly_norm_mul`: PolyNorm's y is formed in fp32, multiplied by mul there
    and rounded once to x's dtype. An instance is a :class:`polynorm.FusedMulPolyNorm`; only
    ``dtype``'s default differs (float32, as the hub's module).

    Args:
        eps: as in :class:`PolyNorm`.
        dtype: of the parameters, float32 by default; ``None`` takes torch's default dtype.
        device: of the parameters.
        backend: see :func:`polynorm.poly_norm_mul`.

    Parameters:
        weight: ``(3,)``, initialised to ``[1/3, 1/3, 1/3]``.
        bias: ``(1,)``, initialised to ``0``.

    Shape:
        x and mul ``(..., H)``, the same shape and dtype (float32, float64, float16 or
        bfloat16); output the same shape and dtype.

    Raises:
        TypeError: eps not a real number.
        ValueError: eps negative, NaN or infinite, or an unknown backend.
    """

    def __init__(self, eps: float = 1e-6, dtype: torch.dtype | None = torch.float32, device=None,
                 backend: str = "auto") -> None:
        super(module.FusedMulPolyNorm, self).__init__("polynorm.layers.FusedMulPolyNorm", eps, device, dtype, backend)


class GatedMLP(nn.Module):
    """Motif's gated MLP with the fused PolyNorm x mul: ``down_proj(act_fn(gate_proj(x), up_proj(x)))``.

    It holds the modules it is given, as they are (their parameters, devices, dtypes), under
    the names of Motif's ``MotifMLP``, so the state_dict keys are that MLP's:
    ``gate_proj.*``, ``up_proj.*``, ``down_proj.*``, ``act_fn.weight``, ``act_fn.bias``.

    Args:
        gate_proj, up_proj: ``(..., hidden) -> (..., intermediate)`` modules (``nn.Linear``
            in Motif's models).
        down_proj: ``(..., intermediate) -> (..., hidden)``.
        act_fn: ``forward(x, mul)``, a :class:`FusedMulPolyNorm`.

    Shape:
        input ``(..., hidden)``; output down_proj's.
    """

    def __init__(self, gate_proj: nn.Module, up_proj: nn.Module, down_proj: nn.Module, act_fn: nn.Module) -> None:
        super().__init__()
        self.gate_proj = gate_proj
        self.up_proj = up_proj
        self.down_proj = down_proj
        self.act_fn = act_fn

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x), self.up_proj(x)))
