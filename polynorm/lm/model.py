"""A small decoder-only transformer whose MLPs use PolyNorm, in plain PyTorch.

PolyNorm is the activation of Zhuo et al., "Polynomial Composition Activations: Unleashing
the Dynamics of Large Language Models", arXiv:2411.03884::

    y = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b,  norm(u) = u / sqrt(mean(u^2) + eps)

over the last dimension H (here the MLP's intermediate size). The MLP comes in the two forms
used in practice:

- ``"polycom"``: ``down(PolyNorm(up(x)))``, the PolyCom MLP of the paper, intermediate 4x;
- ``"gated"``: ``down(PolyNorm(gate(x)) * up(x))``, the gated form of Motif's LLMs,
  intermediate 8/3x (rounded to a multiple of 32) so both forms have about the same size.
  PolyNorm and the multiply are one fused op, :class:`polynorm.FusedMulPolyNorm`
  (:func:`polynorm.poly_norm_mul`: ``torch.ops.polynorm.mul_forward`` / ``mul_backward`` and
  their Triton twins), for every polynorm backend.

Everything else is a GPT-2 style pre-norm block: LayerNorm, causal multi-head attention
through ``F.scaled_dot_product_attention``, learned positions, a head tied to the byte
embedding, no dropout (training consumes no random numbers, so runs are replayable).
"""

import importlib
import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import polynorm

__all__ = [
    "MUL_POLY_NORMS", "POLY_NORMS", "Float64ReferenceMulPolyNorm", "Float64ReferencePolyNorm", "ModelConfig", "TinyLM",
    "activation_op", "liger_available", "make_activation", "make_mul_poly_norm", "make_poly_norm",
]


@dataclass
class ModelConfig:
    vocab_size: int = 256  # bytes
    n_layer: int = 2
    hidden_size: int = 64
    n_head: int = 4
    seq_len: int = 64
    mlp: str = "polycom"  # "polycom" or "gated"
    intermediate_size: int | None = None  # default: 4 * hidden (polycom), 8/3 * hidden (gated)
    eps: float = 1e-6  # PolyNorm's eps

    def __post_init__(self) -> None:
        if self.mlp not in ("polycom", "gated"):
            raise ValueError(f"ModelConfig: expected mlp 'polycom' or 'gated', got {self.mlp!r}")
        if self.hidden_size % self.n_head:
            raise ValueError(
                f"ModelConfig: expected hidden_size divisible by n_head={self.n_head}, got {self.hidden_size}"
            )
        if self.intermediate_size is None:
            if self.mlp == "polycom":
                self.intermediate_size = 4 * self.hidden_size
            else:
                self.intermediate_size = max(32, round(8 * self.hidden_size / 3 / 32) * 32)


def _liger_function():
    """Liger-Kernel's PolyNorm autograd function and whether it takes ``in_place``; or None and why not."""
    try:
        import liger_kernel  # noqa: F401
    except ImportError as error:
        return None, False, f"liger_kernel is not installed ({type(error).__name__}: {error})"
    errors = []
    for name in ("liger_kernel.ops.poly_norm", "liger_kernel.ops"):
        try:
            fn = importlib.import_module(name).LigerPolyNormFunction
        except (ImportError, AttributeError) as error:
            errors.append(f"{name}: {type(error).__name__}: {error}")
            continue
        return fn, "in_place" in inspect.signature(fn.forward).parameters, ""
    return None, False, "; ".join(errors)


def liger_available() -> tuple[bool, str]:
    """Whether Liger-Kernel's PolyNorm imports, and why not."""
    fn, _, why = _liger_function()
    return fn is not None, why


class LigerBackedPolyNorm(polynorm.PolyNorm):
    """``polynorm.PolyNorm``'s parameters (same names, shapes, init) run through Liger's kernel.

    Liger's bias is 0-d, so it gets a 0-d view of ours. ``in_place=False`` (where the installed
    version has the argument) leaves the incoming gradient intact.
    """

    op = "Liger PolyNorm"

    def __init__(self, eps: float = 1e-6, device=None, dtype=None) -> None:
        super().__init__(eps=eps, device=device, dtype=dtype, backend="reference")
        self.backend = "liger"
        self._fn, self._has_in_place, why = _liger_function()
        if self._fn is None:
            raise RuntimeError(f"LigerBackedPolyNorm: expected liger_kernel's PolyNorm to import, got {why}")

    def forward(self, x: Tensor) -> Tensor:
        extra = (False,) if self._has_in_place else ()
        return self._fn.apply(x, self.weight, self.bias.view(()), self.eps, *extra)


class LigerBackedMulPolyNorm(polynorm.FusedMulPolyNorm):
    """The gated MLP's activation through Liger's PolyNorm, then ``*``: Liger has no fused
    PolyNorm x mul, so this is the unfused form, y rounded to x's dtype before the multiply.
    ``polynorm.FusedMulPolyNorm``'s parameters (same names, shapes, init)."""

    op = "Liger PolyNorm, then *"

    def __init__(self, eps: float = 1e-6, dtype=None, device=None) -> None:
        super().__init__(eps=eps, dtype=dtype, device=device, backend="reference")
        self.backend = "liger"
        self._fn, self._has_in_place, why = _liger_function()
        if self._fn is None:
            raise RuntimeError(f"LigerBackedMulPolyNorm: expected liger_kernel's PolyNorm to import, got {why}")

    def forward(self, x: Tensor, mul: Tensor) -> Tensor:
        extra = (False,) if self._has_in_place else ()
        return self._fn.apply(x, self.weight, self.bias.view(()), self.eps, *extra) * mul


class Float64ReferencePolyNorm(polynorm.PolyNorm):
    """The reference PolyNorm computed in float64 and rounded once to x's dtype.

    A change of rounding only (the most exact PolyNorm there is): how far training with it
    drifts from training with the fp32 reference is the rounding floor of the comparison.
    """

    op = "reference.poly_norm in float64"

    def __init__(self, eps: float = 1e-6, device=None, dtype=None) -> None:
        super().__init__(eps=eps, device=device, dtype=dtype, backend="reference")
        self.backend = "reference-fp64"

    def forward(self, x: Tensor) -> Tensor:
        return polynorm.reference.poly_norm(x, self.weight, self.bias, self.eps, compute_dtype=torch.float64)


class Float64ReferenceMulPolyNorm(polynorm.FusedMulPolyNorm):
    """The fused op's float64 twin: ``polynorm.reference.poly_norm_mul`` computed in float64
    (PolyNorm's y and its product with mul), rounded once to x's dtype. As
    :class:`Float64ReferencePolyNorm` for the PolyCom form, the rounding floor of the gated form."""

    op = "reference.poly_norm_mul in float64"

    def __init__(self, eps: float = 1e-6, dtype=None, device=None) -> None:
        super().__init__(eps=eps, dtype=dtype, device=device, backend="reference")
        self.backend = "reference-fp64"

    def forward(self, x: Tensor, mul: Tensor) -> Tensor:
        return polynorm.reference.poly_norm_mul(x, mul, self.weight, self.bias, self.eps, compute_dtype=torch.float64)


# Implementations besides polynorm's own backends, by name, for each MLP form: each takes eps
# and returns a module with polynorm's parameters (same names, shapes, init): a
# polynorm.PolyNorm for the PolyCom form, a polynorm.FusedMulPolyNorm (forward(x, mul)) for
# the gated form. Tests add faulty kernels here.
POLY_NORMS = {"liger": LigerBackedPolyNorm, "reference-fp64": Float64ReferencePolyNorm}
MUL_POLY_NORMS = {"liger": LigerBackedMulPolyNorm, "reference-fp64": Float64ReferenceMulPolyNorm}


def make_poly_norm(backend: str, eps: float) -> nn.Module:
    """A PolyNorm activation: ``POLY_NORMS[backend]`` (Liger's kernel for ``"liger"``, the float64
    reference for ``"reference-fp64"``), else ``polynorm.PolyNorm(backend=...)``."""
    if backend in POLY_NORMS:
        return POLY_NORMS[backend](eps)
    return polynorm.PolyNorm(eps, backend=backend)


def make_mul_poly_norm(backend: str, eps: float) -> nn.Module:
    """The gated MLP's activation, ``forward(x, mul) = PolyNorm(x) * mul``:
    ``MUL_POLY_NORMS[backend]`` (Liger's PolyNorm then ``*`` for ``"liger"``, the float64
    ``reference.poly_norm_mul`` for ``"reference-fp64"``), else the fused op,
    ``polynorm.FusedMulPolyNorm(backend=...)``."""
    if backend in MUL_POLY_NORMS:
        return MUL_POLY_NORMS[backend](eps)
    return polynorm.FusedMulPolyNorm(eps, backend=backend)


def make_activation(mlp: str, backend: str, eps: float) -> nn.Module:
    """The activation of an MLP of form ``mlp``: ``make_poly_norm`` for ``"polycom"``,
    ``make_mul_poly_norm`` (the fused PolyNorm x mul) for ``"gated"``."""
    return (make_poly_norm if mlp == "polycom" else make_mul_poly_norm)(backend, eps)


def activation_op(act: nn.Module) -> str:
    """What an MLP's activation module runs, for the tables: its ``op`` attribute where it has
    one; for polynorm's modules the op of their backend: ``fused polynorm::mul_forward``
    (``mul_forward_triton``) or ``reference.poly_norm_mul`` for a ``polynorm.FusedMulPolyNorm``,
    ``polynorm::forward`` (``forward_triton``) or ``reference.poly_norm`` for a
    ``polynorm.PolyNorm``."""
    op = getattr(act, "op", None)
    if isinstance(op, str):
        return op
    fused = isinstance(act, polynorm.FusedMulPolyNorm)
    if not (fused or isinstance(act, polynorm.PolyNorm)):
        return type(act).__name__
    if act.backend == "reference":
        return "reference.poly_norm_mul" if fused else "reference.poly_norm"
    name = ("mul_forward" if fused else "forward") + ("_triton" if act.backend == "triton" else "")
    return f"fused polynorm::{name}" if fused else f"polynorm::{name}"


class PolyComMLP(nn.Module):
    """``down(PolyNorm(up(x)))`` (PolyCom, arXiv:2411.03884)."""

    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.act = make_activation("polycom", backend, config.eps)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.up(x)))


class GatedPolyMLP(nn.Module):
    """``down(PolyNorm(gate(x)) * up(x))`` (Motif's gated PolyNorm MLP), PolyNorm and the
    multiply fused: ``act`` is ``make_mul_poly_norm(backend)``, called as ``act(gate(x), up(x))``."""

    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        self.gate = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.act = make_activation("gated", backend, config.eps)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.gate(x), self.up(x)))


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, n_head, T, C / n_head)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.hidden_size)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.hidden_size)
        self.mlp = (PolyComMLP if config.mlp == "polycom" else GatedPolyMLP)(config, backend)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """Byte-level decoder-only transformer; ``backend`` picks every PolyNorm's kernel."""

    def __init__(self, config: ModelConfig, backend: str = "reference") -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.seq_len, config.hidden_size)
        self.blocks = nn.ModuleList(Block(config, backend) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.hidden_size)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.head.weight = self.wte.weight  # tied
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02), residual outputs scaled by 1/sqrt(2 n_layer); PolyNorm's own init."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=residual_std if name.endswith(("proj.weight", "down.weight")) else 0.02)
        for m in self.modules():
            if isinstance(m, (nn.LayerNorm, polynorm.PolyNorm, polynorm.FusedMulPolyNorm)):
                m.reset_parameters()

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> Tensor:
        """Logits ``(B, T, 256)``, or the mean next-byte cross-entropy (nats) given targets."""
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
