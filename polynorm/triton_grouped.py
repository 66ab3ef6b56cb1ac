"""Triton kernels for grouped PolyNorm (mixture of experts): ``torch.ops.polynorm.grouped_forward_triton``
and ``grouped_backward_triton``, with the schemas of ``polynorm::grouped_forward`` / ``grouped_backward``.

PolyNorm (Zhuo et al., "Polynomial Composition Activations: Unleashing the Dynamics of Large
Language Models", arXiv:2411.03884) with one ``[w0, w1, w2, b]`` per expert. Rows arrive sorted
by expert: expert e owns rows ``[offsets[e-1], offsets[e])`` (``offsets[-1] := 0``). Per row,
with its expert's parameters (``docs/MATH.md``, "Grouped PolyNorm"; each equation written once,
in :mod:`polynorm.triton_math`, shared with the single-expert kernels)::

    r_p = 1 / sqrt(mean(x^(2p)) + eps)                      p = 1, 2, 3         (1)-(2)
    y   = x * (w2 r_1 + x * (w1 r_2 + x * w0 r_3)) + b      (Horner form)       (3)
    S_p = sum_j g_j x_j^p,  G = sum_j g_j                                       (4)
    c_p = w(p) p r_p,  d_p = c_p r_p^2 S_p / H                                  (5)
    dx  = g (c_1 + x (c_2 + x c_3)) - x (d_1 + x^2 (d_2 + x^2 d_3))             (6)
    dw[e] = [sum r_3 S_3, sum r_2 S_2, sum r_1 S_1],  db[e] = sum G  (rows of e) (11)

Layout of the work
- The row kernels are :mod:`polynorm.triton_kernels`' own, with their tiles, launch
  configuration (a function of H and the dtype only), statistics passes and math, plus a
  binary search of offsets per row, read on the device: no host synchronisation. The search
  only yields experts in ``[0, E]``, so offsets that decrease or exceed M (undefined
  results) never make a kernel read or write out of bounds.
- Rows at or past ``offsets[E-1]`` belong to no expert: they are not read; y, rstd and
  grad_x are 0 there.
- Backward: each row writes ``[r_3 S_3, r_2 S_2, r_1 S_1, G]`` to an ``[M, 4]`` buffer; a
  second kernel, one program per expert, adds its segment in BLOCK_R lanes (row
  ``begin + i`` into lane ``i % BLOCK_R``, in order) and then a fixed tree: an order that
  depends only on the segment's length. An expert's dW and dB are the same bits on every run,
  and the same bits as these ops give for that expert's rows alone. No atomics.

With ``TRITON_INTERPRET=1`` set before this module is imported, the kernels run on CPU tensors
in Triton's interpreter (slowly): that is how CI without a GPU tests them.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import wrap_triton

from polynorm._common import (
    check_grouped_backward_args,
    check_grouped_forward_args,
    check_grouped_mul_backward_args,
    check_grouped_mul_forward_args,
    check_grouped_mul_options,
    check_grouped_mul_topk_args,
)
from polynorm.triton_kernels import (
    _BF16_BY_HAND,
    _acc_dtype,
    _as_rows,
    _check_runs_here,
    _launch_config,
    _launchable,
    _load_acc,
    _load_rstd,
    _on_device_of,
    _op,
    _row_grad_sums_looped,
    _row_sums_looped,
    _store_rstd,
    _to_acc,
    _to_out,
)
from polynorm.triton_math import (
    add_row_grad_sums,
    add_row_sums,
    backward_coeffs,
    forward_coeffs,
    grad_x_value,
    inv_h_of,
    poly_value,
    row_grad_sums,
    row_sums,
    rstd_of,
)

__all__ = [
    "poly_norm_grouped_backward_triton",
    "poly_norm_grouped_forward_triton",
    "poly_norm_grouped_mul_backward_triton",
    "poly_norm_grouped_mul_forward_fp8_triton",
    "poly_norm_grouped_mul_forward_triton",
    "poly_norm_grouped_mul_topk_forward_triton",
]


@triton.jit
def _expert_of(offsets_ptr, offsets_stride, rows, row_mask, E, n_steps):
    # The first e with offsets[e] > row, per row: its expert, or E for a row of no expert. A
    # binary search in n_steps = bit_length(E) halvings; it only reads offsets[0 .. E-1].
    lo = tl.zeros_like(rows)
    hi = lo + E
    for _ in range(n_steps):
        active = row_mask & (lo < hi)
        mid = (lo + hi) // 2
        end = tl.load(offsets_ptr + mid * offsets_stride, mask=active, other=0).to(tl.int64)
        lo = tl.where(active & (end <= rows), mid + 1, lo)
        hi = tl.where(active & (end > rows), mid, hi)
    return lo


@triton.jit
def _expert_weights(w_ptr, w_stride0, w_stride1, expert, owned, ACC: tl.constexpr):
    # Each row's expert's [w0, w1, w2], in ACC (0 on rows of no expert), read in their own dtype.
    w_rows = w_ptr + expert * w_stride0
    w0 = _to_acc(tl.load(w_rows, mask=owned, other=0.0), ACC)
    w1 = _to_acc(tl.load(w_rows + w_stride1, mask=owned, other=0.0), ACC)
    w2 = _to_acc(tl.load(w_rows + 2 * w_stride1, mask=owned, other=0.0), ACC)
    return w0, w1, w2


@triton.jit
def _owned_rstd(s1, s2, s3, owned, H, eps, ACC: tl.constexpr, BLOCK_M: tl.constexpr):
    # MATH.md (2): each term's rstd from its row sums, once per row; 0 on rows of no expert.
    inv_h = inv_h_of(H, ACC)
    e = tl.full([], eps, ACC)
    zero = tl.zeros([BLOCK_M], ACC)
    r1 = tl.where(owned, rstd_of(s1, inv_h, e), zero)
    r2 = tl.where(owned, rstd_of(s2, inv_h, e), zero)
    r3 = tl.where(owned, rstd_of(s3, inv_h, e), zero)
    return r1, r2, r3


# M is never specialised (Triton would compile M == 1 as a constant): the code, and so a
# row's bits, must not depend on the batch size.
@triton.jit(do_not_specialize=["M"])
def _poly_norm_grouped_fwd_kernel(
    x_ptr,  # [M, H], unit column stride, rows x_row_stride elements apart
    x_row_stride,
    y_ptr,  # [M, H] contiguous, x's dtype
    rstd_ptr,  # [M, 3] fp32 (fp64 for fp64 x): rstd of x^3, x^2, x; 0 on rows of no expert
    w_ptr,  # [E, 3] any float dtype: [w0, w1, w2] per expert
    w_stride0,
    w_stride1,
    b_ptr,  # [E] (or [E, 1]) any float dtype
    b_stride,
    offsets_ptr,  # [E] int32 or int64: cumulative end offsets
    offsets_stride,
    E,
    n_steps,  # bit_length(E): binary-search halvings
    M,
    H,
    eps: tl.float64,  # fp64 so that fp64 inputs see eps unrounded
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_H: tl.constexpr,  # columns per block: the whole row when ONE_BLOCK
    ONE_BLOCK: tl.constexpr,  # the row fits one block: x is read once
):
    ACC = rstd_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] int64
    in_range = rows < M
    expert = _expert_of(offsets_ptr, offsets_stride, rows, in_range, E, n_steps)
    owned = in_range & (expert < E)  # rows of no expert are not read
    x_rows = x_ptr + rows * x_row_stride  # per-row base pointers, 64-bit offsets
    y_rows = y_ptr + rows * H
    cols = tl.arange(0, BLOCK_H)

    # Statistics (MATH.md (1)): sum of x^2, x^4, x^6 per row, in one pass.
    if ONE_BLOCK:
        mask = owned[:, None] & (cols < H)[None, :]
        x = _load_acc(x_rows, cols, mask, ACC)
        s1, s2, s3 = row_sums(x)
    else:
        s1, s2, s3 = _row_sums_looped(x_rows, cols, owned, H, ACC, BLOCK_M, BLOCK_H)

    r1, r2, r3 = _owned_rstd(s1, s2, s3, owned, H, eps, ACC, BLOCK_M)
    _store_rstd(rstd_ptr, rows, r3, r2, r1, in_range)

    # The row's expert's parameters, in their own dtype (0 on rows of no expert).
    w0, w1, w2 = _expert_weights(w_ptr, w_stride0, w_stride1, expert, owned, ACC)
    a1, a2, a3 = forward_coeffs(w0, w1, w2, r3, r2, r1)
    b = _to_acc(tl.load(b_ptr + expert * b_stride, mask=owned, other=0.0), ACC)[:, None]

    # Output, MATH.md (3); 0 on rows of no expert.
    if ONE_BLOCK:
        y = tl.where(owned[:, None], poly_value(x, a1, a2, a3, b), 0.0)
        out_mask = in_range[:, None] & (cols < H)[None, :]
        tl.store(y_rows[:, None] + cols[None, :], _to_out(y, y_ptr.dtype.element_ty), mask=out_mask)
    else:
        for c0 in range(0, H, BLOCK_H):
            c = c0 + cols
            mask = owned[:, None] & (c < H)[None, :]
            y = tl.where(owned[:, None], poly_value(_load_acc(x_rows, c, mask, ACC), a1, a2, a3, b), 0.0)
            out_mask = in_range[:, None] & (c < H)[None, :]
            tl.store(y_rows[:, None] + c[None, :], _to_out(y, y_ptr.dtype.element_ty), mask=out_mask)


@triton.jit(do_not_specialize=["M"])
def _poly_norm_grouped_bwd_kernel(
    g_ptr,  # [M, H] grad_y, unit column stride, rows g_row_stride apart (0 for an expand)
    g_row_stride,
    x_ptr,  # [M, H], unit column stride, rows x_row_stride apart
    x_row_stride,
    rstd_ptr,  # [M, 3] contiguous fp32 (fp64 for fp64 x): rstd of x^3, x^2, x
    w_ptr,  # [E, 3] any float dtype
    w_stride0,
    w_stride1,
    offsets_ptr,  # [E] int32 or int64
    offsets_stride,
    E,
    n_steps,
    dx_ptr,  # [M, H] contiguous, x's dtype
    partials_ptr,  # [M, 4] rstd's dtype: each row's [r_3 S_3, r_2 S_2, r_1 S_1, G]
    M,
    H,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ONE_BLOCK: tl.constexpr,
):
    ACC = partials_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] int64
    in_range = rows < M
    expert = _expert_of(offsets_ptr, offsets_stride, rows, in_range, E, n_steps)
    owned = in_range & (expert < E)
    g_rows = g_ptr + rows * g_row_stride  # per-row base pointers, 64-bit offsets
    x_rows = x_ptr + rows * x_row_stride
    dx_rows = dx_ptr + rows * H
    cols = tl.arange(0, BLOCK_H)

    # S_1, S_2, S_3 and G per row (MATH.md (4)), in one pass.
    if ONE_BLOCK:
        mask = owned[:, None] & (cols < H)[None, :]
        x = _load_acc(x_rows, cols, mask, ACC)
        g = _load_acc(g_rows, cols, mask, ACC)
        s1, s2, s3, sg = row_grad_sums(x, g)
    else:
        # HAS_MUL=False: g is grad_y itself; g_rows stands in for the unread mul rows.
        s1, s2, s3, sg = _row_grad_sums_looped(g_rows, g_rows, x_rows, cols, owned, H, ACC, BLOCK_M, BLOCK_H, False)

    # Rows of no expert: r = 0 and w = 0 give c = d = 0, S = 0 (nothing read), so dx = 0 and
    # a zero share of the parameter gradients.
    r3, r2, r1 = _load_rstd(rstd_ptr, rows, owned)
    w0, w1, w2 = _expert_weights(w_ptr, w_stride0, w_stride1, expert, owned, ACC)
    inv_h = inv_h_of(H, ACC)
    # This row's share of its expert's [dw0, dw1, dw2, db] (MATH.md (11)).
    part_rows = partials_ptr + rows * 4
    tl.store(part_rows + 0, r3 * s3, mask=in_range)
    tl.store(part_rows + 1, r2 * s2, mask=in_range)
    tl.store(part_rows + 2, r1 * s1, mask=in_range)
    tl.store(part_rows + 3, sg, mask=in_range)

    c1, c2, c3, d1, d2, d3 = backward_coeffs(w0, w1, w2, r3, r2, r1, s1, s2, s3, inv_h)
    if ONE_BLOCK:
        dx = tl.where(owned[:, None], grad_x_value(x, g, c1, c2, c3, d1, d2, d3), 0.0)
        out_mask = in_range[:, None] & (cols < H)[None, :]
        tl.store(dx_rows[:, None] + cols[None, :], _to_out(dx, dx_ptr.dtype.element_ty), mask=out_mask)
    else:
        for c0 in range(0, H, BLOCK_H):
            c = c0 + cols
            mask = owned[:, None] & (c < H)[None, :]
            xc = _load_acc(x_rows, c, mask, ACC)
            gc = _load_acc(g_rows, c, mask, ACC)
            dx = tl.where(owned[:, None], grad_x_value(xc, gc, c1, c2, c3, d1, d2, d3), 0.0)
            out_mask = in_range[:, None] & (c < H)[None, :]
            tl.store(dx_rows[:, None] + c[None, :], _to_out(dx, dx_ptr.dtype.element_ty), mask=out_mask)


@triton.jit(do_not_specialize=["M"])
def _poly_norm_grouped_param_kernel(
    partials_ptr,  # [M, 4] fp32 (fp64 for fp64 x)
    offsets_ptr,  # [E] int32 or int64
    offsets_stride,
    M,
    grad_w_ptr,  # [E, 3] the partials' dtype
    grad_b_ptr,  # [E] the partials' dtype
    BLOCK_R: tl.constexpr,
):
    # One program per expert: its segment [begin, end), clamped to [0, M] (empty where offsets
    # decrease), added in BLOCK_R lanes in order and then a fixed tree. The sums are stored
    # unrounded: autograd rounds each to its parameter's dtype.
    ACC = partials_ptr.dtype.element_ty
    e = tl.program_id(0)
    begin = tl.load(offsets_ptr + (e - 1) * offsets_stride, mask=e > 0, other=0).to(tl.int64)
    end = tl.load(offsets_ptr + e * offsets_stride).to(tl.int64)
    begin = tl.minimum(tl.maximum(begin, 0), M)
    end = tl.minimum(tl.maximum(end, begin), M)
    lanes = tl.arange(0, BLOCK_R)
    cols = tl.arange(0, 4)
    acc = tl.zeros([BLOCK_R, 4], ACC)
    for r0 in range(0, end - begin, BLOCK_R):
        r = begin + r0 + lanes
        acc += tl.load(partials_ptr + r[:, None] * 4 + cols[None, :], mask=(r < end)[:, None], other=0.0)
    total = tl.sum(acc, axis=0)  # [4]: dw0, dw1, dw2, db
    tl.store(grad_w_ptr + e.to(tl.int64) * 3 + cols, total, mask=cols < 3)
    tl.store(grad_b_ptr + e, tl.sum(tl.where(cols == 3, total, 0.0), axis=0))


# Rows per lane block of the parameter-gradient kernel: 256 lanes x 4 sums, 4 warps.
_PARAM_BLOCK_R = 256

_GFWD = "polynorm.grouped_forward_triton"
_GBWD = "polynorm.grouped_backward_triton"
_GFWD_SCHEMA = "(Tensor x, Tensor weight, Tensor bias, Tensor offsets, float eps=1e-06) -> (Tensor y, Tensor rstd)"
_GBWD_SCHEMA = (
    "(Tensor grad_y, Tensor x, Tensor weight, Tensor offsets, Tensor rstd) -> "
    "(Tensor grad_x, Tensor grad_weight, Tensor grad_bias)"
)


def _search_steps(E) -> int:
    # int(): E is the weight's leading dimension, a plain int but for a symbolic weight shape,
    # whose value the kernel launch needs anyway.
    return int(E).bit_length()


@_op("polynorm::grouped_forward_triton", mutates_args=(), schema=_GFWD_SCHEMA)
def poly_norm_grouped_forward_triton(
    x: Tensor, weight: Tensor, bias: Tensor, offsets: Tensor, eps: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """Grouped PolyNorm forward in Triton: ``torch.ops.polynorm.grouped_forward_triton(x, weight, bias, offsets, eps)``.

    For a row of expert e (rows ``[offsets[e-1], offsets[e])``, ``offsets[-1] := 0``):
    ``y = w[e,0] norm(x^3) + w[e,1] norm(x^2) + w[e,2] norm(x) + b[e]`` with
    ``norm(u) = u / sqrt(mean(u^2) + eps)`` over H. Accumulates in fp32 (fp64 for fp64 x);
    y is rounded once. Rows at or past ``offsets[E-1]`` are not read; y and rstd are 0 there.

    Args:
        x: ``(..., H)``, float32, float64, float16 or bfloat16, on a CUDA device (or the CPU
            under ``TRITON_INTERPRET=1``), rows sorted by expert. Rows with unit last-dim
            stride and any row stride are read in place; other layouts are copied once.
        weight: ``[E, 3]``, ``[w0, w1, w2]`` per expert, any of those dtypes.
        bias: ``[E]`` or ``[E, 1]``, any of those dtypes.
        offsets: ``[E]`` int32 or int64 on x's device, cumulative end offsets, read on the
            device; decreasing values or values beyond M give undefined results (never an
            out-of-bounds access).
        eps: added to each mean square inside the square root; finite and >= 0.

    Returns:
        y: x's shape and dtype, contiguous. rstd: ``(M, 3)``, ``[r_3, r_2, r_1]`` per row,
        float32 (float64 for float64 x); not differentiable.

    Raises:
        TypeError, ValueError, RuntimeError: the checks of ``polynorm::grouped_forward``,
            messages starting ``polynorm.grouped_forward_triton:``; RuntimeError also for x
            on the CPU without the interpreter.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    eps = check_grouped_forward_args(_GFWD, x, weight, bias, offsets, eps)
    _check_runs_here(_GFWD, x)
    x_rows, M, H, x_row_stride = _as_rows(x)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = torch.empty((M, 3), dtype=_acc_dtype(x.dtype), device=x.device)
    if M == 0:
        return y, rstd
    E = weight.shape[0]
    block_m, block_h, one_block, num_warps = _launch_config(H, x.dtype, "forward")
    if _launchable(x_rows, weight, bias, offsets):
        with _on_device_of(x):
            wrap_triton(_poly_norm_grouped_fwd_kernel)[((M + block_m - 1) // block_m,)](
                x_rows, x_row_stride, y, rstd, weight, weight.stride(0), weight.stride(1), bias, bias.stride(0),
                offsets, offsets.stride(0), E, _search_steps(E), M, H, eps,
                BLOCK_M=block_m, BLOCK_H=block_h, ONE_BLOCK=one_block, num_warps=num_warps,
            )  # fmt: skip
    return y, rstd


@_op("polynorm::grouped_backward_triton", mutates_args=(), schema=_GBWD_SCHEMA)
def poly_norm_grouped_backward_triton(
    grad_y: Tensor, x: Tensor, weight: Tensor, offsets: Tensor, rstd: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Grouped PolyNorm backward in Triton: ``torch.ops.polynorm.grouped_backward_triton(grad_y, x, weight, offsets, rstd)``.

    Per row of expert e, with ``S_p = sum_j g_j x_j^p``, ``c_p = w(p) p r_p`` and
    ``d_p = c_p r_p^2 S_p / H`` (``w(3) = w[e,0], w(2) = w[e,1], w(1) = w[e,2]``)::

        grad_x = g (c_1 + x (c_2 + x c_3)) - x (d_1 + x^2 (d_2 + x^2 d_3))
        grad_weight[e] = [sum r_3 S_3, sum r_2 S_2, sum r_1 S_1],  grad_bias[e] = sum G

    each expert's sums over its own rows in fp32 (fp64 for fp64 x), in an order that depends
    only on the number of its rows: the same bits on every run, and the same bits as for that
    expert's rows alone. Rows of no expert are not read: grad_x is 0 there.

    Args:
        grad_y: x's shape and dtype; any layout.
        x, weight, offsets: as for :func:`poly_norm_grouped_forward_triton`.
        rstd: ``(M, 3)`` from the forward, float32 (float64 for float64 x).

    Returns:
        grad_x: x's shape and dtype, contiguous. grad_weight ``[E, 3]`` and grad_bias ``[E]``
        in float32 (float64 for float64 x), whatever weight's dtype; 0 for an empty expert.

    Raises:
        RuntimeError: as the forward for x, weight and offsets; grad_y not of x's shape,
            dtype and device; rstd not ``(M, 3)`` of the accumulation dtype on x's device.
            Messages start ``polynorm.grouped_backward_triton:``.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    check_grouped_backward_args(_GBWD, grad_y, x, weight, offsets, rstd)
    _check_runs_here(_GBWD, x)
    acc = _acc_dtype(x.dtype)
    x_rows, M, H, x_row_stride = _as_rows(x)
    g_rows, _, _, g_row_stride = _as_rows(grad_y)
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    E = weight.shape[0]
    if M == 0:
        return grad_x, x.new_zeros((E, 3), dtype=acc), x.new_zeros((E,), dtype=acc)
    rstd_c = rstd.contiguous()  # [M, 3]: at most a small copy
    grad_weight = x.new_empty((E, 3), dtype=acc)
    grad_bias = x.new_empty((E,), dtype=acc)
    partials = x.new_empty((M, 4), dtype=acc)
    block_m, block_h, one_block, num_warps = _launch_config(H, x.dtype, "backward")
    if _launchable(x_rows, g_rows, weight, offsets, rstd_c):
        with _on_device_of(x):
            wrap_triton(_poly_norm_grouped_bwd_kernel)[((M + block_m - 1) // block_m,)](
                g_rows, g_row_stride, x_rows, x_row_stride, rstd_c, weight, weight.stride(0), weight.stride(1),
                offsets, offsets.stride(0), E, _search_steps(E), grad_x, partials, M, H,
                BLOCK_M=block_m, BLOCK_H=block_h, ONE_BLOCK=one_block, num_warps=num_warps,
            )  # fmt: skip
            wrap_triton(_poly_norm_grouped_param_kernel)[(E,)](
                partials, offsets, offsets.stride(0), M, grad_weight, grad_bias, BLOCK_R=_PARAM_BLOCK_R, num_warps=4
            )
    return grad_x, grad_weight, grad_bias


# ----------------------------------------------------------------------------------------
# Motif-3's MoE activation: grouped fused-mul PolyNorm with hidden_clamp and output_scale
# (docs/MATH.md (16)-(22)). The kernels take each expert's coefficients w~ and b~ as given
# (sigmoid and the bias clamp are applied to the [E, 3] and [E] parameters before the call).
# ----------------------------------------------------------------------------------------


@triton.jit
def _clamp_c(v, c):
    # MATH.md (16): clamp_c(v). Two selects, not min/max: a NaN stays NaN (as torch.clamp).
    return tl.where(v > c, c, tl.where(v < -c, -c, v))


@triton.jit
def _clamped(v, c):
    # MATH.md (20)-(21): True where clamp_c moves v (|v| > c); a NaN is left as it is.
    return (v > c) | (v < -c)


@triton.jit
def _clamped_row_sums_looped(x_rows, x_col_stride, cols, owned, H, c, ACC: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_H: tl.constexpr):
    # row_sums (MATH.md (1)) of x~ = clamp_c(x) (16) on rows longer than one block, x's columns
    # x_col_stride apart; as triton_kernels._row_sums_looped.
    a1 = tl.zeros([BLOCK_M, BLOCK_H], ACC)
    a2 = tl.zeros([BLOCK_M, BLOCK_H], ACC)
    a3 = tl.zeros([BLOCK_M, BLOCK_H], ACC)
    for c0 in range(0, H, BLOCK_H):
        cc = c0 + cols
        mask = owned[:, None] & (cc < H)[None, :]
        a1, a2, a3 = add_row_sums(a1, a2, a3, _clamp_c(_load_acc(x_rows, cc * x_col_stride, mask, ACC), c))
    return tl.sum(a1, axis=1), tl.sum(a2, axis=1), tl.sum(a3, axis=1)


@triton.jit
def _mul_grad_tile(go, x, m, a1, a2, a3, b, c, s):
    # One tile of the backward's per-element values (MATH.md (20)-(21)) from grad_out go and
    # the raw x and m: (x~, y, q, g) with q = go s [|y m~| <= c] and g = q m~, all in ACC.
    xc = _clamp_c(x, c)
    mc = _clamp_c(m, c)
    y = poly_value(xc, a1, a2, a3, b)
    q = tl.where(_clamped(y * mc, c), 0.0, go * s)
    return xc, y, q, q * mc


@triton.jit
def _topk_expert_of(topk_ptr, s0, s1, K, map_ptr, map_stride, n_ids, E, rows, in_range, HAS_MAP: tl.constexpr):
    # The token-major layout's row r = (token r // K, slot r % K): its local expert
    # expert_map[topk_ids[r // K, r % K]] (the id itself without a map), and whether it has one in
    # [0, E). An id outside [0, n_ids) or a map entry outside [0, E) (-1: not local) is no row's:
    # nothing out of bounds is read.
    gid = tl.load(topk_ptr + (rows // K) * s0 + (rows % K) * s1, mask=in_range, other=-1).to(tl.int64)
    valid = in_range & (gid >= 0) & (gid < n_ids)
    if HAS_MAP:
        local = tl.load(map_ptr + gid * map_stride, mask=valid, other=-1).to(tl.int64)
    else:
        local = gid
    owned = valid & (local >= 0) & (local < E)
    return tl.where(owned, local, 0), owned


@triton.jit(do_not_specialize=["M"])
def _poly_norm_grouped_mul_fwd_kernel(
    x_ptr,  # [M, H] gate: element (row, j) at row * x_row_stride + j * x_col_stride
    x_row_stride,
    x_col_stride,
    m_ptr,  # [M, H] up, x's dtype: strides of its own
    m_row_stride,
    m_col_stride,
    out_ptr,  # [M, H] x's dtype, unit column stride, rows out_row_stride apart
    out_row_stride,
    rstd_ptr,  # [M, 3] fp32 (fp64 for fp64 x): rstd of x~^3, x~^2, x~; 0 on rows of no expert
    w_ptr,  # [E, 3] any float dtype: w~ per expert
    w_stride0,
    w_stride1,
    b_ptr,  # [E] any float dtype: b~ per expert
    b_stride,
    offsets_ptr,  # [E] int32 or int64: cumulative end offsets (TOPK: unused)
    offsets_stride,
    E,
    n_steps,
    topk_ptr,  # TOPK: [T, K] int32 or int64 global expert ids, row r = (r // K, r % K)
    topk_stride0,
    topk_stride1,
    K,
    map_ptr,  # TOPK and HAS_MAP: [global E] int32 or int64, the local expert or -1
    map_stride,
    n_ids,  # TOPK: the number of global experts (ids outside [0, n_ids) are no row's)
    M,
    H,
    eps: tl.float64,
    clamp: tl.float64,  # hidden_clamp c, +inf for none
    scale: tl.float64,  # output_scale s
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ONE_BLOCK: tl.constexpr,
    TOPK: tl.constexpr,  # the token-major layout: rows of no local expert are left untouched, no rstd
    HAS_MAP: tl.constexpr,
):
    ACC = rstd_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] int64
    in_range = rows < M
    if TOPK:
        expert, owned = _topk_expert_of(
            topk_ptr, topk_stride0, topk_stride1, K, map_ptr, map_stride, n_ids, E, rows, in_range, HAS_MAP
        )
        written = owned  # rows of no local expert: not read, not written
    else:
        expert = _expert_of(offsets_ptr, offsets_stride, rows, in_range, E, n_steps)
        owned = in_range & (expert < E)  # rows of no expert are not read
        written = in_range
    x_rows = x_ptr + rows * x_row_stride  # per-row base pointers, 64-bit offsets
    m_rows = m_ptr + rows * m_row_stride
    out_rows = out_ptr + rows * out_row_stride
    cols = tl.arange(0, BLOCK_H)
    c = tl.full([], clamp, ACC)
    s = tl.full([], scale, ACC)

    # Statistics of x~ (MATH.md (1), (16)), in one pass.
    if ONE_BLOCK:
        mask = owned[:, None] & (cols < H)[None, :]
        x = _clamp_c(_load_acc(x_rows, cols * x_col_stride, mask, ACC), c)
        s1, s2, s3 = row_sums(x)
    else:
        s1, s2, s3 = _clamped_row_sums_looped(x_rows, x_col_stride, cols, owned, H, c, ACC, BLOCK_M, BLOCK_H)

    r1, r2, r3 = _owned_rstd(s1, s2, s3, owned, H, eps, ACC, BLOCK_M)
    if not TOPK:
        _store_rstd(rstd_ptr, rows, r3, r2, r1, in_range)

    w0, w1, w2 = _expert_weights(w_ptr, w_stride0, w_stride1, expert, owned, ACC)
    ha1, ha2, ha3 = forward_coeffs(w0, w1, w2, r3, r2, r1)
    b = _to_acc(tl.load(b_ptr + expert * b_stride, mask=owned, other=0.0), ACC)[:, None]

    # out = round(s clamp_c(y m~)), MATH.md (18)-(19); 0 on rows of no expert (TOPK: untouched).
    if ONE_BLOCK:
        m = _clamp_c(_load_acc(m_rows, cols * m_col_stride, mask, ACC), c)
        o = tl.where(owned[:, None], s * _clamp_c(poly_value(x, ha1, ha2, ha3, b) * m, c), 0.0)
        out_mask = written[:, None] & (cols < H)[None, :]
        tl.store(out_rows[:, None] + cols[None, :], _to_out(o, out_ptr.dtype.element_ty), mask=out_mask)
    else:
        for c0 in range(0, H, BLOCK_H):
            cc = c0 + cols
            mask = owned[:, None] & (cc < H)[None, :]
            xt = _clamp_c(_load_acc(x_rows, cc * x_col_stride, mask, ACC), c)
            mt = _clamp_c(_load_acc(m_rows, cc * m_col_stride, mask, ACC), c)
            o = tl.where(owned[:, None], s * _clamp_c(poly_value(xt, ha1, ha2, ha3, b) * mt, c), 0.0)
            out_mask = written[:, None] & (cc < H)[None, :]
            tl.store(out_rows[:, None] + cc[None, :], _to_out(o, out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit(do_not_specialize=["M"])
def _poly_norm_grouped_mul_bwd_kernel(
    go_ptr,  # [M, H] grad_out, unit column stride, rows go_row_stride apart (0 for an expand)
    go_row_stride,
    x_ptr,  # [M, H] gate, strided as in the forward
    x_row_stride,
    x_col_stride,
    m_ptr,  # [M, H] up
    m_row_stride,
    m_col_stride,
    rstd_ptr,  # [M, 3] contiguous, from the forward
    w_ptr,  # [E, 3] w~
    w_stride0,
    w_stride1,
    b_ptr,  # [E] b~
    b_stride,
    offsets_ptr,  # [E] int32 or int64
    offsets_stride,
    E,
    n_steps,
    dx_ptr,  # [M, H] contiguous, x's dtype
    dm_ptr,  # [M, H] contiguous, x's dtype
    partials_ptr,  # [M, 4] rstd's dtype: each row's [r_3 S_3, r_2 S_2, r_1 S_1, G]
    M,
    H,
    clamp: tl.float64,
    scale: tl.float64,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ONE_BLOCK: tl.constexpr,
):
    ACC = partials_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_range = rows < M
    expert = _expert_of(offsets_ptr, offsets_stride, rows, in_range, E, n_steps)
    owned = in_range & (expert < E)
    go_rows = go_ptr + rows * go_row_stride
    x_rows = x_ptr + rows * x_row_stride
    m_rows = m_ptr + rows * m_row_stride
    dx_rows = dx_ptr + rows * H
    dm_rows = dm_ptr + rows * H
    cols = tl.arange(0, BLOCK_H)
    c = tl.full([], clamp, ACC)
    s = tl.full([], scale, ACC)

    # y's coefficients first: the output clamp's indicator (20) needs y in the sums' pass.
    r3, r2, r1 = _load_rstd(rstd_ptr, rows, owned)
    w0, w1, w2 = _expert_weights(w_ptr, w_stride0, w_stride1, expert, owned, ACC)
    ha1, ha2, ha3 = forward_coeffs(w0, w1, w2, r3, r2, r1)
    b = _to_acc(tl.load(b_ptr + expert * b_stride, mask=owned, other=0.0), ACC)[:, None]

    # S_1, S_2, S_3 and G of g (MATH.md (4), (21)), in one pass.
    if ONE_BLOCK:
        mask = owned[:, None] & (cols < H)[None, :]
        go = _load_acc(go_rows, cols, mask, ACC)
        xr = _load_acc(x_rows, cols * x_col_stride, mask, ACC)
        mr = _load_acc(m_rows, cols * m_col_stride, mask, ACC)
        xc, y, q, g = _mul_grad_tile(go, xr, mr, ha1, ha2, ha3, b, c, s)
        s1, s2, s3, sg = row_grad_sums(xc, g)
    else:
        a1 = tl.zeros([BLOCK_M, BLOCK_H], ACC)
        a2 = tl.zeros([BLOCK_M, BLOCK_H], ACC)
        a3 = tl.zeros([BLOCK_M, BLOCK_H], ACC)
        ag = tl.zeros([BLOCK_M, BLOCK_H], ACC)
        for c0 in range(0, H, BLOCK_H):
            cc = c0 + cols
            mask = owned[:, None] & (cc < H)[None, :]
            got = _load_acc(go_rows, cc, mask, ACC)
            xt = _load_acc(x_rows, cc * x_col_stride, mask, ACC)
            mt = _load_acc(m_rows, cc * m_col_stride, mask, ACC)
            xct, _yt, _qt, gt = _mul_grad_tile(got, xt, mt, ha1, ha2, ha3, b, c, s)
            a1, a2, a3, ag = add_row_grad_sums(a1, a2, a3, ag, xct, gt)
        s1, s2, s3, sg = tl.sum(a1, axis=1), tl.sum(a2, axis=1), tl.sum(a3, axis=1), tl.sum(ag, axis=1)

    inv_h = inv_h_of(H, ACC)
    part_rows = partials_ptr + rows * 4  # this row's share of its expert's [dw~0, dw~1, dw~2, db~] (22)
    tl.store(part_rows + 0, r3 * s3, mask=in_range)
    tl.store(part_rows + 1, r2 * s2, mask=in_range)
    tl.store(part_rows + 2, r1 * s1, mask=in_range)
    tl.store(part_rows + 3, sg, mask=in_range)

    k1, k2, k3, d1, d2, d3 = backward_coeffs(w0, w1, w2, r3, r2, r1, s1, s2, s3, inv_h)
    if ONE_BLOCK:
        out_mask = in_range[:, None] & (cols < H)[None, :]
        dx = tl.where(owned[:, None] & ~_clamped(xr, c), grad_x_value(xc, g, k1, k2, k3, d1, d2, d3), 0.0)
        dm = tl.where(owned[:, None] & ~_clamped(mr, c), q * y, 0.0)
        tl.store(dx_rows[:, None] + cols[None, :], _to_out(dx, dx_ptr.dtype.element_ty), mask=out_mask)
        tl.store(dm_rows[:, None] + cols[None, :], _to_out(dm, dm_ptr.dtype.element_ty), mask=out_mask)
    else:
        for c0 in range(0, H, BLOCK_H):
            cc = c0 + cols
            mask = owned[:, None] & (cc < H)[None, :]
            got = _load_acc(go_rows, cc, mask, ACC)
            xt = _load_acc(x_rows, cc * x_col_stride, mask, ACC)
            mt = _load_acc(m_rows, cc * m_col_stride, mask, ACC)
            xct, yt, qt, gt = _mul_grad_tile(got, xt, mt, ha1, ha2, ha3, b, c, s)
            out_mask = in_range[:, None] & (cc < H)[None, :]
            dx = tl.where(owned[:, None] & ~_clamped(xt, c), grad_x_value(xct, gt, k1, k2, k3, d1, d2, d3), 0.0)
            dm = tl.where(owned[:, None] & ~_clamped(mt, c), qt * yt, 0.0)
            tl.store(dx_rows[:, None] + cc[None, :], _to_out(dx, dx_ptr.dtype.element_ty), mask=out_mask)
            tl.store(dm_rows[:, None] + cc[None, :], _to_out(dm, dm_ptr.dtype.element_ty), mask=out_mask)


def _as_strided_rows(t: Tensor) -> tuple[Tensor, int, int, int, int]:
    """(tensor, M, H, row_stride, col_stride): element (row, j) at ``row * row_stride + j * col_stride``.

    The tensor itself when its leading dims collapse into one row stride, whatever its
    last-dim stride (a ``gate_up.chunk(2, -1)`` half, or ``gate_up[..., 0::2]``); else a
    contiguous copy, the one documented copy.
    """
    H = t.shape[-1]
    M = t.numel() // H if H else 0
    if t.is_contiguous():
        return t, M, H, H, 1
    col_stride = t.stride(-1) if H > 1 else 1
    row_stride, expected, ok = H * col_stride, -1, True
    for d in range(t.dim() - 2, -1, -1):
        if t.shape[d] == 1:
            continue
        if expected < 0:
            row_stride = t.stride(d)
        elif t.stride(d) != expected:
            ok = False
            break
        expected = t.stride(d) * t.shape[d]
    if ok:
        return t, M, H, row_stride, col_stride
    return t.contiguous(), M, H, H, 1


def _clamp_arg(hidden_clamp) -> float:
    return float("inf") if hidden_clamp is None else float(hidden_clamp)


_GMFWD = "polynorm.grouped_mul_forward_triton"
_GMBWD = "polynorm.grouped_mul_backward_triton"
# The schemas of polynorm::grouped_mul_forward / grouped_mul_backward (csrc/ops.cpp).
_GMFWD_SCHEMA = (
    "(Tensor x, Tensor mul, Tensor weight, Tensor bias, Tensor offsets, float eps=1e-06, "
    "float? hidden_clamp=None, float output_scale=1.0) -> (Tensor out, Tensor rstd)"
)
_GMBWD_SCHEMA = (
    "(Tensor grad_out, Tensor x, Tensor mul, Tensor weight, Tensor bias, Tensor offsets, Tensor rstd, "
    "float? hidden_clamp=None, float output_scale=1.0) -> "
    "(Tensor grad_x, Tensor grad_mul, Tensor grad_weight, Tensor grad_bias)"
)


@_op("polynorm::grouped_mul_forward_triton", mutates_args=(), schema=_GMFWD_SCHEMA)
def poly_norm_grouped_mul_forward_triton(
    x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, offsets: Tensor, eps: float = 1e-6,
    hidden_clamp: float | None = None, output_scale: float = 1.0,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Grouped fused-mul PolyNorm forward in Triton (docs/MATH.md (16), (18)-(19)), the schema of
    ``polynorm::grouped_mul_forward``: for a row of expert e,
    ``out = round(output_scale * clamp_c(PolyNorm_e(clamp_c(x)) * clamp_c(mul)))`` with
    weight[e] and bias[e] as PolyNorm's coefficients (w~, b~: any sigmoid or bias clamp is
    applied by the caller) and ``c = hidden_clamp`` (None: no clamp).

    Args:
        x, mul: ``(..., H)`` of one float dtype, rows sorted by expert; each read in place
            when its leading dims collapse into one row stride, whatever its last-dim stride.
        weight ``[E, 3]``, bias ``[E]`` or ``[E, 1]``, offsets ``[E]``, eps: as
            ``grouped_forward_triton``.
        hidden_clamp: None or > 0. output_scale: finite.

    Returns:
        out: x's shape and dtype, contiguous (0 on rows of no expert). rstd: ``(M, 3)`` of
        x~ = clamp_c(x), fp32 (fp64 for fp64 x).

    Raises:
        TypeError, ValueError, RuntimeError: naming ``polynorm.grouped_mul_forward_triton``.
    """
    eps = check_grouped_mul_forward_args(_GMFWD, x, mul, weight, bias, offsets, eps, hidden_clamp, None, output_scale)
    _check_runs_here(_GMFWD, x)
    x_rows, M, H, x_rs, x_cs = _as_strided_rows(x)
    m_rows, _, _, m_rs, m_cs = _as_strided_rows(mul)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = torch.empty((M, 3), dtype=_acc_dtype(x.dtype), device=x.device)
    if M == 0:
        return out, rstd
    E = weight.shape[0]
    block_m, block_h, one_block, num_warps = _launch_config(H, x.dtype, "forward")
    if _launchable(x_rows, m_rows, weight, bias, offsets):
        with _on_device_of(x):
            wrap_triton(_poly_norm_grouped_mul_fwd_kernel)[((M + block_m - 1) // block_m,)](
                x_rows, x_rs, x_cs, m_rows, m_rs, m_cs, out, H, rstd, weight, weight.stride(0), weight.stride(1),
                bias, bias.stride(0), offsets, offsets.stride(0), E, _search_steps(E),
                offsets, 0, 0, 1, offsets, 0, 0,  # no token-major lookup
                M, H, eps, _clamp_arg(hidden_clamp), float(output_scale),
                BLOCK_M=block_m, BLOCK_H=block_h, ONE_BLOCK=one_block, TOPK=False, HAS_MAP=False, num_warps=num_warps,
            )  # fmt: skip
    return out, rstd


@_op("polynorm::grouped_mul_backward_triton", mutates_args=(), schema=_GMBWD_SCHEMA)
def poly_norm_grouped_mul_backward_triton(
    grad_out: Tensor, x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, offsets: Tensor, rstd: Tensor,
    hidden_clamp: float | None = None, output_scale: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """Grouped fused-mul PolyNorm backward in Triton (docs/MATH.md (20)-(22)), the schema of
    ``polynorm::grouped_mul_backward``.

    Returns:
        grad_x and grad_mul: x's shape and dtype, contiguous; 0 where the hidden clamp moved
        the input, and on rows of no expert. grad_weight ``[E, 3]`` and grad_bias ``[E]``:
        the gradients of the coefficients w~ and b~, each expert's summed over its rows in
        fp32 (fp64 for fp64 x) in an order that depends only on its row count.

    Raises:
        RuntimeError: as the forward; grad_out not of x's shape, dtype and device; rstd not
            ``(M, 3)`` of the accumulation dtype.
    """
    check_grouped_mul_backward_args(_GMBWD, grad_out, x, mul, weight, bias, offsets, rstd)
    check_grouped_mul_options(_GMBWD, hidden_clamp, None, output_scale)
    _check_runs_here(_GMBWD, x)
    acc = _acc_dtype(x.dtype)
    x_rows, M, H, x_rs, x_cs = _as_strided_rows(x)
    m_rows, _, _, m_rs, m_cs = _as_strided_rows(mul)
    go_rows, _, _, go_rs = _as_rows(grad_out)
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grad_mul = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    E = weight.shape[0]
    if M == 0:
        return grad_x, grad_mul, x.new_zeros((E, 3), dtype=acc), x.new_zeros((E,), dtype=acc)
    rstd_c = rstd.contiguous()  # [M, 3]: at most a small copy
    grad_weight = x.new_empty((E, 3), dtype=acc)
    grad_bias = x.new_empty((E,), dtype=acc)
    partials = x.new_empty((M, 4), dtype=acc)
    block_m, block_h, one_block, num_warps = _launch_config(H, x.dtype, "backward")
    if _launchable(x_rows, m_rows, go_rows, weight, bias, offsets, rstd_c):
        with _on_device_of(x):
            wrap_triton(_poly_norm_grouped_mul_bwd_kernel)[((M + block_m - 1) // block_m,)](
                go_rows, go_rs, x_rows, x_rs, x_cs, m_rows, m_rs, m_cs, rstd_c,
                weight, weight.stride(0), weight.stride(1), bias, bias.stride(0), offsets, offsets.stride(0),
                E, _search_steps(E), grad_x, grad_mul, partials, M, H,
                _clamp_arg(hidden_clamp), float(output_scale),
                BLOCK_M=block_m, BLOCK_H=block_h, ONE_BLOCK=one_block, num_warps=num_warps,
            )  # fmt: skip
            wrap_triton(_poly_norm_grouped_param_kernel)[(E,)](
                partials, offsets, offsets.stride(0), M, grad_weight, grad_bias, BLOCK_R=_PARAM_BLOCK_R, num_warps=4
            )
    return grad_x, grad_mul, grad_weight, grad_bias


_GMTOPK = "polynorm.grouped_mul_topk_forward_triton"
# The schema of polynorm::grouped_mul_topk_forward (csrc/ops.cpp).
_GMTOPK_SCHEMA = (
    "(Tensor x, Tensor mul, Tensor weight, Tensor bias, Tensor topk_ids, Tensor? expert_map, float eps, "
    "float? hidden_clamp, float output_scale, Tensor(a!) out) -> ()"
)


@_op("polynorm::grouped_mul_topk_forward_triton", mutates_args=("out",), schema=_GMTOPK_SCHEMA)
def poly_norm_grouped_mul_topk_forward_triton(
    x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, topk_ids: Tensor, expert_map: Tensor | None,
    eps: float, hidden_clamp: float | None, output_scale: float, out: Tensor,
) -> None:  # fmt: skip
    """Motif-3's MoE activation in the token-major layout of a fused-MoE (docs/MATH.md (16)-(19)),
    forward only, in Triton: row r of x and mul (T * K rows) is token ``r // K``'s slot ``r % K``,
    whose local expert is ``expert_map[topk_ids[r // K, r % K]]`` (the id itself without a map).
    Each row with a local expert in ``[0, E)`` gets ``out = round(output_scale *
    clamp_c(PolyNorm_e(clamp_c(x)) * clamp_c(mul)))`` with weight[e], bias[e] as PolyNorm's
    coefficients; a row whose map entry is -1 (an expert of another rank), or whose id is
    outside the map, is neither read nor written: out keeps what it held.

    Args:
        x, mul: ``(..., H)``, T * K rows, any strides as in ``grouped_mul_forward_triton``.
        weight ``[E, 3]``, bias ``[E]`` or ``[E, 1]``: the local experts' coefficients.
        topk_ids: ``[T, K]`` int32 or int64, global expert ids.
        expert_map: None, or ``[global E]`` int32 or int64: each global expert's local index,
            -1 where it is not local.
        eps, hidden_clamp, output_scale: as in ``grouped_mul_forward_triton``.
        out: x's shape and dtype, unit last-dim stride and one row stride: written in place.
    """
    eps = check_grouped_mul_topk_args(
        _GMTOPK, x, mul, weight, bias, topk_ids, expert_map, eps, hidden_clamp, output_scale, out
    )
    _check_runs_here(_GMTOPK, x)
    x_rows, M, H, x_rs, x_cs = _as_strided_rows(x)
    m_rows, _, _, m_rs, m_cs = _as_strided_rows(mul)
    out_rows, _, _, out_rs = _as_rows(out)
    if out_rows is not out:
        raise RuntimeError(
            f"{_GMTOPK}: expected out with a unit last-dim stride and one row stride (it is written in place), "
            f"got strides {list(out.stride())}"
        )
    if M == 0:
        return
    E = weight.shape[0]
    block_m, block_h, one_block, num_warps = _launch_config(H, x.dtype, "forward")
    rstd = torch.empty((0,), dtype=_acc_dtype(x.dtype), device=x.device)  # the accumulation dtype; not written
    has_map = expert_map is not None
    emap = expert_map if has_map else topk_ids
    n_ids = expert_map.shape[0] if has_map else E
    if _launchable(x_rows, m_rows, out, weight, bias, topk_ids, emap):
        with _on_device_of(x):
            wrap_triton(_poly_norm_grouped_mul_fwd_kernel)[((M + block_m - 1) // block_m,)](
                x_rows, x_rs, x_cs, m_rows, m_rs, m_cs, out, out_rs, rstd, weight, weight.stride(0), weight.stride(1),
                bias, bias.stride(0), topk_ids, 0, E, 0,
                topk_ids, topk_ids.stride(0), topk_ids.stride(1), topk_ids.shape[1], emap, emap.stride(0), n_ids,
                M, H, eps, _clamp_arg(hidden_clamp), float(output_scale),
                BLOCK_M=block_m, BLOCK_H=block_h, ONE_BLOCK=one_block, TOPK=True, HAS_MAP=has_map, num_warps=num_warps,
            )  # fmt: skip


# ----------------------------------------------------------------------------------------
# FP8 output: e4m3 with one fp32 scale per 1 x 128 group along the row (docs/MATH.md (24)-(26))
# ----------------------------------------------------------------------------------------

_FP8_GROUP = 128  # columns per scale: DeepGEMM's 1 x 128 activation groups
_E4M3_MAX = tl.constexpr(448.0)  # the largest finite e4m3 value
_FP8_SCALE_FLOOR = tl.constexpr(1e-10)  # an all-zero group's amax: the scale stays a normal fp32 number


@triton.jit
def _e4m3_by_hand(v):
    # v (fp32, |v| <= 448 or NaN) rounded to nearest even as e4m3fn, by its bits: Triton's
    # interpreter (3.x) converts to fp8 with a wrong carry across binades. Normal codes drop 20
    # mantissa bits with the carry (exponent bias 127 - 7: 120 << 3); below 2^-6 the code is
    # |v| / 2^-9 rounded to nearest even (the 2^23 trick: exact for values below 2^22).
    a = tl.abs(tl.where(v != v, 0.0, v))
    bits = a.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20).to(tl.int32) - 960
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)
    code = tl.where(a < 0.015625, sub, normal)
    code = tl.where(v != v, 0x7F, code)
    code = code | ((v.to(tl.uint32, bitcast=True) >> 31).to(tl.int32) << 7)
    return code.to(tl.uint8).to(tl.float8e4nv, bitcast=True)


@triton.jit
def _to_e4m3(v):
    # MATH.md (26): v rounded to nearest even as e4m3fn (|v| <= 448 after the clamp).
    if _BF16_BY_HAND:  # under the interpreter only
        q = _e4m3_by_hand(v)
    else:
        q = v.to(tl.float8e4nv)
    return q


@triton.jit
def _pow2_ceil(s):
    # MATH.md (25): the least power of two >= s for a positive normal fp32 s, by its bits (an
    # exponent bump where any mantissa bit is set): UE8M0's scale, exact, no log2 or exp2.
    bits = s.to(tl.uint32, bitcast=True)
    exp = (bits >> 23) + ((bits & 0x7FFFFF) != 0).to(tl.uint32)
    return (exp << 23).to(tl.float32, bitcast=True)


@triton.jit(do_not_specialize=["M"])
def _poly_norm_grouped_mul_fp8_kernel(
    x_ptr,  # [M, H] gate, strided as in the forward
    x_row_stride,
    x_col_stride,
    m_ptr,  # [M, H] up (HAS_MUL), x's dtype
    m_row_stride,
    m_col_stride,
    q_ptr,  # [M, H] e4m3fn, contiguous
    scale_ptr,  # fp32 [G, M] (column-major [M, G]); UE8M0_PACKED: int32 [ceil(G / 4), M]
    w_ptr,  # [E, 3] w~
    w_stride0,
    w_stride1,
    b_ptr,  # [E] b~
    b_stride,
    offsets_ptr,  # [E] int32 or int64
    offsets_stride,
    E,
    n_steps,
    M,
    H,
    eps: tl.float64,
    clamp: tl.float64,
    scale: tl.float64,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,  # the forward's statistics tiling, so that v has the forward's bits
    ONE_BLOCK: tl.constexpr,
    GROUP: tl.constexpr,  # 128
    HAS_MUL: tl.constexpr,
    UE8M0: tl.constexpr,  # power-of-two scales
    UE8M0_PACKED: tl.constexpr,  # their exponent bytes, 4 groups an int32 (DeepGEMM's packed SFA)
):
    ACC = tl.float32
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_range = rows < M
    expert = _expert_of(offsets_ptr, offsets_stride, rows, in_range, E, n_steps)
    owned = in_range & (expert < E)
    x_rows = x_ptr + rows * x_row_stride
    m_rows = m_ptr + rows * m_row_stride
    cols = tl.arange(0, BLOCK_H)
    c = tl.full([], clamp, ACC)
    s = tl.full([], scale, ACC)

    # Statistics of x~ exactly as _poly_norm_grouped_mul_fwd_kernel forms them.
    if ONE_BLOCK:
        mask = owned[:, None] & (cols < H)[None, :]
        s1, s2, s3 = row_sums(_clamp_c(_load_acc(x_rows, cols * x_col_stride, mask, ACC), c))
    else:
        s1, s2, s3 = _clamped_row_sums_looped(x_rows, x_col_stride, cols, owned, H, c, ACC, BLOCK_M, BLOCK_H)
    r1, r2, r3 = _owned_rstd(s1, s2, s3, owned, H, eps, ACC, BLOCK_M)
    w0, w1, w2 = _expert_weights(w_ptr, w_stride0, w_stride1, expert, owned, ACC)
    ha1, ha2, ha3 = forward_coeffs(w0, w1, w2, r3, r2, r1)
    b = _to_acc(tl.load(b_ptr + expert * b_stride, mask=owned, other=0.0), ACC)[:, None]

    # Per group of GROUP columns: v = the activation rounded to x's dtype (MATH.md (24)), its
    # scale (25) and e4m3 codes (26). Rows of no expert: v = 0, so q = 0 and the floor scale.
    gcols = tl.arange(0, GROUP)
    n_groups = tl.cdiv(H, GROUP)
    word = tl.zeros([BLOCK_M], tl.int32)
    for g in range(0, n_groups):
        cc = g * GROUP + gcols
        mask = owned[:, None] & (cc < H)[None, :]
        xt = _clamp_c(_load_acc(x_rows, cc * x_col_stride, mask, ACC), c)
        y = poly_value(xt, ha1, ha2, ha3, b)
        if HAS_MUL:
            y = s * _clamp_c(y * _clamp_c(_load_acc(m_rows, cc * m_col_stride, mask, ACC), c), c)
        v = tl.where(mask, _to_out(y, x_ptr.dtype.element_ty).to(ACC), 0.0)
        amax = tl.maximum(tl.max(tl.abs(v), axis=1), _FP8_SCALE_FLOOR)
        sc = tl.div_rn(amax, tl.full([], _E4M3_MAX, ACC))
        if UE8M0:
            sc = _pow2_ceil(sc)
        qv = tl.minimum(tl.maximum(tl.div_rn(v, sc[:, None]), -_E4M3_MAX), _E4M3_MAX)
        qv = tl.where(v != v, v, qv)  # a NaN stays NaN (min/max would drop it)
        q_mask = in_range[:, None] & (cc < H)[None, :]
        tl.store(q_ptr + rows[:, None] * H + cc[None, :], _to_e4m3(qv), mask=q_mask)
        if UE8M0_PACKED:
            # The exponent byte of a power of two is its UE8M0 code; 4 groups an int32, little-endian.
            byte = ((sc.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32)
            word = word | (byte << (8 * (g % 4)))
            if (g % 4 == 3) | (g == n_groups - 1):
                tl.store(scale_ptr + (g // 4) * M + rows, word, mask=in_range)
                word = tl.zeros([BLOCK_M], tl.int32)
        else:
            tl.store(scale_ptr + g * M + rows, sc, mask=in_range)


_GMFP8 = "polynorm.grouped_mul_forward_fp8_triton"
_GMFP8_SCHEMA = (
    "(Tensor x, Tensor? mul, Tensor weight, Tensor bias, Tensor offsets, float eps=1e-06, float? hidden_clamp=None, "
    "float output_scale=1.0, str scale_format='fp32') -> (Tensor out, Tensor scale)"
)
_SCALE_FORMATS = ("fp32", "ue8m0", "ue8m0_packed")


@_op("polynorm::grouped_mul_forward_fp8_triton", mutates_args=(), schema=_GMFP8_SCHEMA)
def poly_norm_grouped_mul_forward_fp8_triton(
    x: Tensor, mul: Tensor | None, weight: Tensor, bias: Tensor, offsets: Tensor, eps: float = 1e-6,
    hidden_clamp: float | None = None, output_scale: float = 1.0, scale_format: str = "fp32",
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The grouped (fused-mul) PolyNorm forward with an FP8 output, in Triton (docs/MATH.md (24)-(26)):
    the activation v, rounded to x's dtype as the bf16 path writes it, quantised to e4m3fn with one
    fp32 scale per group of 128 columns of a row: ``scale = max(amax|v|, 1e-10) / 448`` (rounded up
    to a power of two for ``"ue8m0"`` and ``"ue8m0_packed"``), ``q = e4m3(clamp(v / scale, ±448))``.

    Args:
        x, weight, bias, offsets, eps, hidden_clamp, output_scale: as ``grouped_mul_forward_triton``;
            x float16 or bfloat16 (or float32).
        mul: as there, or None for grouped PolyNorm alone (no clamp of the product, no scale).
        scale_format: ``"fp32"``, ``"ue8m0"`` (fp32 powers of two) or ``"ue8m0_packed"``.

    Returns:
        out: ``(M, H)`` float8_e4m3fn, contiguous. scale: ``"fp32"``/``"ue8m0"``: fp32 ``(M, G)``,
        G = ceil(H / 128), column-major (a transposed view of a contiguous ``(G, M)``: the
        M-major layout DeepGEMM reads); ``"ue8m0_packed"``: int32 ``(M, ceil(G / 4))``, M-major
        likewise, each word 4 groups' exponent bytes, little-endian. Rows of no expert: q = 0.
    """
    op = _GMFP8
    if mul is None:
        check_grouped_forward_args(op, x, weight, bias, offsets, eps)
        check_grouped_mul_options(op, hidden_clamp, None, output_scale)
        if output_scale != 1.0:  # it scales the product with mul, and there is none
            raise ValueError(f"{op}: expected output_scale 1.0 with mul None, got {output_scale!r}")
    else:
        check_grouped_mul_forward_args(op, x, mul, weight, bias, offsets, eps, hidden_clamp, None, output_scale)
    if x.dtype == torch.float64:
        raise RuntimeError(f"{op}: expected x to be float16, bfloat16 or float32 (an FP8 output), got {x.dtype}")
    if scale_format not in _SCALE_FORMATS:
        raise ValueError(f"{op}: expected scale_format to be one of {', '.join(_SCALE_FORMATS)}, got {scale_format!r}")
    _check_runs_here(op, x)
    x_rows, M, H, x_rs, x_cs = _as_strided_rows(x)
    m_rows, _, _, m_rs, m_cs = _as_strided_rows(mul) if mul is not None else (x_rows, M, H, x_rs, x_cs)
    G = (H + _FP8_GROUP - 1) // _FP8_GROUP
    q = torch.empty((M, H), dtype=torch.float8_e4m3fn, device=x.device)
    packed = scale_format == "ue8m0_packed"
    if packed:
        scale_t = torch.empty(((G + 3) // 4, M), dtype=torch.int32, device=x.device)
    else:
        scale_t = torch.empty((G, M), dtype=torch.float32, device=x.device)
    if M == 0:
        return q, scale_t.t()
    E = weight.shape[0]
    block_m, block_h, one_block, num_warps = _launch_config(H, x.dtype, "forward")
    if _launchable(x_rows, m_rows, weight, bias, offsets):
        with _on_device_of(x):
            wrap_triton(_poly_norm_grouped_mul_fp8_kernel)[((M + block_m - 1) // block_m,)](
                x_rows, x_rs, x_cs, m_rows, m_rs, m_cs, q, scale_t, weight, weight.stride(0), weight.stride(1),
                bias, bias.stride(0), offsets, offsets.stride(0), E, _search_steps(E), M, H, eps,
                _clamp_arg(hidden_clamp), float(output_scale),
                BLOCK_M=block_m, BLOCK_H=block_h, ONE_BLOCK=one_block, GROUP=_FP8_GROUP, HAS_MUL=mul is not None,
                UE8M0=scale_format != "fp32", UE8M0_PACKED=packed, num_warps=num_warps,
            )  # fmt: skip
    return q, scale_t.t()
