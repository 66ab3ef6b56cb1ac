"""``polynorm.PolyNorm``: the activation as an ``nn.Module``."""

import torch
from torch import Tensor, nn

from polynorm._common import check_eps
from polynorm.ops import BACKENDS, poly_norm

__all__ = ["PolyNorm"]


class PolyNorm(nn.Module):
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
        super().__init__()
        eps = check_eps("polynorm.PolyNorm", eps)
        if backend not in BACKENDS:
            raise ValueError(f"polynorm.PolyNorm: expected backend to be one of {', '.join(BACKENDS)}, got {backend!r}")
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

    def forward(self, x: Tensor) -> Tensor:
        return poly_norm(x, self.weight, self.bias, self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"eps={self.eps}, backend={self.backend!r}"
