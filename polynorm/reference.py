"""The pure-PyTorch definition of PolyNorm: the oracle every backend is tested against.

PolyNorm (Zhuo et al., "Polynomial Composition Activations: Unleashing the Dynamics of
Large Language Models", arXiv:2411.03884)::

    y = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b
    norm(u) = u / sqrt(mean(u^2, dim=-1) + eps)

Computed in ``compute_dtype`` (promoted with x's dtype, so float64 inputs stay float64)
and rounded once to x's dtype. Autograd differentiates it, which makes it the oracle for
the backward too when run with ``compute_dtype=torch.float64``.
"""

import math

import torch
from torch import Tensor

from polynorm._common import check_forward_args, check_grouped_forward_args, check_mul_forward_args

__all__ = [
    "expert_coefficients",
    "poly_norm",
    "poly_norm_grouped",
    "poly_norm_grouped_mul",
    "poly_norm_grouped_mul_topk",
    "poly_norm_mul",
    "quantize_fp8_groups",
    "rstd",
    "sharded_backward_apply",
    "sharded_backward_stats",
    "sharded_forward_apply",
    "sharded_forward_stats",
]


def _compute_dtype(x: Tensor, compute_dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(x.dtype, compute_dtype)


def _norm(u: Tensor, eps) -> Tensor:
    # norm(u) = u / sqrt(mean(u^2, last dim) + eps): a division by the square root, as the
    # paper writes it. Autograd of rsqrt would form mean(u^2)^-1.5, which leaves fp32's range
    # for |x| beyond ~3e4 (x^6 ~ 1e27) and corrupts the gradient; this way its largest
    # intermediate is mean(u^2) itself.
    return u / torch.sqrt(u.pow(2).mean(dim=-1, keepdim=True) + eps)


def rstd(x: Tensor, eps: float = 1e-6, *, compute_dtype: torch.dtype = torch.float32) -> Tensor:
    """The per-row reciprocal RMS of x^3, x^2 and x.

    Args:
        x: ``(..., H)`` floating tensor.
        eps: added to each mean square inside the square root.
        compute_dtype: dtype of the computation (promoted with ``x.dtype``).

    Returns:
        ``(M, 3)`` tensor of ``compute_dtype``, ``M = x.numel() // H``, columns ordered
        ``[r_3, r_2, r_1]`` where ``r_p = 1 / sqrt(mean(x^(2p)) + eps)``.
    """
    xc = x.to(_compute_dtype(x, compute_dtype)).reshape(-1, x.shape[-1])
    powers = torch.stack([xc.pow(3), xc.pow(2), xc], dim=1)  # [M, 3, H]
    return torch.rsqrt(powers.pow(2).mean(dim=-1) + eps)


def poly_norm(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-6, *, compute_dtype: torch.dtype = torch.float32
) -> Tensor:
    """PolyNorm in plain PyTorch: ``y = w0 norm(x^3) + w1 norm(x^2) + w2 norm(x) + b``.

    ``norm(u) = u / sqrt(mean(u^2, dim=-1) + eps)`` over the last dimension H.

    Args:
        x: ``(..., H)`` tensor of float32, float64, float16 or bfloat16, H >= 1.
        weight: ``(3,)`` ``[w0, w1, w2]``, any of those dtypes;
            w0 scales the cubic term.
        bias: ``(1,)`` or ``()``, any of those dtypes.
        eps: added to each mean square inside the square root; a real number (Python or
            NumPy scalar, one-element tensor), finite and >= 0.
        compute_dtype: dtype of the computation; promoted with ``x.dtype``, so the
            default float32 upcasts fp16/bf16 and leaves float64 alone.

    Returns:
        y, with x's shape and dtype (rounded once from ``compute_dtype``), contiguous.
        Autograd differentiates it: each parameter's gradient comes back in that
        parameter's dtype.

    Raises:
        TypeError: an argument not a tensor, or eps not a real number (a bool, a string).
        RuntimeError: x, weight or bias not float32/float64/float16/bfloat16, x 0-d or
            with H = 0, weight not ``(3,)``, bias not ``(1,)`` or ``()``, tensors on
            different devices. The same checks and messages as the ops, naming
            ``polynorm.reference.poly_norm``.
        ValueError: eps negative, NaN or infinite.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    eps = check_forward_args(
        "polynorm.reference.poly_norm", x, weight, bias, eps, traced=torch.compiler.is_compiling()
    )
    return _poly_norm(x, weight, bias, eps, compute_dtype=compute_dtype)


def _poly_norm(
    x: Tensor, weight: Tensor, bias: Tensor, eps, *, compute_dtype: torch.dtype = torch.float32, out_dtype=None
) -> Tensor:
    # poly_norm without the argument checks (polynorm.poly_norm runs them under its own name).
    # out_dtype: y's dtype (x's when None); poly_norm_mul keeps y in the compute dtype.
    dtype = _compute_dtype(x, compute_dtype)
    # Contiguous, so that y is contiguous whatever x's strides (a copy only when x is not).
    xc = x.to(dtype, memory_format=torch.contiguous_format).contiguous()
    w = weight.to(dtype).reshape(3)
    b = bias.to(dtype).reshape(())

    y = w[0] * _norm(xc.pow(3), eps) + w[1] * _norm(xc.pow(2), eps) + w[2] * _norm(xc, eps) + b
    return y.to(x.dtype if out_dtype is None else out_dtype)


def poly_norm_mul(
    x: Tensor,
    mul: Tensor,
    weight: Tensor,
    bias: Tensor,
    eps: float = 1e-6,
    *,
    compute_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """PolyNorm times a gate, in plain PyTorch: ``out = poly_norm(x) * mul``.

    The fused op's oracle (Motif's ``FusedMulPolyNorm``): ``poly_norm(x)`` is formed in
    ``compute_dtype`` and multiplied by ``mul`` there, and the product is rounded once to
    x's dtype; PolyNorm's y is never rounded on its own.

    Args:
        x: ``(..., H)`` tensor of float32, float64, float16 or bfloat16, H >= 1.
        mul: x's shape and dtype, on x's device.
        weight, bias, eps, compute_dtype: as in :func:`poly_norm`.

    Returns:
        out, with x's shape and dtype, contiguous. Autograd differentiates it.

    Raises:
        As :func:`poly_norm`; RuntimeError also for mul of another shape, dtype or device.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    eps = check_mul_forward_args(
        "polynorm.reference.poly_norm_mul", x, mul, weight, bias, eps, traced=torch.compiler.is_compiling()
    )
    return _poly_norm_mul(x, mul, weight, bias, eps, compute_dtype=compute_dtype)


def _poly_norm_mul(x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, eps, *, compute_dtype: torch.dtype = torch.float32) -> Tensor:
    # poly_norm_mul without the argument checks.
    dtype = _compute_dtype(x, compute_dtype)
    y = _poly_norm(x, weight, bias, eps, compute_dtype=compute_dtype, out_dtype=dtype)
    # The product's backward saves mul: one made under torch.inference_mode() cannot be
    # saved, so it is copied (the copy a dtype change makes anyway). Dynamo cannot trace
    # is_inference(); a compiled graph copies nothing.
    copy = not torch.compiler.is_compiling() and mul.is_inference()
    return (y * mul.to(dtype, copy=copy)).to(x.dtype, memory_format=torch.contiguous_format).contiguous()


# ----------------------------------------------------------------------------------------
# Grouped PolyNorm (mixture of experts)
# ----------------------------------------------------------------------------------------


def poly_norm_grouped(
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    offsets: Tensor,
    eps: float = 1e-6,
    *,
    compute_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Grouped PolyNorm in plain PyTorch: each row with its own expert's parameters.

    Rows of x (flattened to ``(M, H)``) are sorted by expert; expert e owns rows
    ``[offsets[e-1], offsets[e])`` (``offsets[-1] := 0``), and for such a row::

        y = w[e,0] * norm(x^3) + w[e,1] * norm(x^2) + w[e,2] * norm(x) + b[e]
        norm(u) = u / sqrt(mean(u^2, dim=-1) + eps)

    Rows at or past ``offsets[E-1]`` belong to no expert: y is 0 there, and so is their
    gradient. Each row's expert is found with ``torch.searchsorted`` on x's device, without
    reading offsets on the host, so this also compiles (torch.compile, fullgraph). The oracle of the grouped ops when
    run with ``compute_dtype=torch.float64``; autograd differentiates it.

    Args:
        x: ``(..., H)`` tensor of float32, float64, float16 or bfloat16, H >= 1.
        weight: ``[E, 3]``, one ``[w0, w1, w2]`` per expert (w0 scales the cubic term), any
            of those dtypes.
        bias: ``[E]`` or ``[E, 1]``, any of those dtypes.
        offsets: ``[E]`` int32 or int64 on x's device: cumulative end offsets, non-decreasing
            and at most M (other values give undefined results), the convention of
            ``torch._grouped_mm``'s ``offs``.
        eps: added to each mean square inside the square root; finite and >= 0.
        compute_dtype: dtype of the computation; promoted with ``x.dtype``.

    Returns:
        y, with x's shape and dtype (rounded once from ``compute_dtype``), contiguous.

    Raises:
        TypeError, RuntimeError, ValueError: the checks of ``polynorm::grouped_forward``,
            naming ``polynorm.reference.poly_norm_grouped``.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    eps = check_grouped_forward_args(
        "polynorm.reference.poly_norm_grouped", x, weight, bias, offsets, eps, traced=torch.compiler.is_compiling()
    )
    return _poly_norm_grouped(x, weight, bias, offsets, eps, compute_dtype=compute_dtype)


def _poly_norm_grouped(
    x: Tensor, weight: Tensor, bias: Tensor, offsets: Tensor, eps, *, compute_dtype: torch.dtype = torch.float32
) -> Tensor:
    # poly_norm_grouped without the argument checks.
    dtype = _compute_dtype(x, compute_dtype)
    H = x.shape[-1]
    xc = x.to(dtype, memory_format=torch.contiguous_format).reshape(-1, H)
    y, owned = _grouped_rows(xc, weight.to(dtype), bias.to(dtype), offsets, eps)
    y = torch.where(owned, y, torch.zeros((), dtype=dtype, device=x.device))
    return y.to(x.dtype).reshape(x.shape)


# ----------------------------------------------------------------------------------------
# Sharded passes (tensor parallelism, docs/MATH.md (12)-(15))
# ----------------------------------------------------------------------------------------
# The float64 oracles of torch.ops.polynorm.sharded_forward_stats, sharded_forward_apply,
# sharded_backward_stats and sharded_backward_apply: x ``(..., H_shard)`` holds a shard of each
# row's columns (H_shard may be 0); mul, where given, is the fused op's, sharded like x. Sums,
# rstd and the parameter gradients come back in float64; out, grad_x and grad_mul in x's dtype,
# rounded once. No argument checks: the ops' own run first where these serve as a backend.


def _rows64(t: Tensor) -> Tensor:
    # t as [M, H_shard] float64; M counts the leading dimensions, also when H_shard = 0.
    return t.to(torch.float64).reshape(math.prod(t.shape[:-1]), t.shape[-1])


def sharded_forward_stats(x: Tensor) -> Tensor:
    """``[M, 3]`` float64: this shard's ``[sum x^2, sum x^4, sum x^6]`` of each row (MATH.md (12))."""
    x2 = _rows64(x).pow(2)
    return torch.stack([x2.sum(-1), x2.pow(2).sum(-1), x2.pow(3).sum(-1)], dim=1)


def sharded_forward_apply(x: Tensor, mul, sums: Tensor, weight: Tensor, bias: Tensor, hidden_size: int,
                          eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """(out, rstd): PolyNorm (times mul) of this shard's columns from the summed ``sums`` and the
    unsharded ``hidden_size`` (MATH.md (1)-(3), (8)); rstd ``[M, 3] = [r_3, r_2, r_1]`` float64."""
    xs = _rows64(x)
    r1, r2, r3 = (1.0 / torch.sqrt(sums.to(torch.float64) / hidden_size + eps)).unbind(1)
    w = weight.to(torch.float64).reshape(3)
    b = bias.to(torch.float64).reshape(())
    y = w[0] * xs.pow(3) * r3[:, None] + w[1] * xs.pow(2) * r2[:, None] + w[2] * xs * r1[:, None] + b
    if mul is not None:
        y = y * _rows64(mul)
    return y.to(x.dtype).reshape(x.shape), torch.stack([r3, r2, r1], dim=1)


def _grad(grad_out: Tensor, mul) -> Tensor:
    # PolyNorm's dL/dy: grad_out, or grad_out * mul for the fused op (MATH.md (9)).
    g = _rows64(grad_out)
    return g if mul is None else g * _rows64(mul)


def sharded_backward_stats(grad_out: Tensor, x: Tensor, mul, rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(sums, grad_weight, grad_bias): this shard's ``[S_1, S_2, S_3]`` ``[M, 3]`` (MATH.md (13)),
    and its share of dw ``(3,)`` and db ``(1,)`` (MATH.md (14)), all float64."""
    xs, g = _rows64(x), _grad(grad_out, mul)
    s = torch.stack([(g * xs).sum(-1), (g * xs.pow(2)).sum(-1), (g * xs.pow(3)).sum(-1)], dim=1)
    r = rstd.to(torch.float64)
    grad_weight = (r * s.flip(1)).sum(0)  # [r_3 S_3, r_2 S_2, r_1 S_1] over the rows
    return s, grad_weight, g.sum().reshape(1)


def sharded_backward_apply(grad_out: Tensor, x: Tensor, mul, weight: Tensor, bias: Tensor, rstd: Tensor,
                           sums: Tensor, hidden_size: int) -> tuple[Tensor, Tensor]:
    """(grad_x, grad_mul) of this shard's columns from the summed ``sums`` (MATH.md (5)-(6), (10));
    grad_mul has 0 elements when mul is None."""
    xs, g = _rows64(x), _grad(grad_out, mul)
    r3, r2, r1 = rstd.to(torch.float64).unbind(1)
    s1, s2, s3 = sums.to(torch.float64).unbind(1)
    w = weight.to(torch.float64).reshape(3)
    dx = torch.zeros_like(xs)
    for p, wp, rp, sp in ((1, w[2], r1, s1), (2, w[1], r2, s2), (3, w[0], r3, s3)):
        rp, sp = rp[:, None], sp[:, None]
        dx = dx + wp * p * rp * (xs.pow(p - 1) * g - xs.pow(2 * p - 1) * rp * rp * sp / hidden_size)
    grad_x = dx.to(x.dtype).reshape(x.shape)
    if mul is None:
        return grad_x, x.new_empty(0)
    b = bias.to(torch.float64).reshape(())
    y = w[0] * xs.pow(3) * r3[:, None] + w[1] * xs.pow(2) * r2[:, None] + w[2] * xs * r1[:, None] + b
    return grad_x, (_rows64(grad_out) * y).to(x.dtype).reshape(x.shape)
def _grouped_rows(xc: Tensor, weight: Tensor, bias: Tensor, offsets: Tensor, eps) -> tuple[Tensor, Tensor]:
    # (y, owned) of the [M, H] rows xc, with weight [E, 3] and bias [E] or [E, 1] already in
    # xc's dtype: each row's PolyNorm with its expert's parameters, and [M, 1] True on rows of
    # an expert (y there is to be replaced by the caller).
    E = weight.shape[0]
    rows = torch.arange(xc.shape[0], device=xc.device)
    # The first e with offsets[e] > row: the row's expert, E for a row of no expert.
    expert = torch.searchsorted(offsets.to(torch.int64).contiguous(), rows, right=True)
    return _rows_of_experts(xc, weight, bias, expert, eps)


def _rows_of_experts(xc: Tensor, weight: Tensor, bias: Tensor, expert: Tensor, eps) -> tuple[Tensor, Tensor]:
    # _grouped_rows from each row's expert ([M] int64; outside [0, E): no expert's row).
    E = weight.shape[0]
    owned = ((expert >= 0) & (expert < E))[:, None]
    e = expert.clamp(0, E - 1)
    w = weight.reshape(E, 3)[e]  # [M, 3]
    b = bias.reshape(E, 1)[e]  # [M, 1]
    # Rows of no expert are never used: replaced by ones so that their statistics stay finite
    # (no NaN into the gradient through torch.where).
    xs = torch.where(owned, xc, torch.ones((), dtype=xc.dtype, device=xc.device))
    y = w[:, 0:1] * _norm(xs.pow(3), eps) + w[:, 1:2] * _norm(xs.pow(2), eps) + w[:, 2:3] * _norm(xs, eps) + b
    return y, owned


def _clamp(v: Tensor, c) -> Tensor:
    # MATH.md (16), (17): clamp_c(v), whose gradient passes where v is left as it is (|v| <= c,
    # the boundary included, and a NaN); None: no clamp. Two selects rather than torch.clamp,
    # whose gradient at the boundary is not the same on every torch release (0 on 2.14).
    if c is None:
        return v
    return torch.where(v > c, torch.full((), c, dtype=v.dtype, device=v.device),
                       torch.where(v < -c, torch.full((), -c, dtype=v.dtype, device=v.device), v))  # fmt: skip


def expert_coefficients(
    weight: Tensor, bias: Tensor, *, sigmoid_weight: bool = False, bias_clamp=None, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """MATH.md (17): each expert's PolyNorm coefficients ``(w~ [E, 3], b~ [E])`` in ``dtype``.

    ``w~ = sigmoid(weight)`` when ``sigmoid_weight`` (else weight) and ``b~ = clamp(bias,
    -bias_clamp, bias_clamp)`` (no clamp for None), each taken after widening the parameter
    to ``dtype`` (fp32 for Motif-3's fp32 parameters, as its serving code does). Autograd
    differentiates both: MATH.md (23).
    """
    w = weight.to(dtype)
    if sigmoid_weight:
        w = torch.sigmoid(w)
    b = bias.to(dtype).reshape(bias.shape[0])
    if bias_clamp is not None:
        b = _clamp(b, float(bias_clamp))
    return w, b


def poly_norm_grouped_mul(
    x: Tensor,
    mul: Tensor,
    weight: Tensor,
    bias: Tensor,
    offsets: Tensor,
    eps: float = 1e-6,
    *,
    sigmoid_weight: bool = False,
    bias_clamp: float | None = None,
    hidden_clamp: float | None = None,
    output_scale: float = 1.0,
    compute_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Motif-3's MoE activation in plain PyTorch: grouped PolyNorm times a gate, with its options.

    For a row of expert e (rows sorted by expert as in :func:`poly_norm_grouped`), with
    ``clamp_c(v) = min(max(v, -c), c)`` (``c = hidden_clamp``, no clamp for None)::

        w~ = sigmoid(weight[e]) if sigmoid_weight else weight[e]
        b~ = clamp(bias[e], -bias_clamp, bias_clamp)
        y  = PolyNorm(clamp_c(x)) with w~ and b~
        out = round(output_scale * clamp_c(y * clamp_c(mul)))

    in ``compute_dtype`` (promoted with x's dtype), rounded once to x's dtype (docs/MATH.md
    (16)-(19)). Rows of no expert give 0. The oracle of ``polynorm::grouped_mul_forward``
    when run with ``compute_dtype=torch.float64``; autograd differentiates it (MATH.md
    (20)-(23)).

    Args:
        x: ``(..., H)`` float32, float64, float16 or bfloat16 (Motif-3's gate), H >= 1.
        mul: x's shape and dtype (the up projection); any strides.
        weight: ``[E, 3]``, bias: ``[E]`` or ``[E, 1]``, offsets: ``[E]`` int32/int64, eps: as
            in :func:`poly_norm_grouped`.
        sigmoid_weight, bias_clamp, hidden_clamp, output_scale: Motif-3's
            ``polynorm_sigmoid_weight``, ``polynorm_bias_clamp``, ``hidden_clamp`` and
            ``polynorm_output_scale``.

    Returns:
        out, x's shape and dtype, contiguous.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884; Motif-3's
    options as its public serving code applies them (docs/MATH.md).
    """
    from polynorm._common import check_grouped_mul_forward_args

    eps = check_grouped_mul_forward_args(
        "polynorm.reference.poly_norm_grouped_mul", x, mul, weight, bias, offsets, eps,
        hidden_clamp, bias_clamp, output_scale, traced=torch.compiler.is_compiling(),
    )  # fmt: skip
    dtype = _compute_dtype(x, compute_dtype)
    w, b = expert_coefficients(weight, bias, sigmoid_weight=sigmoid_weight, bias_clamp=bias_clamp, dtype=dtype)
    return _poly_norm_grouped_mul(x, mul, w, b, offsets, eps, hidden_clamp, output_scale, dtype)


def _poly_norm_grouped_mul(x: Tensor, mul: Tensor, w: Tensor, b: Tensor, offsets: Tensor, eps, hidden_clamp,
                           output_scale: float, dtype: torch.dtype, expert: Tensor | None = None) -> Tensor:  # fmt: skip
    # poly_norm_grouped_mul without the checks, from the coefficients w~, b~ (in dtype); each
    # row's expert from offsets, or given ([M] int64, outside [0, E) for no expert's row).
    H = x.shape[-1]
    xc = _clamp(x.to(dtype, memory_format=torch.contiguous_format).reshape(-1, H), hidden_clamp)
    mc = _clamp(mul.to(dtype, memory_format=torch.contiguous_format).reshape(-1, H), hidden_clamp)
    if expert is None:
        y, owned = _grouped_rows(xc, w, b, offsets, eps)
    else:
        y, owned = _rows_of_experts(xc, w, b, expert, eps)
    out = output_scale * _clamp(y * torch.where(owned, mc, torch.zeros((), dtype=dtype, device=x.device)), hidden_clamp)
    out = torch.where(owned, out, torch.zeros((), dtype=dtype, device=x.device))
    return out.to(x.dtype).reshape(x.shape)


def poly_norm_grouped_mul_topk(
    x: Tensor,
    mul: Tensor,
    weight: Tensor,
    bias: Tensor,
    topk_ids: Tensor,
    expert_map: Tensor | None = None,
    eps: float = 1e-6,
    *,
    out: Tensor | None = None,
    sigmoid_weight: bool = False,
    bias_clamp: float | None = None,
    hidden_clamp: float | None = None,
    output_scale: float = 1.0,
    compute_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """:func:`poly_norm_grouped_mul` in the token-major layout of a fused MoE, in plain PyTorch.

    Row r of x and mul (T * K rows) is token ``r // K``'s slot ``r % K``; its local expert is
    ``expert_map[topk_ids[r // K, r % K]]`` (the id itself without a map). Rows of a local
    expert in ``[0, E)`` get the activation; the others (a map entry of -1: another rank's
    expert) keep out's values, or 0 without ``out``. Returns a new tensor (out is not written);
    the oracle of ``polynorm::grouped_mul_topk_forward`` with ``compute_dtype=torch.float64``.
    """
    from polynorm._common import check_grouped_mul_topk_args

    base = torch.zeros_like(x, memory_format=torch.contiguous_format) if out is None else out
    eps = check_grouped_mul_topk_args(
        "polynorm.reference.poly_norm_grouped_mul_topk", x, mul, weight, bias, topk_ids, expert_map, eps,
        hidden_clamp, output_scale, base,
    )  # fmt: skip
    dtype = _compute_dtype(x, compute_dtype)
    w, b = expert_coefficients(weight, bias, sigmoid_weight=sigmoid_weight, bias_clamp=bias_clamp, dtype=dtype)
    ids = topk_ids.reshape(-1).to(torch.int64)
    n_ids = expert_map.shape[0] if expert_map is not None else weight.shape[0]
    valid = (ids >= 0) & (ids < n_ids)
    safe = torch.where(valid, ids, 0)
    local = expert_map.to(torch.int64)[safe] if expert_map is not None else safe
    expert = torch.where(valid, local, -1)
    act = _poly_norm_grouped_mul(x, mul, w, b, None, eps, hidden_clamp, float(output_scale), dtype, expert=expert)
    owned = ((expert >= 0) & (expert < weight.shape[0])).reshape(-1, 1)
    H = x.shape[-1]
    return torch.where(owned, act.reshape(-1, H), base.reshape(-1, H)).reshape(x.shape)


def quantize_fp8_groups(v: Tensor, scale_format: str = "fp32", group: int = 128) -> tuple[Tensor, Tensor]:
    """docs/MATH.md (24)-(26) in plain PyTorch: v ``(..., H)`` quantised to float8_e4m3fn with one
    fp32 scale per group of ``group`` columns of a row, by torch's own float8 conversion.

    ``scale = max(amax|v|, 1e-10) / 448`` per group (fp32), the least power of two above it for
    ``"ue8m0"`` and ``"ue8m0_packed"``; ``q = e4m3(clamp(v / scale, -448, 448))``.

    Returns:
        q ``(M, H)`` float8_e4m3fn; scale ``(M, G)`` fp32 (``"fp32"``, ``"ue8m0"``) or int32
        ``(M, ceil(G / 4))`` (``"ue8m0_packed"``: each word 4 groups' exponent bytes,
        little-endian), column-major (transposed views of contiguous ``(G, M)`` tensors), as
        the FP8 kernels return them.
    """
    H = v.shape[-1]
    vr = v.reshape(-1, H).float()
    M, G = vr.shape[0], (H + group - 1) // group
    padded = torch.zeros((M, G * group), dtype=torch.float32, device=v.device)
    padded[:, :H] = vr
    amax = padded.reshape(M, G, group).abs().amax(dim=-1).clamp(min=1e-10)
    scale = amax / 448.0
    if scale_format != "fp32":
        mant, exp = torch.frexp(scale)  # scale = mant 2^exp, mant in [0.5, 1)
        scale = torch.ldexp(torch.ones_like(scale), torch.where(mant == 0.5, exp - 1, exp))
    q = (padded.reshape(M, G, group) / scale[..., None]).clamp(-448.0, 448.0).reshape(M, G * group)[:, :H]
    q = q.to(torch.float8_e4m3fn).contiguous()
    if scale_format != "ue8m0_packed":
        return q, scale.t().contiguous().t()
    codes = ((scale.view(torch.int32) >> 23) & 0xFF).to(torch.int64)
    words = torch.zeros((M, (G + 3) // 4), dtype=torch.int64, device=v.device)
    for g in range(G):
        words[:, g // 4] |= codes[:, g] << (8 * (g % 4))
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return q, words.t().contiguous().t()
