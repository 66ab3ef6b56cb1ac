"""Triton kernels of the sharded passes (tensor parallelism, ``docs/MATH.md`` (12)-(15)):
``torch.ops.polynorm.sharded_forward_stats_triton``, ``sharded_forward_apply_triton``,
``sharded_backward_stats_triton`` and ``sharded_backward_apply_triton``, with the schemas of the
C++ ops ``polynorm::sharded_*`` (``csrc/ops.cpp``).

x ``(..., H_shard)`` holds a shard of each row's columns (H_shard may be 0). A statistics pass
writes each row's sums over the shard, ``[M, 3]`` in fp32 (fp64 for fp64 x); the caller sums them
over the shards (:mod:`polynorm.tp`); the apply pass finishes the shard's columns from the summed
sums and the unsharded hidden size. Every formula is :mod:`polynorm.triton_math`'s, and the row
loops, loads and rounding are :mod:`polynorm.triton_kernels`' helpers.

Launch geometry depends on H_shard and the dtype only, never on M: a program takes a
``[BLOCK_M, BLOCK_H]`` tile of _TILE elements (several rows when H_shard is short) and walks the
row in column blocks; both passes are memory-bound streams, so one shape serves them all.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import wrap_triton

from polynorm._common import (
    check_sharded_backward_apply_args,
    check_sharded_backward_stats_args,
    check_sharded_forward_apply_args,
    check_sharded_forward_stats_args,
)
from polynorm.triton_kernels import (
    _acc_dtype,
    _as_rows,
    _check_runs_here,
    _flat,
    _launchable,
    _load_acc,
    _load_grad,
    _load_rstd,
    _on_device_of,
    _op,
    _row_grad_sums_looped,
    _row_sums_looped,
    _store_rstd,
    _to_acc,
    _to_out,
)
from polynorm.triton_math import backward_coeffs, forward_coeffs, grad_x_value, inv_h_of, poly_value, rstd_of

__all__ = [
    "sharded_backward_apply_triton",
    "sharded_backward_stats_triton",
    "sharded_forward_apply_triton",
    "sharded_forward_stats_triton",
]


@triton.jit
def _load_sums(sums_ptr, rows, mask):
    # The three sums of each row of a [M, 3] contiguous buffer; 0 where mask is off.
    s_rows = sums_ptr + rows * 3
    return (tl.load(s_rows + 0, mask=mask, other=0.0), tl.load(s_rows + 1, mask=mask, other=0.0),
            tl.load(s_rows + 2, mask=mask, other=0.0))  # fmt: skip


@triton.jit
def _load_params(w_ptr, w_stride, b_ptr, ACC: tl.constexpr):
    # [w0, w1, w2] and b in ACC, read on the device: no host synchronisation.
    w0 = _to_acc(tl.load(w_ptr), ACC)
    w1 = _to_acc(tl.load(w_ptr + w_stride), ACC)
    w2 = _to_acc(tl.load(w_ptr + 2 * w_stride), ACC)
    return w0, w1, w2, _to_acc(tl.load(b_ptr), ACC)


# M is never specialised: a row's bits must not depend on the batch size.
@triton.jit(do_not_specialize=["M"])
def _sharded_fwd_stats_kernel(
    x_ptr,  # [M, H_shard], unit column stride, rows x_row_stride apart
    x_row_stride,
    sums_ptr,  # [M, 3] fp32 (fp64 for fp64 x): this shard's sum x^2, x^4, x^6
    M,
    H,  # H_shard
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    ACC = sums_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    cols = tl.arange(0, BLOCK_H)
    # MATH.md (12): the shard's sums, in one pass.
    s1, s2, s3 = _row_sums_looped(x_ptr + rows * x_row_stride, cols, row_mask, H, ACC, BLOCK_M, BLOCK_H)
    out = sums_ptr + rows * 3
    tl.store(out + 0, s1, mask=row_mask)
    tl.store(out + 1, s2, mask=row_mask)
    tl.store(out + 2, s3, mask=row_mask)


@triton.jit(do_not_specialize=["M"])
def _sharded_fwd_apply_kernel(
    x_ptr,  # [M, H_shard], rows x_row_stride apart
    x_row_stride,
    mul_ptr,  # [M, H_shard] when HAS_MUL, rows mul_row_stride apart; else unread
    mul_row_stride,
    sums_ptr,  # [M, 3] the sums over every shard
    y_ptr,  # [M, H_shard] contiguous, x's dtype: y, or y * mul
    rstd_ptr,  # [M, 3] sums' dtype: r_3, r_2, r_1
    w_ptr,  # (3,) any float dtype, elements w_stride apart
    w_stride,
    b_ptr,  # (1,) any float dtype
    M,
    H,  # H_shard
    hidden_size,  # the unsharded H
    eps: tl.float64,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_MUL: tl.constexpr,
):
    ACC = rstd_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    s1, s2, s3 = _load_sums(sums_ptr, rows, row_mask)
    # MATH.md (1)-(2) with the unsharded H.
    inv_h = inv_h_of(hidden_size, ACC)
    e = tl.full([], eps, ACC)
    r1 = rstd_of(s1, inv_h, e)
    r2 = rstd_of(s2, inv_h, e)
    r3 = rstd_of(s3, inv_h, e)
    _store_rstd(rstd_ptr, rows, r3, r2, r1, row_mask)
    w0, w1, w2, b = _load_params(w_ptr, w_stride, b_ptr, ACC)
    a1, a2, a3 = forward_coeffs(w0, w1, w2, r3, r2, r1)
    x_rows = x_ptr + rows * x_row_stride
    mul_rows = mul_ptr + rows * mul_row_stride
    y_rows = y_ptr + rows * H
    cols = tl.arange(0, BLOCK_H)
    for c0 in range(0, H, BLOCK_H):  # MATH.md (3); (8) with HAS_MUL
        c = c0 + cols
        mask = row_mask[:, None] & (c < H)[None, :]
        y = poly_value(_load_acc(x_rows, c, mask, ACC), a1, a2, a3, b)
        if HAS_MUL:
            y = y * _load_acc(mul_rows, c, mask, ACC)
        tl.store(y_rows[:, None] + c[None, :], _to_out(y, y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M"])
def _sharded_bwd_stats_kernel(
    g_ptr,  # [M, H_shard] grad_out, rows g_row_stride apart
    g_row_stride,
    mul_ptr,  # [M, H_shard] when HAS_MUL; else unread
    mul_row_stride,
    x_ptr,  # [M, H_shard], rows x_row_stride apart
    x_row_stride,
    rstd_ptr,  # [M, 3] contiguous: r_3, r_2, r_1
    sums_ptr,  # [M, 3] rstd's dtype: this shard's S_1, S_2, S_3
    terms_ptr,  # [M, 4] rstd's dtype: this shard's [r_3 S_3, r_2 S_2, r_1 S_1, G] a row
    M,
    H,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_MUL: tl.constexpr,
):
    ACC = sums_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    cols = tl.arange(0, BLOCK_H)
    # MATH.md (13): the shard's S_1, S_2, S_3 and G (g = grad_out * mul with HAS_MUL: (9)).
    s1, s2, s3, sg = _row_grad_sums_looped(
        g_ptr + rows * g_row_stride, mul_ptr + rows * mul_row_stride, x_ptr + rows * x_row_stride,
        cols, row_mask, H, ACC, BLOCK_M, BLOCK_H, HAS_MUL,
    )  # fmt: skip
    out = sums_ptr + rows * 3
    tl.store(out + 0, s1, mask=row_mask)
    tl.store(out + 1, s2, mask=row_mask)
    tl.store(out + 2, s3, mask=row_mask)
    r3, r2, r1 = _load_rstd(rstd_ptr, rows, row_mask)
    terms = terms_ptr + rows * 4  # MATH.md (14)
    tl.store(terms + 0, r3 * s3, mask=row_mask)
    tl.store(terms + 1, r2 * s2, mask=row_mask)
    tl.store(terms + 2, r1 * s1, mask=row_mask)
    tl.store(terms + 3, sg, mask=row_mask)


@triton.jit(do_not_specialize=["M"])
def _sharded_bwd_apply_kernel(
    g_ptr,  # [M, H_shard] grad_out
    g_row_stride,
    mul_ptr,  # [M, H_shard] when HAS_MUL; else unread
    mul_row_stride,
    x_ptr,  # [M, H_shard]
    x_row_stride,
    rstd_ptr,  # [M, 3] contiguous: r_3, r_2, r_1
    sums_ptr,  # [M, 3]: S_1, S_2, S_3 over every shard
    w_ptr,  # (3,) any float dtype
    w_stride,
    b_ptr,  # (1,) any float dtype, read when HAS_MUL (grad_mul recomputes y)
    dx_ptr,  # [M, H_shard] contiguous, x's dtype
    dmul_ptr,  # [M, H_shard] contiguous when HAS_MUL; else unwritten
    M,
    H,
    hidden_size,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_MUL: tl.constexpr,
):
    ACC = rstd_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    r3, r2, r1 = _load_rstd(rstd_ptr, rows, row_mask)
    s1, s2, s3 = _load_sums(sums_ptr, rows, row_mask)
    w0, w1, w2, b = _load_params(w_ptr, w_stride, b_ptr, ACC)
    c1, c2, c3, d1, d2, d3 = backward_coeffs(w0, w1, w2, r3, r2, r1, s1, s2, s3, inv_h_of(hidden_size, ACC))
    a1, a2, a3 = forward_coeffs(w0, w1, w2, r3, r2, r1)
    g_rows = g_ptr + rows * g_row_stride
    mul_rows = mul_ptr + rows * mul_row_stride
    x_rows = x_ptr + rows * x_row_stride
    cols = tl.arange(0, BLOCK_H)
    for c0 in range(0, H, BLOCK_H):  # MATH.md (6); (10) with HAS_MUL
        c = c0 + cols
        mask = row_mask[:, None] & (c < H)[None, :]
        xc = _load_acc(x_rows, c, mask, ACC)
        goc, gc = _load_grad(g_rows, mul_rows, c, mask, ACC, HAS_MUL)
        dx = grad_x_value(xc, gc, c1, c2, c3, d1, d2, d3)
        tl.store(dx_ptr + rows[:, None] * H + c[None, :], _to_out(dx, dx_ptr.dtype.element_ty), mask=mask)
        if HAS_MUL:
            dmul = goc * poly_value(xc, a1, a2, a3, b)
            tl.store(dmul_ptr + rows[:, None] * H + c[None, :], _to_out(dmul, dmul_ptr.dtype.element_ty), mask=mask)


# A program's tile: 4096 elements, 16 a thread at 8 warps (four 16-byte loads of bf16 in flight
# per tensor); rows shorter than that share a program, longer ones are walked in column blocks.
_TILE = 4096
_NUM_WARPS = 8


def _geometry(H: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_H) for shards of H columns: a function of H alone, never of M."""
    block_h = min(triton.next_power_of_2(max(int(H), 1)), _TILE)
    return _TILE // block_h, block_h


def _shard_rows(t: Tensor, M: int) -> tuple[Tensor, int]:
    """(tensor, row_stride) for a [M, H_shard] view of t (H_shard = 0: t itself, never read)."""
    if t.shape[-1] == 0:
        return t, 0
    rows, _, _, row_stride = _as_rows(t)
    return rows, row_stride


@_op("polynorm::sharded_forward_stats_triton", mutates_args=(), schema="(Tensor x) -> Tensor")
def sharded_forward_stats_triton(x: Tensor) -> Tensor:
    """This shard's ``[sum x^2, sum x^4, sum x^6]`` a row, ``[M, 3]`` fp32 (fp64 for fp64 x): the
    Triton twin of ``torch.ops.polynorm.sharded_forward_stats`` (MATH.md (12))."""
    op = "polynorm.sharded_forward_stats_triton"
    M = check_sharded_forward_stats_args(op, x)  # the C++ op's checks, named for this op
    _check_runs_here(op, x)
    sums = x.new_empty((M, 3), dtype=_acc_dtype(x.dtype))
    x_rows, x_row_stride = _shard_rows(x, M)
    if M and _launchable(x_rows):
        if x.shape[-1] == 0:
            return sums.zero_()
        block_m, block_h = _geometry(x.shape[-1])
        with _on_device_of(x):
            wrap_triton(_sharded_fwd_stats_kernel)[(triton.cdiv(M, block_m),)](
                x_rows, x_row_stride, sums, M, x.shape[-1], BLOCK_M=block_m, BLOCK_H=block_h, num_warps=_NUM_WARPS
            )
    return sums


@_op(
    "polynorm::sharded_forward_apply_triton",
    mutates_args=(),
    schema="(Tensor x, Tensor? mul, Tensor sums, Tensor weight, Tensor bias, int hidden_size, float eps=1e-06) -> "
    "(Tensor out, Tensor rstd)",
)
def sharded_forward_apply_triton(
    x: Tensor, mul: Tensor | None, sums: Tensor, weight: Tensor, bias: Tensor, hidden_size: int, eps: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """(out, rstd) of this shard's columns from the summed sums: the Triton twin of
    ``torch.ops.polynorm.sharded_forward_apply`` (MATH.md (1)-(3), (8))."""
    op = "polynorm.sharded_forward_apply_triton"
    M = check_sharded_forward_apply_args(op, x, mul, sums, weight, bias, hidden_size, eps)
    _check_runs_here(op, x)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    rstd = x.new_empty((M, 3), dtype=_acc_dtype(x.dtype))
    sums_c = sums.contiguous()
    # An empty shard's rows are never read: sums stands in for them.
    x_rows, x_row_stride = _shard_rows(x, M) if x.shape[-1] else (sums_c, 0)
    mul_rows, mul_row_stride = _shard_rows(mul, M) if mul is not None and x.shape[-1] else (x_rows, x_row_stride)
    w, w_stride = _flat(weight)
    b, _ = _flat(bias)
    if M and _launchable(x_rows, mul_rows, sums_c, w, b):
        block_m, block_h = _geometry(x.shape[-1])
        with _on_device_of(x):
            wrap_triton(_sharded_fwd_apply_kernel)[(triton.cdiv(M, block_m),)](
                x_rows, x_row_stride, mul_rows, mul_row_stride, sums_c, out, rstd, w, w_stride, b,
                M, x.shape[-1], hidden_size, eps,
                BLOCK_M=block_m, BLOCK_H=block_h, HAS_MUL=mul is not None, num_warps=_NUM_WARPS,
            )  # fmt: skip
    return out, rstd


@_op(
    "polynorm::sharded_backward_stats_triton",
    mutates_args=(),
    schema="(Tensor grad_out, Tensor x, Tensor? mul, Tensor rstd) -> (Tensor sums, Tensor grad_weight, "
    "Tensor grad_bias)",
)
def sharded_backward_stats_triton(
    grad_out: Tensor, x: Tensor, mul: Tensor | None, rstd: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(sums, grad_weight, grad_bias): this shard's ``[S_1, S_2, S_3]`` a row and its share of the
    parameter gradients: the Triton twin of ``torch.ops.polynorm.sharded_backward_stats``
    (MATH.md (13)-(14)). The rows' shares are summed by ``torch.sum``, deterministic for a fixed M."""
    op = "polynorm.sharded_backward_stats_triton"
    M = check_sharded_backward_stats_args(op, grad_out, x, mul, rstd)
    _check_runs_here(op, x)
    acc = _acc_dtype(x.dtype)
    sums = x.new_empty((M, 3), dtype=acc)
    terms = x.new_empty((M, 4), dtype=acc)
    rstd_c = rstd.contiguous()
    H = x.shape[-1]
    x_rows, x_row_stride = _shard_rows(x, M) if H else (rstd_c, 0)
    g_rows, g_row_stride = _shard_rows(grad_out, M) if H else (rstd_c, 0)
    mul_rows, mul_row_stride = _shard_rows(mul, M) if mul is not None and H else (g_rows, g_row_stride)
    if M and _launchable(x_rows, g_rows, mul_rows, rstd_c):
        block_m, block_h = _geometry(H)
        with _on_device_of(x):
            wrap_triton(_sharded_bwd_stats_kernel)[(triton.cdiv(M, block_m),)](
                g_rows, g_row_stride, mul_rows, mul_row_stride, x_rows, x_row_stride, rstd_c, sums, terms, M, H,
                BLOCK_M=block_m, BLOCK_H=block_h, HAS_MUL=mul is not None, num_warps=_NUM_WARPS,
            )  # fmt: skip
    return sums, terms[:, :3].sum(0), terms[:, 3:].sum(0)


@_op(
    "polynorm::sharded_backward_apply_triton",
    mutates_args=(),
    schema="(Tensor grad_out, Tensor x, Tensor? mul, Tensor weight, Tensor bias, Tensor rstd, Tensor sums, "
    "int hidden_size) -> (Tensor grad_x, Tensor grad_mul)",
)
def sharded_backward_apply_triton(
    grad_out: Tensor, x: Tensor, mul: Tensor | None, weight: Tensor, bias: Tensor, rstd: Tensor, sums: Tensor,
    hidden_size: int,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(grad_x, grad_mul) of this shard's columns from the summed sums (grad_mul of 0 elements
    without mul): the Triton twin of ``torch.ops.polynorm.sharded_backward_apply`` (MATH.md (6), (10))."""
    op = "polynorm.sharded_backward_apply_triton"
    M = check_sharded_backward_apply_args(op, grad_out, x, mul, weight, bias, rstd, sums, hidden_size)
    _check_runs_here(op, x)
    grad_x = torch.empty_like(x, memory_format=torch.contiguous_format)
    grad_mul = torch.empty_like(x, memory_format=torch.contiguous_format) if mul is not None else x.new_empty(0)
    rstd_c, sums_c = rstd.contiguous(), sums.contiguous()
    H = x.shape[-1]
    x_rows, x_row_stride = _shard_rows(x, M) if H else (rstd_c, 0)
    g_rows, g_row_stride = _shard_rows(grad_out, M) if H else (rstd_c, 0)
    mul_rows, mul_row_stride = _shard_rows(mul, M) if mul is not None and H else (g_rows, g_row_stride)
    w, w_stride = _flat(weight)
    b, _ = _flat(bias)
    if M and H and _launchable(x_rows, g_rows, mul_rows, rstd_c, sums_c, w, b):
        block_m, block_h = _geometry(H)
        with _on_device_of(x):
            wrap_triton(_sharded_bwd_apply_kernel)[(triton.cdiv(M, block_m),)](
                g_rows, g_row_stride, mul_rows, mul_row_stride, x_rows, x_row_stride, rstd_c, sums_c, w, w_stride,
                b, grad_x, grad_mul if mul is not None else grad_x, M, H, hidden_size,
                BLOCK_M=block_m, BLOCK_H=block_h, HAS_MUL=mul is not None, num_warps=_NUM_WARPS,
            )  # fmt: skip
    return grad_x, grad_mul
