"""Triton kernels for PolyNorm: ``torch.ops.polynorm.forward_triton`` and ``backward_triton``,
and for the fused PolyNorm x mul: ``mul_forward_triton`` and ``mul_backward_triton``.

PolyNorm (Zhuo et al., "Polynomial Composition Activations: Unleashing the Dynamics of
Large Language Models", arXiv:2411.03884), per row x of length H, with the equations of
``docs/MATH.md`` (each written once, in :mod:`polynorm.triton_math`)::

    r_p = 1 / sqrt(mean(x^(2p)) + eps)                      p = 1, 2, 3         (1)-(2)
    y   = x * (w2 r_1 + x * (w1 r_2 + x * w0 r_3)) + b      (Horner form)       (3)

Closed-form backward, with S_p = sum_j g_j x_j^p and G = sum_j g_j (4)::

    c_p = w(p) p r_p,   d_p = c_p r_p^2 S_p / H             w(3) = w0, w(2) = w1, w(1) = w2   (5)
    dx  = g (c_1 + x (c_2 + x c_3)) - x (d_1 + x^2 (d_2 + x^2 d_3))                          (6)
    dw0 = sum_rows r_3 S_3,  dw1 = sum_rows r_2 S_2,  dw2 = sum_rows r_1 S_1,  db = sum_rows G  (7)

Fused PolyNorm x mul (the gated MLP's ``down(PolyNorm(gate(x)) * up(x))``), the same kernels
with the constexpr flag HAS_MUL::

    out      = y * mul                          y in fp32 (fp64), never rounded on its own  (8)
    g        = grad_out * mul                   in fp32 (fp64), never rounded: drives the   (9)
                                                backward above (dx, dw, db) unchanged
    grad_mul = grad_out * y                     y recomputed from x and rstd, in the same   (10)
                                                Horner form (the same bits) as the forward

Layout of the work
- A row that fits one block (see ``_launch_config``) is loaded once, reduced, and its
  output computed from the registers: x is read from device memory once (x and grad_y
  in backward; and mul, with HAS_MUL). Rows of small H share a program as a
  [BLOCK_M, BLOCK_H] tile. The fused op uses PolyNorm's launch configurations as they are.
- A longer row is walked twice in column blocks of BLOCK_H: a statistics pass, then an
  output pass that mostly hits L2. H has no cap.
- Everything accumulates in fp32 (fp64 for fp64 inputs): the rstd cache's dtype.
- BLOCK_M, BLOCK_H and num_warps depend on H and the dtype only, never on M, so a row's
  y and dx are bitwise the same whatever batch the row arrives in.
- dw and db: each backward program writes its rows' sums to a [programs, 4] partials
  buffer, and they are added in a fixed order (``_sum_partials``) in one of two forms of
  the same kernel (FUSED_PARAMS): eager calls launch once, and the last program to finish
  (an atomic ticket on an arrival counter) adds them; the registered ops, which
  torch.compile, export and AOTInductor trace, launch a second one-program kernel to add
  them. No atomics on the values, so the bits are the same on every run, in both forms.

- Eager calls (PolyNormTritonFunction) launch each specialisation's compiled kernel through
  its launcher directly once Triton's Python launcher has compiled it (``_launch_eager``).

With ``TRITON_INTERPRET=1`` set before this module is imported, the same kernels run on
CPU tensors in Triton's interpreter (slowly): that is how CI without a GPU tests them.
"""

import contextlib
import functools
import math
import os

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake
from torch.library import triton_op, wrap_triton

from polynorm._common import (
    check_backward_args,
    check_forward_args,
    check_mul_backward_args,
    check_mul_forward_args,
    register_autograd,
    register_mul_autograd,
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
    "poly_norm_backward_triton",
    "poly_norm_forward_triton",
    "poly_norm_mul_backward_triton",
    "poly_norm_mul_forward_triton",
]


# ----------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------


@triton.jit
def _to_acc(v, ACC: tl.constexpr):
    # fp16/bf16 widen to fp32 exactly first: some targets lack direct fp16/bf16 -> fp64.
    if v.dtype.is_fp16() or v.dtype.is_bf16():
        v = v.to(tl.float32)
    return v.to(ACC)


# Triton's interpreter (3.x) converts fp32 to bf16 by truncation (and its round-to-nearest
# option can carry into the exponent). Under the interpreter only, bf16 outputs are rounded
# by hand (to nearest even, as the GPU's conversion does), so CPU runs see the GPU's bits.
_BF16_BY_HAND = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def _to_out(v, OUT: tl.constexpr):
    # v (fp32 or fp64) rounded once to the output dtype OUT.
    if OUT == tl.bfloat16:
        v = v.to(tl.float32)
        if _BF16_BY_HAND:
            u = v.to(tl.uint32, bitcast=True)
            u = u + 0x7FFF + ((u >> 16) & 1)
            out = (u >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:
            out = v.to(tl.bfloat16)
    else:
        out = v.to(OUT)
    return out


@triton.jit
def _load_acc(rows, c, mask, ACC: tl.constexpr):
    # The [BLOCK_M, len(c)] tile at columns c of rows (per-row base pointers), in ACC.
    return _to_acc(tl.load(rows[:, None] + c[None, :], mask=mask, other=0.0), ACC)


@triton.jit
def _load_grad(g_rows, mul_rows, c, mask, ACC: tl.constexpr, HAS_MUL: tl.constexpr):
    # (grad_out, g) with g = dL/dy: grad_y itself, or grad_out * mul in ACC (never rounded)
    # when HAS_MUL.
    go = _load_acc(g_rows, c, mask, ACC)
    g = go
    if HAS_MUL:
        g = go * _load_acc(mul_rows, c, mask, ACC)
    return go, g


@triton.jit
def _row_sums_looped(x_rows, cols, row_mask, H, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr):
    # row_sums (MATH.md (1)) of rows longer than one block: column blocks of BLOCK_H, each
    # element's terms added to a running [BLOCK_M, BLOCK_H] tile, reduced once at the end.
    a1 = tl.zeros([BLOCK_M, BLOCK_H], ACC)
    a2 = tl.zeros([BLOCK_M, BLOCK_H], ACC)
    a3 = tl.zeros([BLOCK_M, BLOCK_H], ACC)
    for c0 in range(0, H, BLOCK_H):
        c = c0 + cols
        mask = row_mask[:, None] & (c < H)[None, :]
        a1, a2, a3 = add_row_sums(a1, a2, a3, _load_acc(x_rows, c, mask, ACC))
    return tl.sum(a1, axis=1), tl.sum(a2, axis=1), tl.sum(a3, axis=1)


@triton.jit
def _row_grad_sums_looped(
    g_rows, mul_rows, x_rows, cols, row_mask, H,
    ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, HAS_MUL: tl.constexpr,
):  # fmt: skip
    # row_grad_sums (MATH.md (4)) of rows longer than one block, as _row_sums_looped.
    a1 = tl.zeros([BLOCK_M, BLOCK_H], ACC)
    a2 = tl.zeros([BLOCK_M, BLOCK_H], ACC)
    a3 = tl.zeros([BLOCK_M, BLOCK_H], ACC)
    ag = tl.zeros([BLOCK_M, BLOCK_H], ACC)
    for c0 in range(0, H, BLOCK_H):
        c = c0 + cols
        mask = row_mask[:, None] & (c < H)[None, :]
        xc = _load_acc(x_rows, c, mask, ACC)
        _, gc = _load_grad(g_rows, mul_rows, c, mask, ACC, HAS_MUL)
        a1, a2, a3, ag = add_row_grad_sums(a1, a2, a3, ag, xc, gc)
    return tl.sum(a1, axis=1), tl.sum(a2, axis=1), tl.sum(a3, axis=1), tl.sum(ag, axis=1)


@triton.jit
def _store_rstd(rstd_ptr, rows, r3, r2, r1, mask):
    # The rstd cache, [M, 3] contiguous: [r_3, r_2, r_1] a row, so that column k pairs with w_k.
    rstd_rows = rstd_ptr + rows * 3
    tl.store(rstd_rows + 0, r3, mask=mask)
    tl.store(rstd_rows + 1, r2, mask=mask)
    tl.store(rstd_rows + 2, r1, mask=mask)


@triton.jit
def _load_rstd(rstd_ptr, rows, mask):
    # (r_3, r_2, r_1) of each row from the rstd cache (_store_rstd); 0 where mask is off.
    rstd_rows = rstd_ptr + rows * 3
    r3 = tl.load(rstd_rows + 0, mask=mask, other=0.0)
    r2 = tl.load(rstd_rows + 1, mask=mask, other=0.0)
    r1 = tl.load(rstd_rows + 2, mask=mask, other=0.0)
    return r3, r2, r1


# M is never specialised (Triton would compile M == 1 as a constant): the code, and so
# a row's bits, must not depend on the batch size.
@triton.jit(do_not_specialize=["M"])
def _poly_norm_fwd_kernel(
    x_ptr,  # [M, H], unit column stride, rows x_row_stride elements apart
    x_row_stride,
    mul_ptr,  # [M, H] when HAS_MUL, unit column stride, rows mul_row_stride apart; else unread
    mul_row_stride,
    y_ptr,  # [M, H] contiguous, x's dtype: y, or out = y * mul when HAS_MUL
    rstd_ptr,  # [M, 3] fp32 (fp64 for fp64 x): rstd of x^3, x^2, x
    w_ptr,  # (3,) any float dtype, elements w_stride apart: [w0, w1, w2]
    w_stride,
    b_ptr,  # (1,) any float dtype
    M,
    H,
    eps: tl.float64,  # fp64 so that fp64 inputs see eps unrounded
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_H: tl.constexpr,  # columns per block: the whole row when ONE_BLOCK
    ONE_BLOCK: tl.constexpr,  # the row fits one block: x is read once
    HAS_MUL: tl.constexpr,  # out = y * mul, formed in the accumulation dtype, rounded once
):
    ACC = rstd_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] int64
    row_mask = rows < M
    x_rows = x_ptr + rows * x_row_stride  # per-row base pointers, 64-bit offsets
    mul_rows = mul_ptr + rows * mul_row_stride
    y_rows = y_ptr + rows * H
    cols = tl.arange(0, BLOCK_H)

    # Statistics (MATH.md (1)): sum of x^2, x^4, x^6 per row, in one pass.
    if ONE_BLOCK:
        mask = row_mask[:, None] & (cols < H)[None, :]
        x = _load_acc(x_rows, cols, mask, ACC)
        s1, s2, s3 = row_sums(x)
    else:
        s1, s2, s3 = _row_sums_looped(x_rows, cols, row_mask, H, ACC, BLOCK_M, BLOCK_H)

    # rstd once per row (MATH.md (2)).
    inv_h = inv_h_of(H, ACC)
    e = tl.full([], eps, ACC)
    r1 = rstd_of(s1, inv_h, e)
    r2 = rstd_of(s2, inv_h, e)
    r3 = rstd_of(s3, inv_h, e)
    _store_rstd(rstd_ptr, rows, r3, r2, r1, row_mask)

    # Parameters are read here, in their own dtype: no host synchronisation.
    w0 = _to_acc(tl.load(w_ptr), ACC)
    w1 = _to_acc(tl.load(w_ptr + w_stride), ACC)
    w2 = _to_acc(tl.load(w_ptr + 2 * w_stride), ACC)
    b = _to_acc(tl.load(b_ptr), ACC)
    a1, a2, a3 = forward_coeffs(w0, w1, w2, r3, r2, r1)

    # Output, MATH.md (3); with HAS_MUL, times mul before the one rounding (MATH.md (8)).
    if ONE_BLOCK:
        y = poly_value(x, a1, a2, a3, b)
        if HAS_MUL:
            y = y * _load_acc(mul_rows, cols, mask, ACC)
        tl.store(y_rows[:, None] + cols[None, :], _to_out(y, y_ptr.dtype.element_ty), mask=mask)
    else:
        for c0 in range(0, H, BLOCK_H):
            c = c0 + cols
            mask = row_mask[:, None] & (c < H)[None, :]
            y = poly_value(_load_acc(x_rows, c, mask, ACC), a1, a2, a3, b)
            if HAS_MUL:
                y = y * _load_acc(mul_rows, c, mask, ACC)
            tl.store(y_rows[:, None] + c[None, :], _to_out(y, y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M"])
def _poly_norm_bwd_kernel(
    g_ptr,  # [M, H] grad_y (grad_out with HAS_MUL), unit column stride, rows g_row_stride apart (0 for an expand)
    g_row_stride,
    mul_ptr,  # [M, H] when HAS_MUL, unit column stride, rows mul_row_stride apart; else unread
    mul_row_stride,
    x_ptr,  # [M, H], unit column stride, rows x_row_stride apart
    x_row_stride,
    rstd_ptr,  # [M, 3] contiguous fp32 (fp64 for fp64 x): rstd of x^3, x^2, x
    w_ptr,  # (3,) any float dtype, elements w_stride apart: [w0, w1, w2]
    w_stride,
    b_ptr,  # (1,) any float dtype, read when HAS_MUL (grad_mul recomputes y); else unread
    dx_ptr,  # [M, H] contiguous, x's dtype
    dmul_ptr,  # [M, H] contiguous, x's dtype: grad_mul = grad_out * y when HAS_MUL; else unwritten
    partials_ptr,  # [num_programs, 4] rstd's dtype: this program's [dw0, dw1, dw2, db]
    M,
    H,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ONE_BLOCK: tl.constexpr,
    HAS_MUL: tl.constexpr,  # PolyNorm x mul: g = grad_out * mul drives dx, dw, db; grad_mul too
    # One launch: the last program to finish sums the partials (_sum_partials) into grad_ptr.
    # False: a second launch does (_poly_norm_bwd_param_kernel), and the two pointers below
    # are unread.
    FUSED_PARAMS: tl.constexpr = False,
    counter_ptr=None,  # (1,) int32, 0 before the launch and after it: programs done so far
    grad_ptr=None,  # (4,) rstd's dtype: [dw0, dw1, dw2, db]
):
    ACC = partials_ptr.dtype.element_ty
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    num_tiles = tl.cdiv(M, BLOCK_M)
    w0 = _to_acc(tl.load(w_ptr), ACC)
    w1 = _to_acc(tl.load(w_ptr + w_stride), ACC)
    w2 = _to_acc(tl.load(w_ptr + 2 * w_stride), ACC)
    if HAS_MUL:
        b = _to_acc(tl.load(b_ptr), ACC)
    inv_h = inv_h_of(H, ACC)
    cols = tl.arange(0, BLOCK_H)
    # This program's share of [dw0, dw1, dw2, db], one slot per tile row, summed at the end.
    p_w0 = tl.zeros([BLOCK_M], ACC)
    p_w1 = tl.zeros([BLOCK_M], ACC)
    p_w2 = tl.zeros([BLOCK_M], ACC)
    p_b = tl.zeros([BLOCK_M], ACC)

    # Persistent: program p takes tiles p, p + P, p + 2P, ... (a fixed assignment for a
    # fixed M, so the partials, and their sum, are the same on every run).
    for tile in range(pid, num_tiles, num_programs):
        rows = tl.cast(tile, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] int64
        row_mask = rows < M
        g_rows = g_ptr + rows * g_row_stride  # per-row base pointers, 64-bit offsets
        mul_rows = mul_ptr + rows * mul_row_stride
        x_rows = x_ptr + rows * x_row_stride
        dx_rows = dx_ptr + rows * H
        dmul_rows = dmul_ptr + rows * H

        # S_1, S_2, S_3 and G per row (MATH.md (4)), in one pass.
        if ONE_BLOCK:
            mask = row_mask[:, None] & (cols < H)[None, :]
            x = _load_acc(x_rows, cols, mask, ACC)
            go, g = _load_grad(g_rows, mul_rows, cols, mask, ACC, HAS_MUL)
            s1, s2, s3, sg = row_grad_sums(x, g)
        else:
            s1, s2, s3, sg = _row_grad_sums_looped(
                g_rows, mul_rows, x_rows, cols, row_mask, H, ACC, BLOCK_M, BLOCK_H, HAS_MUL
            )

        r3, r2, r1 = _load_rstd(rstd_ptr, rows, row_mask)
        # This row's share of [dw0, dw1, dw2, db] (MATH.md (7)); rows past M have r = 0 and S = 0.
        p_w0 += r3 * s3
        p_w1 += r2 * s2
        p_w2 += r1 * s1
        p_b += sg

        c1, c2, c3, d1, d2, d3 = backward_coeffs(w0, w1, w2, r3, r2, r1, s1, s2, s3, inv_h)
        if HAS_MUL:
            a1, a2, a3 = forward_coeffs(w0, w1, w2, r3, r2, r1)
        if ONE_BLOCK:
            dx = grad_x_value(x, g, c1, c2, c3, d1, d2, d3)
            tl.store(dx_rows[:, None] + cols[None, :], _to_out(dx, dx_ptr.dtype.element_ty), mask=mask)
            if HAS_MUL:
                dmul = go * poly_value(x, a1, a2, a3, b)  # MATH.md (10)
                tl.store(dmul_rows[:, None] + cols[None, :], _to_out(dmul, dmul_ptr.dtype.element_ty), mask=mask)
        else:
            for c0 in range(0, H, BLOCK_H):
                c = c0 + cols
                mask = row_mask[:, None] & (c < H)[None, :]
                xc = _load_acc(x_rows, c, mask, ACC)
                goc, gc = _load_grad(g_rows, mul_rows, c, mask, ACC, HAS_MUL)
                dx = grad_x_value(xc, gc, c1, c2, c3, d1, d2, d3)
                tl.store(dx_rows[:, None] + c[None, :], _to_out(dx, dx_ptr.dtype.element_ty), mask=mask)
                if HAS_MUL:
                    dmul = goc * poly_value(xc, a1, a2, a3, b)
                    tl.store(dmul_rows[:, None] + c[None, :], _to_out(dmul, dmul_ptr.dtype.element_ty), mask=mask)

    out = partials_ptr + pid.to(tl.int64) * 4
    tl.store(out + 0, tl.sum(p_w0, axis=0))
    tl.store(out + 1, tl.sum(p_w1, axis=0))
    tl.store(out + 2, tl.sum(p_w2, axis=0))
    tl.store(out + 3, tl.sum(p_b, axis=0))

    if FUSED_PARAMS:
        # The last program to finish sums every program's partial, in the order of
        # _sum_partials, which depends on num_programs only: the same bits whichever program
        # is last, and the same as the two-launch form's. Every thread's stores above come
        # before the barrier, the barrier before the ticket, whose release publishes them to
        # the program that draws the last ticket (its acquire; the CUDA backward's
        # finish_param_grads, with a fence in each thread instead, does the same).
        tl.debug_barrier()
        ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
        if ticket == num_programs - 1:
            tl.store(grad_ptr + tl.arange(0, 4), _sum_partials(partials_ptr, num_programs))
            tl.store(counter_ptr, 0)  # back to 0 for the next launch on this counter


# _sum_partials adds the partials on 2^_PARTIAL_LEVELS lanes: part of its order, so of dW's
# and dB's bits, and the same in both forms of the backward.
_PARTIAL_LEVELS = tl.constexpr(8)
_PARTIAL_LANES = tl.constexpr(2**8)


@triton.jit
def _sum_partials(partials_ptr, P):
    # The sums of the rows of partials [P, 4], [4] (unrounded: autograd rounds each to its
    # parameter's dtype), added in an order fixed by P alone, never by the program's layout
    # (num_warps, which differ between the backward kernel's configurations and the param
    # kernel's): lane l of _PARTIAL_LANES adds rows l, l + lanes, l + 2 lanes, ... in turn;
    # then _PARTIAL_LEVELS halvings, lane l of the lower half adding lane l + half. Each step
    # adds two numbers, which gives the same bits in either order. (tl.sum over all the lanes
    # would add them in a tree that follows the layout.)
    ACC = partials_ptr.dtype.element_ty
    offs = tl.arange(0, _PARTIAL_LANES)
    cols = tl.arange(0, 4)
    acc = tl.zeros([_PARTIAL_LANES, 4], ACC)
    for p0 in range(0, P, _PARTIAL_LANES):
        p = p0 + offs
        # .cg: from L2, where the other programs' partials are, never a stale L1 line.
        acc += tl.load(
            partials_ptr + p[:, None] * 4 + cols[None, :], mask=(p < P)[:, None], other=0.0, cache_modifier=".cg"
        )
    for level in tl.static_range(1, _PARTIAL_LEVELS + 1):
        acc = tl.sum(tl.reshape(acc, [2, _PARTIAL_LANES >> level, 4]), axis=0)
    return tl.reshape(acc, [4])  # dw0, dw1, dw2, db


@triton.jit
def _poly_norm_bwd_param_kernel(
    partials_ptr,  # [P, 4] fp32 (fp64 for fp64 x)
    P,
    grad_w_ptr,  # (3,) the partials' dtype
    grad_b_ptr,  # (1,) the partials' dtype
    BLOCK_P: tl.constexpr,  # _PARTIAL_LANES: the order of the sum is that of the one-launch form
):
    # The two-launch form's second launch, one program: the sums of _sum_partials.
    tl.static_assert(BLOCK_P == _PARTIAL_LANES)
    total = _sum_partials(partials_ptr, P)
    cols = tl.arange(0, 4)
    tl.store(grad_w_ptr + cols, total, mask=cols < 3)
    db = tl.sum(tl.where(cols == 3, total, 0.0), axis=0)
    tl.store(grad_b_ptr, db)


# ----------------------------------------------------------------------------------------
# Launch configuration: a function of H and the dtype only, never of M
# ----------------------------------------------------------------------------------------

# Every choice below depends on H and the dtype only. Sizes are in bytes of the
# accumulation dtype (fp32, fp64 for fp64 x) per thread and per row tensor, since that is
# what a thread holds in registers: fp16/bf16 rows widen to fp32 when loaded.

# One-block rows: each of the up to _MAX_WARPS * 32 threads keeps this much of the row
# (of x; of x and grad_y in backward) in registers between the reduction and the output.
# Forward: 64 fp32 per thread, rows up to 32768 columns (64 KiB of bf16) are read once.
# Past 16384 columns ptxas spills a little (about 100 bytes at the 128-register cap of a
# 512-thread program), yet on an H200 bf16 M=2048, H=32768 ran at 1.20x the copy floor
# this way against 1.41x for the two-pass column loop, whose second read mostly missed
# L2. Backward holds two tensors and four sums: 16 fp32 of each per thread (8192 columns;
# 16384 in one block measured no faster, with spills).
_ONE_BLOCK_BYTES = {"forward": 256, "backward": 64}
# The fused PolyNorm x mul (HAS_MUL) runs with these same configurations. Its one-block
# backward keeps grad_out beside x and g, and its forward loads mul for the output pass:
# ptxas -v for sm_90a (bf16) gives its backward 116-150
# registers per thread against PolyNorm's 80-120, without spills, and its forward at
# H = 32768 148 bytes of spills against PolyNorm's 88.
# Up to 16 warps (512 threads) per program: the cross-warp step of the reduction stays
# short and two programs still fit one SM.
_MAX_WARPS = 16
# Short rows: a program takes a [BLOCK_M, BLOCK_H] tile of at least _MIN_TILE elements
# (several rows when H < _MIN_TILE) at _ELEMS_PER_THREAD elements per thread: two or
# four 16-byte loads per thread in flight, and no program of mostly idle lanes. (On an
# H200, 4096-element tiles or 8 elements per thread measured no faster, often slower.)
_MIN_TILE = 2048
_ELEMS_PER_THREAD = 16
# Longer rows: column blocks of _COL_WARPS * 32 threads x this many bytes each, walked
# twice (statistics, then output). Backward keeps four running sums per element slot
# plus x and grad_y, so its blocks are half as wide to stay clear of spills.
_COL_BYTES = {"forward": 64, "backward": 32}
_COL_WARPS = 16
# Backward programs per SM of the persistent grid: enough resident warps (64 per SM at
# most) to cover memory latency; the partials stay O(SMs). On an H200 (bf16, M*H = 2^26)
# one program per tile ran up to 1.3x slower at H = 512..1024, and 16 warps per SM up
# to 1.4x slower at H >= 16384.
_BWD_WARPS_PER_SM = 64
# Tests may lower the largest one-block row (in elements, a power of two) to reach the
# column loop with a small H under the interpreter. None: the register budget decides.
_MAX_ONE_BLOCK_OVERRIDE = None


def _launch_config(H: int, dtype: torch.dtype, direction: str) -> tuple[int, int, bool, int]:
    """(BLOCK_M, BLOCK_H, ONE_BLOCK, num_warps) for rows of H elements of ``dtype``."""
    # int(): under torch.compile with dynamic shapes H is a SymInt; the kernels are
    # compiled per BLOCK_H anyway, so tracing specialises on H.
    return _launch_config_cached(int(H), dtype, direction, _MAX_ONE_BLOCK_OVERRIDE)


@functools.lru_cache(maxsize=1024)
def _launch_config_cached(H: int, dtype: torch.dtype, direction: str, override) -> tuple[int, int, bool, int]:
    acc_bytes = 8 if dtype == torch.float64 else 4
    one_block_max = _MAX_WARPS * 32 * _ONE_BLOCK_BYTES[direction] // acc_bytes
    if override is not None:
        one_block_max = min(one_block_max, override)
    block_h = triton.next_power_of_2(H)
    if block_h <= one_block_max:
        lanes_h = max(block_h, _ELEMS_PER_THREAD)  # tiny rows: about one row per thread
        block_m = max(1, _MIN_TILE // lanes_h)
        num_warps = min(_MAX_WARPS, max(1, block_m * lanes_h // (32 * _ELEMS_PER_THREAD)))
        return block_m, block_h, True, num_warps
    col_elems = max(1, _COL_BYTES[direction] // acc_bytes)
    block_h = min(_COL_WARPS * 32 * col_elems, one_block_max)
    num_warps = min(_COL_WARPS, max(1, block_h // (32 * col_elems)))
    return 1, block_h, False, num_warps


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2  # the interpreter runs programs one after another: a few suffice


def _bwd_num_programs(num_tiles: int, num_warps: int, device: torch.device) -> tuple[int, int]:
    """(programs, cap): the persistent grid's size, min(num_tiles, cap), and its cap.

    num_tiles >= 1 (M = 0 returns before the launch). Under torch.compile with a dynamic
    M, num_tiles is a SymInt: Python's min() would guard on which side of the cap it falls,
    so a batch crossing the cap would recompile; torch.sym_min keeps the choice symbolic
    (and is plain min() on ints). The cap depends on the device and H only.
    """
    cap = _sm_count(device) * max(1, _BWD_WARPS_PER_SM // num_warps)
    if type(num_tiles) is int:  # eager calls: builtin min, not sym_min's type dispatch
        return min(num_tiles, cap), cap
    return torch.sym_min(num_tiles, cap), cap


# ----------------------------------------------------------------------------------------
# Host side: argument checks, layouts, the ops
# ----------------------------------------------------------------------------------------


def _interpreted() -> bool:
    return not isinstance(_poly_norm_fwd_kernel, triton.runtime.JITFunction)


def _launchable(*tensors: Tensor) -> bool:
    # Meta tensors (shape inference, a module built under torch.device("meta")) have no
    # data: only the output shapes are produced. Under fake or functional tensors (opcheck,
    # torch.compile tracing), wrap_triton records the launch; the interpreter would instead
    # run the kernel on them, which it cannot: there too only the output shapes are produced.
    # is_meta, not device.type: no torch.device object per tensor on every call (fake and
    # functional tensors answer for the device they stand for, as device.type does).
    for t in tensors:
        if t.is_meta:
            return False
    if not _interpreted():
        return True
    return not any(is_fake(t) for t in tensors)


def _acc_dtype(x_dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if x_dtype == torch.float64 else torch.float32


def _as_rows(t: Tensor) -> tuple[Tensor, int, int, int]:
    """(tensor, M, H, row_stride): element (row, col) at ``tensor[...] + row * row_stride + col``.

    The tensor itself when its last-dim stride is 1 and the leading dims collapse into
    one row stride (any value, 0 too), else a contiguous copy: the one documented copy.
    """
    H = t.shape[-1]
    M = t.numel() // H if H else 0
    if t.is_contiguous():  # the common case, first: this runs on every call
        return t, M, H, H
    ok = H == 1 or t.stride(-1) == 1
    row_stride, expected = H, -1
    for d in range(t.dim() - 2, -1, -1):
        if not ok:
            break
        if t.shape[d] == 1:
            continue
        if expected < 0:
            row_stride = t.stride(d)
        elif t.stride(d) != expected:
            ok = False
        expected = t.stride(d) * t.shape[d]
    if ok and row_stride >= 0:
        return t, M, H, row_stride
    return t.contiguous(), M, H, H


def _flat(t: Tensor) -> tuple[Tensor, int]:
    if t.dim() <= 1:  # (3,), (1,) or (): no reshape on every call
        return t, t.stride(0) if t.dim() else 0
    flat = t.reshape(t.numel())  # a view when possible: no copy of a strided parameter
    return flat, flat.stride(0)


def _check_runs_here(op: str, x: Tensor) -> None:
    # Beyond the shared checks: Triton runs CUDA tensors, or CPU tensors in its interpreter.
    if not x.is_cuda and not _interpreted() and not x.is_meta and not is_fake(x):
        raise RuntimeError(
            f"{op}: expected x on a CUDA device (CPU tensors need TRITON_INTERPRET=1 set before "
            f"polynorm is imported), got {x.device}"
        )


_FWD_SCHEMA = "(Tensor x, Tensor weight, Tensor bias, float eps=1e-06) -> (Tensor y, Tensor rstd)"
_BWD_SCHEMA = (
    "(Tensor grad_y, Tensor x, Tensor weight, Tensor rstd) -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias)"
)
# The schemas of the C++ ops polynorm::mul_forward and mul_backward (csrc/ops.cpp).
_MUL_FWD_SCHEMA = "(Tensor x, Tensor mul, Tensor weight, Tensor bias, float eps=1e-06) -> (Tensor out, Tensor rstd)"
_MUL_BWD_SCHEMA = (
    "(Tensor grad_out, Tensor x, Tensor mul, Tensor weight, Tensor bias, Tensor rstd) -> "
    "(Tensor grad_x, Tensor grad_mul, Tensor grad_weight, Tensor grad_bias)"
)


def _op(name: str, *, mutates_args, schema: str):
    """``torch.library.triton_op`` on a GPU; an opaque ``custom_op`` under the interpreter.

    triton_op lets torch.compile, export and AOTInductor see the kernels: tracing runs the
    body, and wrap_triton records each launch into the graph. Under the interpreter the
    kernels are InterpretedFunctions, which wrap_triton cannot record, so a traced body
    would launch nothing and the compiled graph would return uninitialised outputs. There
    the op stays opaque instead: torch.compile and export keep the call, which runs the
    interpreter at run time. In both cases the body, run on fake tensors, is the fake kernel.
    """
    if not _interpreted():
        return triton_op(name, mutates_args=mutates_args, schema=schema)

    def register(fn):
        op = torch.library.custom_op(name, fn, mutates_args=mutates_args, schema=schema)
        op.register_fake(fn)
        return op

    return register


_NO_GUARD = contextlib.nullcontext()  # stateless: one for every call


def _on_device_of(x: Tensor):
    """Launches on x's device whatever the current device is (Triton launches on the current
    one): a device guard when x is on a CUDA device other than the current one, else nothing.
    A ``torch.cuda.device`` guard costs a few us of Python on every call even when it switches
    nothing, and x is almost always on the current device. Compiled graphs set the device in
    Inductor's own wrapper code."""
    if x.is_cuda and not torch.compiler.is_compiling():
        index = x.get_device()
        if index != torch.cuda.current_device():
            return torch.cuda.device(index)
    return _NO_GUARD


_FWD = "polynorm.forward_triton"
_BWD = "polynorm.backward_triton"
_MUL_FWD = "polynorm.mul_forward_triton"
_MUL_BWD = "polynorm.mul_backward_triton"


def _forward_impl(x: Tensor, weight: Tensor, bias: Tensor, eps, launch) -> tuple[Tensor, Tensor]:
    """The forward op's body: checks, outputs, one launch. ``launch`` is ``wrap_triton``
    inside the registered op (so tracing records the launch) or the identity (eager calls
    from :class:`PolyNormTritonFunction`, which launch the kernel directly)."""
    eps = check_forward_args(_FWD, x, weight, bias, eps)
    _check_runs_here(_FWD, x)
    return _forward_launch(x, None, weight, bias, eps, launch)


def _mul_forward_impl(x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, eps, launch) -> tuple[Tensor, Tensor]:
    """The fused PolyNorm x mul forward op's body (see :func:`_forward_impl`)."""
    eps = check_mul_forward_args(_MUL_FWD, x, mul, weight, bias, eps)
    _check_runs_here(_MUL_FWD, x)
    return _forward_launch(x, mul, weight, bias, eps, launch)


def _forward_launch(
    x: Tensor, mul: Tensor | None, weight: Tensor, bias: Tensor, eps: float, launch, eager: bool = False
):
    """(y or out, rstd) for checked arguments: out = y * mul when mul is given. ``eager``: a
    call of :class:`PolyNormTritonFunction`, whose tensors hold data (:func:`eager_fast_path`
    and the checks): no :func:`_launchable` test."""
    x_rows, M, H, x_row_stride = _as_rows(x)
    # Without mul the kernel's mul arguments are x's: HAS_MUL=False never reads them.
    mul_rows, _, _, mul_row_stride = (x_rows, M, H, x_row_stride) if mul is None else _as_rows(mul)
    # empty_like: x's shape, dtype and device, contiguous, from one call (no Python objects
    # for the shape and the device).
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    rstd = x.new_empty((M, 3), dtype=_acc_dtype(x.dtype))
    if M == 0:
        return y, rstd
    w, w_stride = _flat(weight)
    b, _ = _flat(bias)
    block_m, block_h, one_block, num_warps = _launch_config(H, x.dtype, "forward")
    grid = (M + block_m - 1) // block_m
    if eager:  # PolyNormTritonFunction: no mul
        with _on_device_of(x):
            args = (x_rows, x_row_stride, x_rows, x_row_stride, y, rstd, w, w_stride, b, M, H, eps,
                    block_m, block_h, one_block, False)  # fmt: skip
            # What Triton specialises the compiled kernel on, beyond the constexprs: each
            # pointer's dtype and 16-byte alignment, each int's value class (M: int32 or not).
            key = (_poly_norm_fwd_kernel, x.get_device(), H, x.dtype, w.dtype, b.dtype, x_row_stride, w_stride,
                   M <= _INT32_MAX, block_m, block_h, one_block, num_warps,
                   _aligned(x_rows), _aligned(y), _aligned(rstd), _aligned(w), _aligned(b))  # fmt: skip
            _launch_eager(_poly_norm_fwd_kernel, grid, args, num_warps, key)
    elif _launchable(x_rows, mul_rows, w, b):
        with _on_device_of(x):
            launch(_poly_norm_fwd_kernel)[(grid,)](
                x_rows, x_row_stride, mul_rows, mul_row_stride, y, rstd, w, w_stride, b, M, H, eps,
                BLOCK_M=block_m, BLOCK_H=block_h, ONE_BLOCK=one_block, HAS_MUL=mul is not None,
                num_warps=num_warps,
            )  # fmt: skip
    return y, rstd


def _backward_impl(grad_y: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, launch) -> tuple[Tensor, Tensor, Tensor]:
    """The backward op's body (see :func:`_forward_impl` for ``launch``)."""
    check_backward_args(_BWD, grad_y, x, weight, rstd)
    _check_runs_here(_BWD, x)
    grad_x, _, grad_weight, grad_bias = _backward_launch(grad_y, x, None, weight, None, rstd, launch)
    return grad_x, grad_weight, grad_bias


def _mul_backward_impl(
    grad_out: Tensor, x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, rstd: Tensor, launch
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The fused PolyNorm x mul backward op's body (see :func:`_forward_impl`)."""
    check_mul_backward_args(_MUL_BWD, grad_out, x, mul, weight, bias, rstd)
    _check_runs_here(_MUL_BWD, x)
    return _backward_launch(grad_out, x, mul, weight, bias, rstd, launch)


def _backward_launch(grad_y: Tensor, x: Tensor, mul: Tensor | None, weight: Tensor, bias: Tensor | None, rstd, launch):
    """(grad_x, grad_mul, grad_weight, grad_bias) for checked arguments; grad_mul is None
    without mul. With mul, grad_y is grad_out (of out = y * mul) and bias is needed: y is
    recomputed for grad_mul. Two launches: the backward kernel, then the parameter sums
    (the registered ops; :func:`_eager_backward` is the one-launch form)."""
    acc = _acc_dtype(x.dtype)
    has_mul = mul is not None
    x_rows, M, H, x_row_stride = _as_rows(x)
    g_rows, _, _, g_row_stride = _as_rows(grad_y)
    # Without mul the kernel's mul, bias and grad_mul arguments are inputs it already reads
    # (grad_y, weight): HAS_MUL=False neither reads nor writes them.
    mul_rows, _, _, mul_row_stride = _as_rows(mul) if has_mul else (g_rows, M, H, g_row_stride)
    grad_x = torch.empty_like(x, memory_format=torch.contiguous_format)
    grad_mul = torch.empty_like(x, memory_format=torch.contiguous_format) if has_mul else None
    # grad_weight and grad_bias in the accumulation dtype: autograd rounds each to its
    # parameter's dtype.
    if M == 0:
        return grad_x, grad_mul, x.new_zeros((3,), dtype=acc), x.new_zeros((1,), dtype=acc)
    rstd_c = rstd.contiguous()  # [M, 3]: at most a tiny copy
    w, w_stride = _flat(weight)
    b = _flat(bias)[0] if has_mul else w
    block_m, block_h, one_block, num_warps = _launch_config(H, x.dtype, "backward")
    num_programs, max_programs = _bwd_num_programs((M + block_m - 1) // block_m, num_warps, x.device)
    grad_weight = x.new_empty((3,), dtype=acc)
    grad_bias = x.new_empty((1,), dtype=acc)
    # [max_programs, 4], of which the first num_programs rows are written and summed: a
    # shape that does not depend on M, so tracing with a dynamic M adds no guard on it.
    partials = x.new_empty((max_programs, 4), dtype=acc)
    if _launchable(x_rows, g_rows, mul_rows, w, b, rstd_c):
        with _on_device_of(x):
            # FUSED_PARAMS=False leaves counter_ptr and grad_ptr unread: partials stands in
            # for both, a tensor as wrap_triton records every argument.
            launch(_poly_norm_bwd_kernel)[(num_programs,)](
                g_rows, g_row_stride, mul_rows, mul_row_stride, x_rows, x_row_stride, rstd_c, w, w_stride, b,
                grad_x, grad_mul if has_mul else g_rows, partials, M, H,
                BLOCK_M=block_m, BLOCK_H=block_h, ONE_BLOCK=one_block, HAS_MUL=has_mul,
                FUSED_PARAMS=False, counter_ptr=partials, grad_ptr=partials, num_warps=num_warps,
            )  # fmt: skip
            launch(_poly_norm_bwd_param_kernel)[(1,)](
                partials, num_programs, grad_weight, grad_bias, BLOCK_P=_PARTIAL_LANES.value, num_warps=4
            )
    return grad_x, grad_mul, grad_weight, grad_bias


def _eager_backward(grad_y: Tensor, x: Tensor, weight: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    """(grad_x, grads) of :class:`PolyNormTritonFunction`'s backward, in one launch: grads is
    ``[dw0, dw1, dw2, db]`` in rstd's dtype (the accumulation dtype), summed by the kernel's
    last program from an arrival counter and partials cached per stream
    (:func:`_eager_param_buffers`); bitwise what the two launches of :func:`_backward_launch`
    give. The arguments are checked, hold data, and rstd is the forward's own (contiguous,
    of the accumulation dtype). A launch captured into a CUDA graph on a device where no
    eager backward has run yet takes the two launches (no counter can be zeroed there)."""
    x_rows, M, H, x_row_stride = _as_rows(x)
    g_rows, _, _, g_row_stride = _as_rows(grad_y)
    grad_x = torch.empty_like(x, memory_format=torch.contiguous_format)
    acc = rstd.dtype
    if M == 0:
        return grad_x, x.new_zeros((4,), dtype=acc)
    grads = torch.empty(4, dtype=acc, device=x.device)  # [dw0, dw1, dw2, db]: one allocation for both
    w, w_stride = _flat(weight)
    block_m, block_h, one_block, num_warps = _launch_config(H, x.dtype, "backward")
    num_programs, max_programs = _bwd_num_programs((M + block_m - 1) // block_m, num_warps, x.device)
    with _on_device_of(x):
        buffers = _eager_param_buffers(x, acc, max_programs)
        counter, partials = buffers if buffers is not None else (None, x.new_empty((max_programs, 4), dtype=acc))
        fused = counter is not None
        if not fused:
            counter = partials  # unread (FUSED_PARAMS=False)
        # Without mul: the kernel's mul, bias and grad_mul arguments stand for inputs it
        # already reads (grad_y, weight); HAS_MUL=False neither reads nor writes them.
        args = (g_rows, g_row_stride, g_rows, g_row_stride, x_rows, x_row_stride, rstd, w, w_stride, w,
                grad_x, g_rows, partials, M, H, block_m, block_h, one_block, False, fused, counter, grads)  # fmt: skip
        # As in _forward_launch: the specialisation beyond the constexprs, here with the
        # counter's and the partials' pointers (cached, so 16-byte aligned, as fresh outputs).
        key = (_poly_norm_bwd_kernel, x.get_device(), H, x.dtype, w.dtype, g_row_stride, x_row_stride, w_stride,
               M <= _INT32_MAX, block_m, block_h, one_block, num_warps, fused, _aligned(g_rows), _aligned(x_rows),
               _aligned(rstd), _aligned(w), _aligned(grad_x), _aligned(partials), _aligned(counter),
               _aligned(grads))  # fmt: skip
        _launch_eager(_poly_norm_bwd_kernel, num_programs, args, num_warps, key)
        if not fused:
            _poly_norm_bwd_param_kernel[(1,)](
                partials, num_programs, grads, grads[3:], BLOCK_P=_PARTIAL_LANES.value, num_warps=4
            )
    return grad_x, grads


# ----------------------------------------------------------------------------------------
# Direct launches: the eager path's kernels without Triton's Python launcher
# ----------------------------------------------------------------------------------------

# ``kernel[grid](*args)`` costs 18-37 us of host time a launch through Triton 3.6's Python
# launcher on an H200's host (bench/triton_host.py): it binds and specialises every argument, builds
# the cache key, checks the kernel's globals, then calls the compiled kernel's launcher. For
# the eager path (PolyNormTritonFunction) the first launch of each specialisation goes through
# it and hands back the compiled kernel, kept here under a key of everything Triton specialised
# it on (:func:`_launch_eager`'s callers build it: the device, the constexprs and num_warps,
# each pointer's dtype and 16-byte alignment, each int's value, M's int32 range); later
# launches with that key call the compiled kernel's launcher directly, as Triton's own last
# step does (``CompiledKernel.run`` with the function, packed metadata and launch hooks; the
# same call in Triton 3.6 and 3.8). Off: under the interpreter, when the kernels or the
# compiled kernel lack what the call needs (feature-detected), after any TypeError from that
# call (a launcher of another signature: nothing was launched), and with _DIRECT_LAUNCH False.
# On by default; POLYNORM_TRITON_DIRECT_LAUNCH=0 turns it off, to rule it out when a launch
# misbehaves: Triton's own launcher then runs every launch.
_DIRECT_LAUNCH = os.environ.get("POLYNORM_TRITON_DIRECT_LAUNCH", "1") != "0"
_COMPILED: dict[tuple, object] = {}  # key -> CompiledKernel
_INT32_MAX = 2**31 - 1
# The parameters, in order, that the eager callers pass positionally (Triton hands the
# launcher every parameter, constexprs included, in this order).
_FWD_PARAMS = ("x_ptr", "x_row_stride", "mul_ptr", "mul_row_stride", "y_ptr", "rstd_ptr", "w_ptr", "w_stride", "b_ptr",
               "M", "H", "eps", "BLOCK_M", "BLOCK_H", "ONE_BLOCK", "HAS_MUL")  # fmt: skip
_BWD_PARAMS = ("g_ptr", "g_row_stride", "mul_ptr", "mul_row_stride", "x_ptr", "x_row_stride", "rstd_ptr", "w_ptr",
               "w_stride", "b_ptr", "dx_ptr", "dmul_ptr", "partials_ptr", "M", "H", "BLOCK_M", "BLOCK_H", "ONE_BLOCK",
               "HAS_MUL", "FUSED_PARAMS", "counter_ptr", "grad_ptr")  # fmt: skip


def _direct_launch_supported() -> bool:
    """Whether this Triton's kernels and knobs look as the direct launch expects."""
    if _interpreted():
        return False
    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    return (
        runtime is not None
        and hasattr(runtime, "launch_enter_hook")
        and hasattr(runtime, "launch_exit_hook")
        and tuple(getattr(_poly_norm_fwd_kernel, "arg_names", ())) == _FWD_PARAMS
        and tuple(getattr(_poly_norm_bwd_kernel, "arg_names", ())) == _BWD_PARAMS
        and hasattr(_poly_norm_fwd_kernel, "pre_run_hooks")
        and hasattr(_poly_norm_bwd_kernel, "pre_run_hooks")
        and hasattr(torch._C, "_cuda_getCurrentRawStream")
    )


_DIRECT_SUPPORTED = _direct_launch_supported()


def _aligned(t: Tensor) -> bool:
    return t.data_ptr() % 16 == 0


def _no_hooks(hook) -> bool:
    # Triton's launch hooks are HookChains (empty unless a profiler such as proton added one),
    # or None.
    return hook is None or (type(hook).__name__ == "HookChain" and not getattr(hook, "calls", True))


def _launch_eager(kernel, grid: int, args: tuple, num_warps: int, key: tuple) -> None:
    """``kernel[(grid,)](*args, num_warps=num_warps)`` on the current device and stream, through
    the compiled kernel's launcher directly once ``key`` has been launched the usual way (see
    above). ``args``: every parameter of the kernel, in order."""
    global _DIRECT_LAUNCH
    compiled = _COMPILED.get(key) if _DIRECT_LAUNCH else None
    if compiled is not None and not kernel.pre_run_hooks:
        runtime = triton.knobs.runtime
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        stream = torch._C._cuda_getCurrentRawStream(key[1])
        if _no_hooks(enter) and _no_hooks(leave):
            metadata = enter = leave = None
        else:
            metadata = compiled.launch_metadata((grid, 1, 1), stream, *args)
        try:
            compiled.run(grid, 1, 1, stream, compiled.function, compiled.packed_metadata, metadata, enter, leave, *args)
            return
        except TypeError:  # a launcher that takes other arguments: launch as Triton does, from now on
            _DIRECT_LAUNCH = False
    compiled = kernel[(grid,)](*args, num_warps=num_warps)
    if (
        _DIRECT_LAUNCH
        and _DIRECT_SUPPORTED
        and getattr(compiled, "function", None) is not None
        and hasattr(compiled, "packed_metadata")
        and hasattr(compiled, "launch_metadata")
        and hasattr(compiled, "run")
    ):
        _COMPILED[key] = compiled


# ----------------------------------------------------------------------------------------
# The one-launch backward's arrival counters and partials (eager calls only)
# ----------------------------------------------------------------------------------------

# Arrival counters, as the CUDA backward's (csrc/cuda/launch_backward.cuh, arrival_counter): int32
# slots of one zeroed buffer a device, each 0 between launches (the last program resets its
# own). Two launches must never run on one counter, or on one partials buffer, at the same
# time:
# - An eager launch takes its stream's counter and partials. Launches on one stream run one
#   after another. Streams get counters in order of first use; past _STREAM_SLOTS streams on a
#   device they share slots, which matters only if two of those run a backward at once.
# - A launch captured into a CUDA graph takes a counter of its own, never used by another
#   launch (a graph may be replayed on any stream, while eager work runs), and partials from
#   the graph's own memory pool. Past _CAPTURE_SLOTS captures on a device, capture counters
#   are reused, oldest first. A buffer cannot be allocated and zeroed during a capture (the
#   zeroing would be recorded, not run): a capture on a device where no eager backward has
#   run yet takes the two-launch form.
# Slots are 16 bytes apart: Triton specialises a kernel on each pointer's 16-byte alignment,
# so every slot gets the same compiled kernel. 256 KiB a device, as the CUDA side's.
_STREAM_SLOTS = 4096
_CAPTURE_SLOTS = 12288
_SLOT_INTS = 4  # int32 a slot: 16 bytes


class _DeviceCounters:
    """One device's arrival counters: _STREAM_SLOTS + _CAPTURE_SLOTS slots of 16 bytes, zeros."""

    def __init__(self, device: torch.device):
        slots = _STREAM_SLOTS + _CAPTURE_SLOTS
        self.counters = torch.zeros(slots * _SLOT_INTS, dtype=torch.int32, device=device)
        if device.type == "cuda":
            # The zeros were written on the current stream; a launch on another stream must
            # not read the counters before that: wait for them once.
            torch.cuda.synchronize(device)
        self.streams = 0  # stream slots handed out
        self.captures = 0  # capture slots handed out

    def _slot(self, slot: int) -> Tensor:
        return self.counters[slot * _SLOT_INTS : slot * _SLOT_INTS + 1]

    def stream_slot(self) -> Tensor:
        slot = self.streams % _STREAM_SLOTS
        self.streams += 1
        return self._slot(slot)

    def capture_slot(self) -> Tensor:
        slot = _STREAM_SLOTS + self.captures % _CAPTURE_SLOTS
        self.captures += 1
        return self._slot(slot)


_DEVICE_COUNTERS: dict[int, _DeviceCounters] = {}  # device index (-1: the CPU) -> its counters
# (device index, stream, acc dtype) -> (counter, partials [cap, 4]) of eager launches
_STREAM_BUFFERS: dict[tuple, tuple[Tensor, Tensor]] = {}


def _eager_param_buffers(x: Tensor, acc: torch.dtype, cap: int) -> tuple[Tensor, Tensor] | None:
    """(counter, partials) for a one-launch backward on x's device and current stream (call
    it with x's device current), or None: a capture on a device without counters yet, whose
    launch takes the two-launch form. partials has at least ``cap`` rows of dtype acc."""
    if not x.is_cuda:  # the interpreter: one launch at a time
        index, stream = -1, 0
    else:
        index = x.get_device()
        if torch.cuda.is_current_stream_capturing():
            counters = _DEVICE_COUNTERS.get(index)
            if counters is None:
                return None
            return counters.capture_slot(), x.new_empty((cap, 4), dtype=acc)
        stream = torch._C._cuda_getCurrentRawStream(index)
    key = (index, stream, acc)
    buffers = _STREAM_BUFFERS.get(key)
    if buffers is None or buffers[1].shape[0] < cap:
        counters = _DEVICE_COUNTERS.get(index)
        if counters is None:
            counters = _DEVICE_COUNTERS[index] = _DeviceCounters(x.device)
        # One counter a stream, whatever acc: a stream's launches never overlap.
        same_stream = [b for k, b in _STREAM_BUFFERS.items() if k[:2] == (index, stream)]
        counter = same_stream[0][0] if same_stream else counters.stream_slot()
        # Every cap of this device (the grid's largest size, for any H).
        rows = _sm_count(x.device) * _BWD_WARPS_PER_SM if x.is_cuda else cap
        buffers = _STREAM_BUFFERS[key] = (counter, x.new_empty((max(rows, cap), 4), dtype=acc))
    return buffers


@_op("polynorm::forward_triton", mutates_args=(), schema=_FWD_SCHEMA)
def poly_norm_forward_triton(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """PolyNorm forward in Triton: ``torch.ops.polynorm.forward_triton(x, weight, bias, eps)``.

    ``y = x * (w2 r_1 + x * (w1 r_2 + x * w0 r_3)) + b`` per row, which is
    ``w0 norm(x^3) + w1 norm(x^2) + w2 norm(x) + b`` with ``r_p = 1 / sqrt(mean(x^(2p)) + eps)``
    over the last dimension H. Accumulates in fp32 (fp64 for fp64 x); y is rounded once.

    Args:
        x: ``(..., H)``, float32, float64, float16 or bfloat16, on a CUDA device (or the
            CPU under ``TRITON_INTERPRET=1``). Rows with unit last-dim stride and any
            row stride are read in place; other layouts are copied once.
        weight: ``(3,)`` ``[w0, w1, w2]``, any of those dtypes.
        bias: ``(1,)`` or ``()``, any of those dtypes.
        eps: added to each mean square inside the square root; finite and >= 0.

    Returns:
        y: x's shape and dtype, contiguous.
        rstd: ``(M, 3)`` with ``M = x.numel() // H``, columns ``[r_3, r_2, r_1]``; float32
        (float64 for float64 x). Saved for the backward; not differentiable.

    Raises:
        ValueError: eps negative, NaN or infinite.
        RuntimeError: x not float32/float64/float16/bfloat16, 0-d or with H = 0; weight
            not ``(3,)`` or bias not ``(1,)`` or ``()``, or of another dtype; tensors on
            different devices; x on the CPU without the interpreter. Messages start
            ``polynorm.forward_triton:`` and give the expected and the actual value.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    return _forward_impl(x, weight, bias, eps, wrap_triton)


@_op("polynorm::backward_triton", mutates_args=(), schema=_BWD_SCHEMA)
def poly_norm_backward_triton(
    grad_y: Tensor, x: Tensor, weight: Tensor, rstd: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """PolyNorm backward in Triton: ``torch.ops.polynorm.backward_triton(grad_y, x, weight, rstd)``.

    With ``S_p = sum_j g_j x_j^p``, ``c_p = w(p) p r_p`` and ``d_p = c_p r_p^2 S_p / H``
    (``w(3) = w0, w(2) = w1, w(1) = w2``)::

        grad_x = g (c_1 + x (c_2 + x c_3)) - x (d_1 + x^2 (d_2 + x^2 d_3))
        grad_weight = [sum r_3 S_3, sum r_2 S_2, sum r_1 S_1],  grad_bias = [sum g]

    summed over rows in fp32 (fp64 for fp64 x), in a fixed order: the same bits on
    every run for a given shape.

    Args:
        grad_y: x's shape and dtype; any layout (an expanded grad_y, row stride 0, is
            read in place).
        x: ``(..., H)``, as for :func:`poly_norm_forward_triton`.
        weight: ``(3,)`` ``[w0, w1, w2]``, any float dtype.
        rstd: ``(M, 3)`` from the forward, float32 (float64 for float64 x).

    Returns:
        grad_x: x's shape and dtype, contiguous. grad_weight ``(3,)`` and grad_bias
        ``(1,)`` in the accumulation dtype, float32 (float64 for float64 x), whatever
        weight's dtype (zeros when M = 0); autograd rounds each to its parameter's dtype.

    Raises:
        RuntimeError: as the forward for x and weight; grad_y not of x's shape, dtype
            and device; rstd not ``(M, 3)`` of the accumulation dtype on x's device.
            Messages start ``polynorm.backward_triton:``.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    return _backward_impl(grad_y, x, weight, rstd, wrap_triton)


@_op("polynorm::mul_forward_triton", mutates_args=(), schema=_MUL_FWD_SCHEMA)
def poly_norm_mul_forward_triton(
    x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """Fused PolyNorm x mul forward in Triton:
    ``torch.ops.polynorm.mul_forward_triton(x, mul, weight, bias, eps)``.

    ``out = poly_norm(x) * mul``, the gated MLP's ``down(PolyNorm(gate(x)) * up(x))``, with
    ``y = x * (w2 r_1 + x * (w1 r_2 + x * w0 r_3)) + b`` per row as in
    :func:`poly_norm_forward_triton`. y is formed in fp32 (fp64 for fp64 x), multiplied by
    mul there, and only the product is rounded, once, to x's dtype: y is never rounded on
    its own. The same kernel as the PolyNorm forward, with HAS_MUL set.

    Args:
        x: ``(..., H)``, float32, float64, float16 or bfloat16, on a CUDA device (or the
            CPU under ``TRITON_INTERPRET=1``).
        mul: x's shape, dtype and device. x and mul each: rows with unit last-dim stride
            and any row stride are read in place; other layouts are copied once.
        weight: ``(3,)`` ``[w0, w1, w2]``, any of those dtypes.
        bias: ``(1,)`` or ``()``, any of those dtypes.
        eps: added to each mean square inside the square root; finite and >= 0.

    Returns:
        out: x's shape and dtype, contiguous.
        rstd: ``(M, 3)`` with ``M = x.numel() // H``, columns ``[r_3, r_2, r_1]``; float32
        (float64 for float64 x), as the PolyNorm forward's. Not differentiable.

    Raises:
        ValueError: eps negative, NaN or infinite.
        RuntimeError: as :func:`poly_norm_forward_triton`, and mul not of x's shape, dtype
            or device. Messages start ``polynorm.mul_forward_triton:`` and give the
            expected and the actual value.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    return _mul_forward_impl(x, mul, weight, bias, eps, wrap_triton)


@_op("polynorm::mul_backward_triton", mutates_args=(), schema=_MUL_BWD_SCHEMA)
def poly_norm_mul_backward_triton(
    grad_out: Tensor, x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, rstd: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fused PolyNorm x mul backward in Triton:
    ``torch.ops.polynorm.mul_backward_triton(grad_out, x, mul, weight, bias, rstd)``.

    With ``g = grad_out * mul`` in fp32 (fp64 for fp64 x), never rounded, the PolyNorm
    backward of :func:`poly_norm_backward_triton` runs on g unchanged::

        grad_x = g (c_1 + x (c_2 + x c_3)) - x (d_1 + x^2 (d_2 + x^2 d_3))
        grad_weight = [sum r_3 S_3, sum r_2 S_2, sum r_1 S_1],  grad_bias = [sum g]
        grad_mul = grad_out * y

    where y is recomputed from x, rstd, weight and bias in the forward's Horner form (the
    same bits as the forward's y), and grad_mul is rounded once to x's dtype. The
    parameter sums are added in a fixed order: the same bits on every run for a shape.

    Args:
        grad_out: x's shape and dtype; any layout (an expanded one, row stride 0, is read
            in place).
        x: ``(..., H)``, as for :func:`poly_norm_mul_forward_triton`.
        mul: x's shape, dtype and device; any layout.
        weight: ``(3,)`` ``[w0, w1, w2]``, any float dtype.
        bias: ``(1,)`` or ``()``, any float dtype: y is recomputed for grad_mul.
        rstd: ``(M, 3)`` from the forward, float32 (float64 for float64 x).

    Returns:
        grad_x, grad_mul: x's shape and dtype, contiguous. grad_weight ``(3,)`` and
        grad_bias ``(1,)`` in the accumulation dtype, float32 (float64 for float64 x)
        (zeros when M = 0); autograd rounds each to its parameter's dtype.

    Raises:
        RuntimeError: as :func:`poly_norm_backward_triton`; mul not of x's shape, dtype and
            device; bias not one float element on x's device. Messages start
            ``polynorm.mul_backward_triton:``.

    Source: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
    """
    return _mul_backward_impl(grad_out, x, mul, weight, bias, rstd, wrap_triton)


def _launch_directly(kernel):
    return kernel


_PLAIN = (Tensor, torch.nn.Parameter)


def eager_fast_path(x: Tensor, weight: Tensor, bias: Tensor, eps) -> bool:
    """Whether :class:`PolyNormTritonFunction` may serve this call instead of the registered
    op: eager mode (not being traced by torch.compile, no torch.func transform, no dispatch
    or function mode), x a plain tensor with data (not a subclass such as DTensor, whose
    sharding rules live on the registered op, nor fake, functional or meta), weight and
    bias plain tensors or parameters, and eps already a Python number."""
    return (
        isinstance(eps, (int, float))
        # Not a subclass: a DTensor's data is not its own (its ops dispatch), and fake tensors
        # and Python functional tensors are subclasses too.
        and type(x) in _PLAIN
        and type(weight) in _PLAIN
        and type(bias) in _PLAIN
        and not torch.compiler.is_compiling()
        and not torch._C._are_functorch_transforms_active()
        # A TorchDispatchMode or TorchFunctionMode (FlopCounterMode, activation-checkpointing
        # policies, debug modes) must see the op, which direct launches would hide.
        and torch._C._len_torch_dispatch_stack() == 0
        and not torch._C._is_torch_function_mode_enabled()
        # The wrappers of plain type that may hold a fake tensor (is_fake's other cases, at
        # a tenth of its cost): C++ functional tensors and torch.func's wrapped tensors.
        and not torch._is_functional_tensor(x)
        and not torch._C._functorch.is_functorch_wrapped_tensor(x)
        and not x.is_meta
    )


_FLOAT_DTYPES = frozenset((torch.float32, torch.float64, torch.float16, torch.bfloat16))


def _forward_args_hold(x: Tensor, weight: Tensor, bias: Tensor, eps) -> bool:
    """Whether :func:`check_forward_args` holds with eps a Python float, from a few comparisons
    (about a third of the checks' host time), for tensors that :func:`eager_fast_path` let
    through. False: the caller runs the checks, which raise, or give eps as a float."""
    return (
        type(eps) is float
        and 0.0 <= eps < math.inf  # NaN fails
        and x.dtype in _FLOAT_DTYPES
        and weight.dtype in _FLOAT_DTYPES
        and bias.dtype in _FLOAT_DTYPES
        and x.dim() >= 1
        and x.shape[-1] >= 1
        and weight.shape == (3,)
        and bias.numel() == 1
        and bias.dim() <= 1
        and weight.device == x.device
        and bias.device == x.device
    )


class PolyNormTritonFunction(torch.autograd.Function):
    """Eager autograd of the Triton backend, without the dispatcher.

    The registered ops (``torch.ops.polynorm.forward_triton``/``backward_triton``, whose
    launches torch.compile, export and AOTInductor record) go through the dispatcher and
    ``wrap_triton`` on every eager call. This Function runs the same kernels, with the same
    checks, launched directly (and, once compiled, through their launchers without Triton's
    Python launcher: :func:`_launch_eager`), and its backward launches once where the op
    launches twice (:func:`_eager_backward`: the kernel's last program sums dW and dB, the
    same bits).
    Checks that hold already are not repeated: the forward's in a few comparisons for the
    common call (:func:`_forward_args_hold`), the backward's where the forward and autograd
    guarantee them (:func:`_saved_args_hold`). :func:`polynorm.poly_norm` uses it whenever
    :func:`eager_fast_path` holds, and the registered ops otherwise. The backward keeps the
    op path when a graph of the gradient is recorded (``create_graph=True``), whose autograd
    refuses a double backward with a clear message. ``bench/triton_host.py`` times where the
    host time goes.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, eps: float, records: bool) -> Tensor:
        """``records``: a backward is recorded (grad mode on and an input requiring grad), as
        the caller saw it before ``apply`` (``ctx.needs_input_grad`` ignores grad mode)."""
        if not _forward_args_hold(x, weight, bias, eps):
            eps = check_forward_args(_FWD, x, weight, bias, eps)  # raises, or gives eps as a float
        _check_runs_here(_FWD, x)
        y, rstd = _forward_launch(x, None, weight, bias, eps, _launch_directly, eager=True)
        ctx.set_materialize_grads(False)  # no zero grad_y for an unused y, no kernel for it
        if records:
            # An x made under torch.inference_mode() cannot be saved for backward: the
            # parameter gradients need its rows, so it is copied once (as the op path does).
            ctx.save_for_backward(x.clone() if x.is_inference() else x, weight, rstd)
            ctx.params = (weight.shape, weight.dtype, bias.shape, bias.dtype)
        return y

    @staticmethod
    def backward(ctx, grad_y: Tensor):
        if grad_y is None:  # y did not reach the loss: every gradient is zero
            return None, None, None, None, None
        x, weight, rstd = ctx.saved_tensors
        need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
        weight_shape, weight_dtype, bias_shape, bias_dtype = ctx.params
        if torch.is_grad_enabled():  # create_graph=True: the op, whose autograd refuses double backward
            grad_x, grad_weight, grad_bias = torch.ops.polynorm.backward_triton(grad_y, x, weight, rstd)
        else:
            if not _saved_args_hold(ctx, grad_y, x, weight):
                check_backward_args(_BWD, grad_y, x, weight, rstd)  # raises, naming what changed
            grad_x, grads = _eager_backward(grad_y, x, weight, rstd)
            if not (need_weight or need_bias):
                return grad_x, None, None, None, None
            if weight_dtype == bias_dtype and grads.dtype != weight_dtype:
                grads = grads.to(weight_dtype)  # both rounded in one conversion
            grad_weight, grad_bias = grads.split_with_sizes((3, 1))  # two views in one call
        # grad_weight and grad_bias come in the accumulation dtype: rounded once, here, to
        # each parameter's own dtype and shape.
        return (
            grad_x if need_x else None,
            _as_param(grad_weight, weight_dtype, weight_shape) if need_weight else None,
            _as_param(grad_bias, bias_dtype, bias_shape) if need_bias else None,
            None,
            None,
        )


def _saved_args_hold(ctx, grad_y: Tensor, x: Tensor, weight: Tensor) -> bool:
    """Whether :func:`check_backward_args` holds in :class:`PolyNormTritonFunction`'s backward,
    from a few comparisons (about 1 us of host time, against about 8 for the checks).

    The forward checked x and weight; rstd is its own output, ``[M, 3]`` of the accumulation
    dtype on x's device, contiguous, which the user never held; and autograd's engine hands
    grad_y over with y's shape, dtype and device (it reduces, casts or refuses a gradient that
    differs), which were x's. So every check holds unless x or weight was swapped since
    (``t.data = ...``, which autograd allows on a saved tensor): x still has grad_y's shape,
    dtype and device, and weight its forward shape and dtype, on x's device. False: the caller
    runs the checks.
    """
    weight_shape, weight_dtype = ctx.params[:2]
    return (
        x.shape == grad_y.shape
        and x.dtype == grad_y.dtype
        and x.device == grad_y.device
        and weight.shape == weight_shape
        and weight.dtype == weight_dtype
        and weight.device == x.device
    )


def _as_param(grad: Tensor, dtype: torch.dtype, shape: torch.Size) -> Tensor:
    """A parameter's gradient from the accumulation dtype: rounded once to the parameter's dtype
    and viewed in its shape, each step only when needed (``.to`` and ``.view`` cost about 1 us of
    host time a call even when they change nothing)."""
    if grad.dtype != dtype:
        grad = grad.to(dtype)
    if grad.shape != shape:
        grad = grad.view(shape)
    return grad


register_autograd("polynorm::forward_triton", torch.ops.polynorm.backward_triton.default)
register_mul_autograd("polynorm::mul_forward_triton", torch.ops.polynorm.mul_backward_triton.default)
