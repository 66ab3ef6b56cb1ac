"""``polynorm.PolyNorm`` and ``polynorm.FusedMulPolyNorm``: the activation, and the gated
MLP's fused PolyNorm x mul, as ``nn.Module``s."""

import torch
from torch import Tensor, nn

from polynorm._common import check_eps
from polynorm.ops import BACKENDS, poly_norm, poly_norm_mul

__all__ = ["FusedMulPolyNorm", "PolyNorm"]

_PARAM_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


class _PolyNormParameters(nn.Module):
    """PolyNorm's parameters, eps and backend, shared by both modules."""

    def __init__(self, name: str, eps, device, dtype, backend: str) -> None:
        super().__init__()
        eps = check_eps(name, eps)
        if backend not in BACKENDS:
            raise ValueError(f"{name}: expected backend to be one of {', '.join(BACKENDS)}, got {backend!r}")
        # The ops take parameters of these dtypes only: any other would fail at the first forward
        # (a complex one), or with torch's message about gradients (an integer one).
        if dtype is not None and dtype not in _PARAM_DTYPES:
            raise TypeError(f"{name}: expected dtype to be None, float32, float64, float16 or bfloat16, got {dtype}")
        factory = {"device": device, "dtype": dtype}
        self.eps = eps
        self.backend = backend
        self.weight = nn.Parameter(torch.empty(3, **factory))
        self.bias = nn.Parameter(torch.empty(1, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(1.0 / 3.0)
            self.bias.zero_()

    def extra_repr(self) -> str:
        return f"eps={self.eps}, backend={self.backend!r}"


class PolyNorm(_PolyNormParameters):
    """PolyNorm activation (Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884).

    ``y = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b`` with
    ``norm(u) = u / sqrt(mean(u^2, dim=-1) + eps)`` over the last dimension.

    Args:
        eps: added to each mean square inside the square root; a real number (Python or
            NumPy int or float, one-element real tensor; not a bool), finite and >= 0,
            stored as a Python float.
        device, dtype: of the parameters (any float dtype, independent of the input's).
        backend: see :func:`polynorm.poly_norm`.

    Built under ``torch.device("meta")`` with any backend, it infers shapes on meta
    inputs; ``to_empty(device=...)`` then ``reset_parameters()`` gives the module a direct
    construction gives.

    Raises:
        TypeError: eps not a real number (a bool included).
        ValueError: eps negative, NaN or infinite, or an unknown backend.

    Parameters:
        weight: ``(3,)``, ``[w0, w1, w2]``, initialised to ``[1/3, 1/3, 1/3]`` as in PolyCom.
        bias: ``(1,)``, initialised to ``0``.

    Shape:
        input ``(..., H)`` of float32, float64, float16 or bfloat16; output the same
        shape and dtype.
    """

    def __init__(self, eps: float = 1e-6, device=None, dtype=None, backend: str = "auto") -> None:
        super().__init__("polynorm.PolyNorm", eps, device, dtype, backend)

    def forward(self, x: Tensor) -> Tensor:
        return poly_norm(x, self.weight, self.bias, self.eps, backend=self.backend)


class FusedMulPolyNorm(_PolyNormParameters):
    """Fused PolyNorm x mul for gated MLPs: ``forward(x, mul) = poly_norm(x) * mul``.

    The module of Motif's kernels (Motif-Technologies "activation", ``FusedMulPolyNorm``),
    with the same constructor (``eps``, then ``dtype``), parameters and initial values, and
    ``forward(x, mul)``; ``device`` and ``backend`` as in :class:`PolyNorm`. PolyNorm's y is
    multiplied by mul in fp32 and rounded once (:func:`polynorm.poly_norm_mul`). PolyNorm:
    Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.

    A gated MLP, ``down(PolyNorm(gate(x)) * up(x))``::

        class GatedMLP(torch.nn.Module):
            def __init__(self, dim, hidden):
                super().__init__()
                self.gate = torch.nn.Linear(dim, hidden, bias=False)
                self.up = torch.nn.Linear(dim, hidden, bias=False)
                self.down = torch.nn.Linear(hidden, dim, bias=False)
                self.act = polynorm.FusedMulPolyNorm()

            def forward(self, x):
                return self.down(self.act(self.gate(x), self.up(x)))

    Args:
        eps: as in :class:`PolyNorm`.
        dtype, device: of the parameters (any float dtype, independent of the inputs').
            ``dtype`` comes second, as in Motif's module; ``None`` is torch's default dtype
            (float32 unless changed), Motif's default.
        backend: see :func:`polynorm.poly_norm_mul`.

    Built under ``torch.device("meta")`` it infers shapes, and ``to_empty(device=...)`` then
    ``reset_parameters()`` gives the module a direct construction gives, as for
    :class:`PolyNorm`.

    Raises:
        TypeError: eps not a real number (a bool included).
        ValueError: eps negative, NaN or infinite, or an unknown backend.

    Parameters:
        weight: ``(3,)``, ``[w0, w1, w2]``, initialised to ``[1/3, 1/3, 1/3]``.
        bias: ``(1,)``, initialised to ``0``.

    Shape:
        x and mul ``(..., H)``, the same shape and dtype (float32, float64, float16 or
        bfloat16); output the same shape and dtype.
    """

    def __init__(self, eps: float = 1e-6, dtype=None, device=None, backend: str = "auto") -> None:
        super().__init__("polynorm.FusedMulPolyNorm", eps, device, dtype, backend)

    def forward(self, x: Tensor, mul: Tensor) -> Tensor:
        return poly_norm_mul(x, mul, self.weight, self.bias, self.eps, backend=self.backend)
