"""Motif-3's MoE activation: grouped fused-mul PolyNorm with Motif-3's options.

:func:`poly_norm_grouped_mul` and :class:`GroupedMulPolyNorm`. For a row of expert e (rows
sorted by expert, as :func:`polynorm.poly_norm_grouped` takes them), with
``clamp_c(v) = min(max(v, -c), c)`` and ``c = hidden_clamp`` (docs/MATH.md (16)-(23))::

    w~  = sigmoid(weight[e]) if sigmoid_weight else weight[e]
    b~  = clamp(bias[e], -bias_clamp, bias_clamp)
    out = round(output_scale * clamp_c(PolyNorm_{w~, b~}(clamp_c(x)) * clamp_c(mul)))

The kernels (``torch.ops.polynorm.grouped_mul_forward`` / ``grouped_mul_backward``: C++ on the
CPU; ``grouped_mul_forward_triton`` / ``grouped_mul_backward_triton``: Triton) take w~ and b~;
the sigmoid and the bias clamp are applied here to the ``[E, 3]`` and ``[E]`` parameters in
fp32 (fp64 for fp64 x), where autograd differentiates them (MATH.md (23)).
"""

import torch
from torch import Tensor, nn

from polynorm import reference
from polynorm._common import (
    check_eps,
    check_grouped_forward_args,
    check_grouped_mul_topk_args,
    check_grouped_mul_backward_args,
    check_grouped_mul_forward_args,
    check_grouped_mul_options,
    param_grads,
    refuse_double_backward,
    rstd_dtype,
    save_param_meta,
    saveable,
)
from polynorm.grouped import _offsets_from_counts
from polynorm.ops import BACKENDS

try:  # registers torch.ops.polynorm.grouped_mul_forward_triton and grouped_mul_backward_triton
    from polynorm import triton_grouped as _triton_grouped
except ImportError as _error:  # Triton is optional
    _triton_grouped = None
    _TRITON_IMPORT_ERROR = f"{type(_error).__name__}: {_error}"

# The FP8 op's scale formats (docs/MATH.md (25)).
_SCALE_FORMATS = ("fp32", "ue8m0", "ue8m0_packed")

__all__ = ["GroupedMulPolyNorm", "poly_norm_grouped_mul", "poly_norm_grouped_mul_fp8", "poly_norm_grouped_mul_topk"]


@torch.library.register_fake("polynorm::grouped_mul_forward")
def _grouped_mul_forward_fake(
    x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, offsets: Tensor, eps: float = 1e-6,
    hidden_clamp: float | None = None, output_scale: float = 1.0,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    check_grouped_mul_forward_args(
        "polynorm.grouped_mul_forward", x, mul, weight, bias, offsets, eps, hidden_clamp, None, output_scale
    )
    M = x.numel() // x.shape[-1]
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), x.new_empty((M, 3), dtype=rstd_dtype(x.dtype))


@torch.library.register_fake("polynorm::grouped_mul_backward")
def _grouped_mul_backward_fake(
    grad_out: Tensor, x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, offsets: Tensor, rstd: Tensor,
    hidden_clamp: float | None = None, output_scale: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    op = "polynorm.grouped_mul_backward"
    check_grouped_mul_backward_args(op, grad_out, x, mul, weight, bias, offsets, rstd)
    check_grouped_mul_options(op, hidden_clamp, None, output_scale)
    acc = rstd_dtype(x.dtype)
    E = weight.shape[0]
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grad_mul = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return grad_x, grad_mul, x.new_empty((E, 3), dtype=acc), x.new_empty((E,), dtype=acc)


def _register_grouped_mul_autograd(forward_op: str, backward_op) -> None:
    """Makes ``forward_op`` (``grouped_mul_forward``'s schema) differentiable in x, mul, weight
    and bias through ``backward_op``; ``needs_input_grad`` is honoured, the parameter gradients
    come back rounded once to each parameter's dtype and shape, and an inference-mode x or mul
    is copied once when a backward is recorded."""

    def setup_context(ctx, inputs, output) -> None:
        x, mul, weight, bias, offsets, _eps, hidden_clamp, output_scale = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(saveable(x), saveable(mul), weight, bias, saveable(offsets), output[1])
        save_param_meta(ctx, weight, bias)
        ctx.options = (hidden_clamp, output_scale)

    def backward(ctx, grad_out: Tensor, _grad_rstd: Tensor):
        need = ctx.needs_input_grad[:4]
        rest = (None,) * (len(ctx.needs_input_grad) - 4)  # offsets, eps, hidden_clamp, output_scale
        if not any(need):
            return (None,) * 4 + rest
        x, mul, weight, bias, offsets, rstd = ctx.saved_tensors
        grad_x, grad_mul, grad_weight, grad_bias = backward_op(grad_out, x, mul, weight, bias, offsets, rstd, *ctx.options)
        grads = (grad_x if need[0] else None, grad_mul if need[1] else None)
        return grads + param_grads(ctx, grad_weight, grad_bias, need[2], need[3]) + rest

    torch.library.register_autograd(forward_op, backward, setup_context=setup_context)
    refuse_double_backward(backward_op)


_register_grouped_mul_autograd("polynorm::grouped_mul_forward", torch.ops.polynorm.grouped_mul_backward.default)
if _triton_grouped is not None:
    _register_grouped_mul_autograd(
        "polynorm::grouped_mul_forward_triton", torch.ops.polynorm.grouped_mul_backward_triton.default
    )


def poly_norm_grouped_mul(
    x: Tensor,
    mul: Tensor,
    weight: Tensor,
    bias: Tensor,
    offsets: Tensor | None = None,
    *,
    counts: Tensor | None = None,
    eps: float = 1e-6,
    sigmoid_weight: bool = False,
    bias_clamp: float | None = None,
    hidden_clamp: float | None = None,
    output_scale: float = 1.0,
    backend: str = "auto",
) -> Tensor:
    """Motif-3's MoE activation: grouped PolyNorm of the gate times the up projection, with its options.

    For a row of expert e (expert e owns rows ``[offsets[e-1], offsets[e])``,
    ``offsets[-1] := 0``), with ``clamp_c(v) = min(max(v, -c), c)``, ``c = hidden_clamp``::

        w~  = sigmoid(weight[e]) if sigmoid_weight else weight[e]      # fp32
        b~  = clamp(bias[e], -bias_clamp, bias_clamp)                    # fp32
        y   = w~0 norm(x~^3) + w~1 norm(x~^2) + w~2 norm(x~) + b~,  x~ = clamp_c(x)
        out = round(output_scale * clamp_c(y * clamp_c(mul)))

    ``norm(u) = u / sqrt(mean(u^2) + eps)`` over H, everything in fp32 (fp64 for fp64 x) and
    rounded once to x's dtype: Motif-3's routed-expert activation as its public serving code
    computes it (docs/MATH.md (16)-(19), with the sources). Differentiable in x, mul, weight
    and bias; a clamp passes no gradient where it moves its input. Each expert's weight and
    bias gradients are sums in an order that depends only on its row count: the same bits on
    every run. Rows at or past ``offsets[E-1]`` are not read; out is 0 there. No host
    synchronisation (CUDA graphs, torch.compile).

    Args:
        x: ``(..., H)`` float32, float64, float16 or bfloat16, the gate, rows sorted by expert.
        mul: x's shape, dtype and device, the up projection. x and mul are read in place when
            their leading dims collapse into one row stride, whatever their last-dim stride:
            ``x, mul = gate_up.chunk(2, -1)`` or ``gate_up[..., 0::2], gate_up[..., 1::2]``.
        weight: ``[E, 3]`` (raw, before the sigmoid), any float dtype; Motif-3 keeps it fp32.
        bias: ``[E]`` or ``[E, 1]`` (Motif-3's checkpoints), any float dtype.
        offsets: ``[E]`` int32 or int64 on x's device, cumulative end offsets (the convention
            of ``torch._grouped_mm``'s ``offs``). counts: instead, ``[E]`` rows per expert.
            Exactly one of the two.
        eps: inside the square root; finite and >= 0.
        sigmoid_weight: ``polynorm_sigmoid_weight`` (Motif-3: True).
        bias_clamp: ``polynorm_bias_clamp``, None or >= 0 (Motif-3's routed experts: 0.5).
        hidden_clamp: ``hidden_clamp``, None or > 0 (Motif-3: 1e6).
        output_scale: ``polynorm_output_scale``, finite (Motif-3: 0.5).
        backend: ``"auto"`` (the C++ kernel for CPU tensors, the Triton kernels for CUDA
            tensors: this op has no CUDA C++ kernel), ``"triton"``, or ``"reference"``
            (:func:`polynorm.reference.poly_norm_grouped_mul`). ``"cuda"`` raises
            NotImplementedError.

    Returns:
        out: x's shape and dtype, contiguous.

    Raises:
        TypeError: offsets or counts not a tensor, both or neither given; an option not a
            number. ValueError: an unknown backend; eps or an option out of range.
        RuntimeError: the checks of :func:`polynorm.poly_norm_grouped`, and mul not of x's
            shape, dtype and device. NotImplementedError: backend ``"cuda"``.

    Example::

        # One Motif-3 MoE layer's experts, tokens sorted by expert:
        h = torch._grouped_mm(x_sorted, w_gate_up, offs=offsets.int())     # [M, 2 * 1280]
        gate, up = h.chunk(2, dim=-1)                                       # views, read in place
        a = polynorm.poly_norm_grouped_mul(gate, up, act.weight, act.bias, offsets,
                                           sigmoid_weight=True, bias_clamp=0.5,
                                           hidden_clamp=1e6, output_scale=0.5)
        out = torch._grouped_mm(a, w_down, offs=offsets.int())

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    op_name = "polynorm.poly_norm_grouped_mul"
    if (offsets is None) == (counts is None):
        raise TypeError(
            f"{op_name}: expected exactly one of offsets and counts, got {'both' if counts is not None else 'neither'}"
        )
    if counts is not None:
        offsets = _offsets_from_counts(counts, x, weight, op_name)
    elif not isinstance(offsets, Tensor):
        raise TypeError(f"{op_name}: expected offsets to be a Tensor, got {type(offsets).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"{op_name}: expected backend to be one of {', '.join(BACKENDS)}, got {backend!r}")
    eps = check_grouped_mul_forward_args(
        op_name, x, mul, weight, bias, offsets, eps, hidden_clamp, bias_clamp, output_scale,
        traced=torch.compiler.is_compiling(),
    )  # fmt: skip
    acc = rstd_dtype(x.dtype)
    if backend == "reference":
        w, b = reference.expert_coefficients(weight, bias, sigmoid_weight=sigmoid_weight, bias_clamp=bias_clamp, dtype=acc)
        return reference._poly_norm_grouped_mul(x, mul, w, b, offsets, eps, hidden_clamp, float(output_scale), acc)
    if backend == "cuda":
        raise NotImplementedError(
            f"{op_name}: backend 'cuda' has no kernel for this op; use backend 'auto' or 'triton' for CUDA tensors"
        )
    use_triton = backend == "triton" or x.is_cuda
    if use_triton and _triton_grouped is None:
        raise RuntimeError(f"{op_name}: the Triton kernels need the triton package, which failed to import: {_TRITON_IMPORT_ERROR}")
    w, b = reference.expert_coefficients(weight, bias, sigmoid_weight=sigmoid_weight, bias_clamp=bias_clamp, dtype=acc)
    op = torch.ops.polynorm.grouped_mul_forward_triton if use_triton else torch.ops.polynorm.grouped_mul_forward
    return op(x, mul, w, b, offsets, eps, None if hidden_clamp is None else float(hidden_clamp), float(output_scale))[0]


@torch.library.register_fake("polynorm::grouped_mul_topk_forward")
def _grouped_mul_topk_forward_fake(
    x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, topk_ids: Tensor, expert_map: Tensor | None,
    eps: float, hidden_clamp: float | None, output_scale: float, out: Tensor,
) -> None:  # fmt: skip
    check_grouped_mul_topk_args(
        "polynorm.grouped_mul_topk_forward", x, mul, weight, bias, topk_ids, expert_map, eps, hidden_clamp,
        output_scale, out,
    )  # fmt: skip


def poly_norm_grouped_mul_topk(
    x: Tensor,
    mul: Tensor,
    weight: Tensor,
    bias: Tensor,
    topk_ids: Tensor,
    expert_map: Tensor | None = None,
    *,
    out: Tensor | None = None,
    eps: float = 1e-6,
    sigmoid_weight: bool = False,
    bias_clamp: float | None = None,
    hidden_clamp: float | None = None,
    output_scale: float = 1.0,
    backend: str = "auto",
) -> Tensor:
    """Motif-3's MoE activation in the token-major layout of a fused MoE (vLLM's), forward only.

    Row r of x and mul (T * K rows, e.g. a ``[T, K, 2 I]`` gate_up's halves) is token ``r // K``'s
    slot ``r % K``; its local expert is ``expert_map[topk_ids[r // K, r % K]]`` (the id itself
    without a map). Each row of a local expert e in ``[0, E)`` gets :func:`poly_norm_grouped_mul`'s
    value with expert e's parameters and the same options; a row whose map entry is -1 (an expert
    of another rank), or whose id is outside ``[0, len(expert_map))``, is neither read nor written.

    Args:
        x, mul: ``(..., H)`` of one float dtype, T * K rows, any strides as in
            :func:`poly_norm_grouped_mul`.
        weight ``[E, 3]``, bias ``[E]`` or ``[E, 1]``: the local experts' parameters.
        topk_ids: ``[T, K]`` int32 or int64 global expert ids, on x's device.
        expert_map: None, or ``[global E]`` int32 or int64: each global expert's local index,
            -1 where it is not local.
        out: None (a zero-filled result), or x's shape and dtype with a unit last-dim stride
            and one row stride, written in place: rows of no local expert keep its values.
        eps, sigmoid_weight, bias_clamp, hidden_clamp, output_scale: as in
            :func:`poly_norm_grouped_mul`.
        backend: ``"auto"`` (C++ on the CPU, Triton on CUDA), ``"triton"`` or ``"reference"``.

    Returns:
        out. No gradient: this is the serving path.

    Raises:
        TypeError, ValueError, RuntimeError: as :func:`poly_norm_grouped_mul`; topk_ids not
            ``[T, K]`` int32/int64 with T * K rows; expert_map not 1-D int32/int64; out not of
            x's shape and dtype or not writable in place. NotImplementedError: backend "cuda".
    """
    op_name = "polynorm.poly_norm_grouped_mul_topk"
    if backend not in BACKENDS:
        raise ValueError(f"{op_name}: expected backend to be one of {', '.join(BACKENDS)}, got {backend!r}")
    check_grouped_mul_options(op_name, hidden_clamp, bias_clamp, output_scale)
    if out is None and isinstance(x, Tensor):  # else the checks below name x
        out = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    # Every backend's checks, named for this function, before the coefficients are formed from
    # weight and bias (whose reshape would otherwise be the first to meet a bias of the wrong shape).
    eps = check_grouped_mul_topk_args(
        op_name, x, mul, weight, bias, topk_ids, expert_map, eps, hidden_clamp, output_scale, out
    )
    options = dict(sigmoid_weight=sigmoid_weight, bias_clamp=bias_clamp, hidden_clamp=hidden_clamp, output_scale=output_scale)
    if backend == "reference":
        out.copy_(reference.poly_norm_grouped_mul_topk(x, mul, weight, bias, topk_ids, expert_map, eps, out=out, **options))
        return out
    if backend == "cuda":
        raise NotImplementedError(
            f"{op_name}: backend 'cuda' has no kernel for this op; use backend 'auto' or 'triton' for CUDA tensors"
        )
    use_triton = backend == "triton" or x.is_cuda
    if use_triton and _triton_grouped is None:
        raise RuntimeError(f"{op_name}: the Triton kernels need the triton package, which failed to import: {_TRITON_IMPORT_ERROR}")
    acc = rstd_dtype(x.dtype)
    w, b = reference.expert_coefficients(weight, bias, sigmoid_weight=sigmoid_weight, bias_clamp=bias_clamp, dtype=acc)
    op = torch.ops.polynorm.grouped_mul_topk_forward_triton if use_triton else torch.ops.polynorm.grouped_mul_topk_forward
    clamp = None if hidden_clamp is None else float(hidden_clamp)
    op(x, mul, w, b, topk_ids, expert_map, eps, clamp, float(output_scale), out)
    return out


def poly_norm_grouped_mul_fp8(
    x: Tensor,
    mul: Tensor | None,
    weight: Tensor,
    bias: Tensor,
    offsets: Tensor | None = None,
    *,
    counts: Tensor | None = None,
    eps: float = 1e-6,
    sigmoid_weight: bool = False,
    bias_clamp: float | None = None,
    hidden_clamp: float | None = None,
    output_scale: float = 1.0,
    scale_format: str = "fp32",
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """:func:`poly_norm_grouped_mul` (or, with ``mul=None``, :func:`polynorm.poly_norm_grouped`)
    with an FP8 output for a DeepGEMM-style grouped GEMM, forward only (docs/MATH.md (24)-(26)).

    The activation v, rounded to x's dtype exactly as the non-FP8 op writes it, is quantised to
    float8_e4m3fn with one fp32 scale per group of 128 columns of a row:
    ``scale = max(amax|v|, 1e-10) / 448``, rounded up to a power of two for ``"ue8m0"`` and
    ``"ue8m0_packed"``, and ``q = e4m3(clamp(v / scale, -448, 448))`` rounded to nearest even:
    ``q.float() * scale`` is v quantised by torch's own float8 conversion with the same scales
    (:func:`polynorm.reference.quantize_fp8_groups`). A single-expert fused op is E = 1 with
    ``offsets = [M]``.

    Args:
        x, mul, weight, bias, offsets, counts, eps, sigmoid_weight, bias_clamp, hidden_clamp,
            output_scale: as in :func:`poly_norm_grouped_mul`; x float16, bfloat16 or float32.
            mul None: grouped PolyNorm alone, y of MATH.md (18): hidden_clamp still clamps x,
            and output_scale, which scales the product, must be 1.0.
        scale_format: ``"fp32"``, ``"ue8m0"`` (fp32 powers of two) or ``"ue8m0_packed"``.
        backend: ``"auto"`` or ``"triton"`` (the Triton kernel: CUDA tensors, or CPU tensors
            under ``TRITON_INTERPRET=1``), or ``"reference"`` (the reference activation, then
            :func:`polynorm.reference.quantize_fp8_groups`).

    Returns:
        (q, scale): q ``(M, H)`` float8_e4m3fn; scale fp32 ``(M, G)``, G = ceil(H / 128), or
        int32 ``(M, ceil(G / 4))`` packed; column-major (M-major), as DeepGEMM reads scales.
    """
    op_name = "polynorm.poly_norm_grouped_mul_fp8"
    if (offsets is None) == (counts is None):
        raise TypeError(
            f"{op_name}: expected exactly one of offsets and counts, got {'both' if counts is not None else 'neither'}"
        )
    if counts is not None:
        offsets = _offsets_from_counts(counts, x, weight, op_name)
    if backend not in ("auto", "triton", "reference"):
        raise ValueError(f"{op_name}: expected backend to be one of auto, triton, reference, got {backend!r}")
    # Every backend's checks, before the coefficients are formed from weight and bias (whose
    # reshape would otherwise be the first to meet a bias of the wrong shape).
    traced = torch.compiler.is_compiling()
    if mul is None:
        eps = check_grouped_forward_args(op_name, x, weight, bias, offsets, eps, traced=traced)
        check_grouped_mul_options(op_name, hidden_clamp, bias_clamp, output_scale)
        if output_scale != 1.0:  # s multiplies the product (MATH.md (19)); there is none to scale
            raise ValueError(f"{op_name}: expected output_scale 1.0 with mul None (it scales the product with mul), "
                             f"got {output_scale!r}")  # fmt: skip
    else:
        eps = check_grouped_mul_forward_args(
            op_name, x, mul, weight, bias, offsets, eps, hidden_clamp, bias_clamp, output_scale, traced=traced
        )
    if x.dtype == torch.float64:
        raise RuntimeError(f"{op_name}: expected x to be float16, bfloat16 or float32 (an FP8 output), got {x.dtype}")
    if scale_format not in _SCALE_FORMATS:
        raise ValueError(f"{op_name}: expected scale_format to be one of {', '.join(_SCALE_FORMATS)}, got {scale_format!r}")
    if backend == "reference":
        if mul is None:
            # v = round(y) with y of MATH.md (18): PolyNorm of x~ = clamp_c(x), clamped in fp32 as
            # the kernel widens x, then rounded once to x's dtype.
            w, b = reference.expert_coefficients(weight, bias, sigmoid_weight=sigmoid_weight, bias_clamp=bias_clamp)
            xc = reference._clamp(x.float(), None if hidden_clamp is None else float(hidden_clamp))
            v = reference.poly_norm_grouped(xc, w, b, offsets, eps).to(x.dtype)
        else:
            v = reference.poly_norm_grouped_mul(
                x, mul, weight, bias, offsets, eps, sigmoid_weight=sigmoid_weight, bias_clamp=bias_clamp,
                hidden_clamp=hidden_clamp, output_scale=output_scale,
            )  # fmt: skip
        return reference.quantize_fp8_groups(v, scale_format)
    if _triton_grouped is None:
        raise RuntimeError(f"{op_name}: the FP8 kernel needs the triton package, which failed to import: {_TRITON_IMPORT_ERROR}")
    acc = rstd_dtype(x.dtype)
    w, b = reference.expert_coefficients(weight, bias, sigmoid_weight=sigmoid_weight, bias_clamp=bias_clamp, dtype=acc)
    return torch.ops.polynorm.grouped_mul_forward_fp8_triton(
        x, mul, w, b, offsets, eps, None if hidden_clamp is None else float(hidden_clamp), float(output_scale), scale_format
    )


class GroupedMulPolyNorm(nn.Module):
    """Motif-3's routed-expert activation: :func:`poly_norm_grouped_mul` with per-expert parameters.

    ``forward(x, mul, offsets=None, counts=None)``: x (gate) and mul (up) with rows sorted by
    expert, and exactly one of ``offsets`` or ``counts``. The parameters have the layout of
    Motif-3's checkpoints (``...moe.experts.act_fn.weight [E, 3]``, ``.bias [E, 1]``), so a
    checkpoint's state loads as it is. :meth:`from_config` reads the options from a Motif-3
    configuration. (Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.)

    Args:
        num_experts: E >= 1.
        eps: inside the square root.
        sigmoid_weight, bias_clamp, hidden_clamp, output_scale: as in
            :func:`poly_norm_grouped_mul`; all off by default.
        device, dtype: of the parameters.
        backend: see :func:`poly_norm_grouped_mul`.

    Parameters:
        weight: ``[E, 3]``, initialised to ``[1/3, 1/3, 1/3]`` (PolyCom's initialisation, and
            the Motif-3 model code's, with or without the sigmoid).
        bias: ``[E, 1]``, initialised to 0.
    """

    def __init__(
        self,
        num_experts: int,
        eps: float = 1e-6,
        *,
        sigmoid_weight: bool = False,
        bias_clamp: float | None = None,
        hidden_clamp: float | None = None,
        output_scale: float = 1.0,
        device=None,
        dtype=None,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        name = "polynorm.GroupedMulPolyNorm"
        if not isinstance(num_experts, int) or isinstance(num_experts, bool):
            raise TypeError(f"{name}: expected num_experts to be an int, got {type(num_experts).__name__}")
        if num_experts < 1:
            raise ValueError(f"{name}: expected num_experts >= 1, got {num_experts}")
        if backend not in BACKENDS:
            raise ValueError(f"{name}: expected backend to be one of {', '.join(BACKENDS)}, got {backend!r}")
        check_grouped_mul_options(name, hidden_clamp, bias_clamp, output_scale)
        self.num_experts = num_experts
        self.eps = check_eps(name, eps)
        self.sigmoid_weight = bool(sigmoid_weight)
        self.bias_clamp = None if bias_clamp is None else float(bias_clamp)
        self.hidden_clamp = None if hidden_clamp is None else float(hidden_clamp)
        self.output_scale = float(output_scale)
        self.backend = backend
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(num_experts, 3, **factory))
        self.bias = nn.Parameter(torch.empty(num_experts, 1, **factory))
        self.reset_parameters()

    @classmethod
    def from_config(cls, config, *, routed: bool = True, eps: float = 1e-6, **kwargs) -> "GroupedMulPolyNorm":
        """The activation of a Motif-3 MoE layer from its configuration (a ``PretrainedConfig``,
        a namespace or a dict): ``num_experts``, ``polynorm_sigmoid_weight`` (default True),
        ``polynorm_bias_clamp`` (routed experts only: ignored when ``routed`` is False),
        ``hidden_clamp`` and ``polynorm_output_scale`` (default 1.0). Further keyword
        arguments (device, dtype, backend) go to the constructor."""

        def get(key, default=None):
            if isinstance(config, dict):
                return config.get(key, default)
            return getattr(config, key, default)

        num_experts = get("num_experts")
        if num_experts is None:
            raise ValueError("polynorm.GroupedMulPolyNorm.from_config: expected the configuration to have num_experts, got none")
        return cls(
            int(num_experts),
            eps,
            sigmoid_weight=bool(get("polynorm_sigmoid_weight", True)),
            bias_clamp=get("polynorm_bias_clamp") if routed else None,
            hidden_clamp=get("hidden_clamp"),
            output_scale=float(get("polynorm_output_scale", 1.0)),
            **kwargs,
        )

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(1.0 / 3.0)
            self.bias.zero_()

    def forward(self, x: Tensor, mul: Tensor, offsets: Tensor | None = None, counts: Tensor | None = None) -> Tensor:
        return poly_norm_grouped_mul(
            x, mul, self.weight, self.bias, offsets, counts=counts, eps=self.eps,
            sigmoid_weight=self.sigmoid_weight, bias_clamp=self.bias_clamp, hidden_clamp=self.hidden_clamp,
            output_scale=self.output_scale, backend=self.backend,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, eps={self.eps}, sigmoid_weight={self.sigmoid_weight}, "
            f"bias_clamp={self.bias_clamp}, hidden_clamp={self.hidden_clamp}, output_scale={self.output_scale}, "
            f"backend={self.backend!r}"
        )
