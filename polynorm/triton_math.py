"""PolyNorm's math for the Triton kernels, written once (``docs/MATH.md``, equations (1)-(6)).

The plain and fused kernels (:mod:`polynorm.triton_kernels`) and the grouped ones
(:mod:`polynorm.triton_grouped`) call these functions for every formula; the C++ CPU and CUDA
kernels use the same names and the same order of operations (``csrc``). Each function is the
expression the kernels evaluate, in its order: a change of order changes the bits, which the
tests hold to be the same on every run and across batch sizes.

Triton inlines every ``@triton.jit`` call, so a helper costs nothing over writing its body in
place. Values are in the accumulation dtype (fp32, fp64 for fp64 inputs). Tiles are
``[BLOCK_M, BLOCK_H]`` (rows by columns); per-row values are ``[BLOCK_M]``; the per-row
coefficients come back as ``[BLOCK_M, 1]`` columns, ready to broadcast over a tile.
"""

import triton
import triton.language as tl

__all__ = [
    "add_row_grad_sums",
    "add_row_sums",
    "backward_coeffs",
    "forward_coeffs",
    "grad_x_value",
    "inv_h_of",
    "poly_value",
    "row_grad_sums",
    "row_sums",
    "rstd_of",
]


@triton.jit
def _div_rn(a, b):
    # IEEE-rounded a / b. Plain fp32 `/` and tl.sqrt compile to approximate forms; div_rn and
    # sqrt_rn take fp32 only, and fp64 `/` and tl.sqrt are IEEE-rounded already.
    if a.dtype.is_fp64():
        q = a / b
    else:
        q = tl.div_rn(a, b)
    return q


@triton.jit
def _sqrt_rn(a):
    # IEEE-rounded square root: see _div_rn.
    if a.dtype.is_fp64():
        r = tl.sqrt(a)
    else:
        r = tl.sqrt_rn(a)
    return r


@triton.jit
def inv_h_of(H, ACC: tl.constexpr):
    # 1 / H, IEEE-rounded, in ACC. MATH.md (1) forms the mean as the sum times 1/H, as every
    # backend does: one division a program instead of one a row, and the same mean on every
    # backend for the same sum.
    return _div_rn(tl.full([], 1.0, ACC), tl.full([], H, ACC))


# The sums of MATH.md (1) and (4) take each power as the product of the one before and x^2 (or
# x): x^4 = x^2 x^2, x^6 = x^4 x^2; g x^2 = (g x) x, g x^3 = (g x^2) x. row_sums and add_row_sums
# (row_grad_sums and add_row_grad_sums) form them in the same order, so a row's terms have the
# same bits whether it fits one block or not. Each product is written where it is used: forming
# x^6 before the first sum would move instructions in the generated code.


@triton.jit
def row_sums(x):
    # MATH.md (1): [sum x^2, sum x^4, sum x^6] of each row of the tile x, in one pass.
    x2 = x * x
    x4 = x2 * x2
    return tl.sum(x2, axis=1), tl.sum(x4, axis=1), tl.sum(x4 * x2, axis=1)


@triton.jit
def add_row_sums(a1, a2, a3, x):
    # MATH.md (1) over a row longer than one block: adds the terms of the tile x to the running
    # tiles a1, a2, a3, which the caller reduces once after the last column block.
    x2 = x * x
    x4 = x2 * x2
    return a1 + x2, a2 + x4, a3 + x4 * x2


@triton.jit
def rstd_of(s, inv_h, eps):
    # MATH.md (1)-(2): r_p = 1 / sqrt(s * inv_h + eps) from a row's sum s of x^(2p). An
    # IEEE-rounded division and square root, not rsqrt (approximate); once a row, so the cost
    # does not show.
    return _div_rn(tl.full(s.shape, 1.0, s.dtype), _sqrt_rn(s * inv_h + eps))


@triton.jit
def forward_coeffs(w0, w1, w2, r3, r2, r1):
    # MATH.md (3): (a_1, a_2, a_3) = (w2 r_1, w1 r_2, w0 r_3), formed once a row, as columns.
    return (w2 * r1)[:, None], (w1 * r2)[:, None], (w0 * r3)[:, None]


@triton.jit
def poly_value(x, a1, a2, a3, b):
    # MATH.md (3): y = x (a_1 + x (a_2 + x a_3)) + b, 3 FMAs an element. The forward and the
    # fused backward's recompute of y (MATH.md (10)) both call this: the same bits.
    return tl.fma(x, tl.fma(x, tl.fma(x, a3, a2), a1), b)


@triton.jit
def row_grad_sums(x, g):
    # MATH.md (4): [S_1, S_2, S_3, G] of each row of the tiles x and g (g = dL/dy; the fused
    # op's grad_out * mul, MATH.md (9)), in one pass.
    gx = g * x
    gx2 = gx * x
    return tl.sum(gx, axis=1), tl.sum(gx2, axis=1), tl.sum(gx2 * x, axis=1), tl.sum(g, axis=1)


@triton.jit
def add_row_grad_sums(a1, a2, a3, ag, x, g):
    # MATH.md (4) over a row longer than one block: see add_row_sums.
    gx = g * x
    gx2 = gx * x
    return a1 + gx, a2 + gx2, a3 + gx2 * x, ag + g


@triton.jit
def backward_coeffs(w0, w1, w2, r3, r2, r1, s1, s2, s3, inv_h):
    # MATH.md (5): c_p = w(p) p r_p and d_p = c_p r_p^2 S_p / H, as columns. d_p is multiplied
    # as c_p ((r_p S_p / H) r_p): r_p S_p / H stays near the size of x^p g, where r_p^3 alone
    # leaves fp32's range for |x| ~ 3e4 (r_3^3 ~ |x|^-9) or for tiny rows with eps = 0.
    c1 = w2 * r1
    c2 = 2.0 * w1 * r2
    c3 = 3.0 * w0 * r3
    d1 = c1 * ((r1 * s1 * inv_h) * r1)
    d2 = c2 * ((r2 * s2 * inv_h) * r2)
    d3 = c3 * ((r3 * s3 * inv_h) * r3)
    return c1[:, None], c2[:, None], c3[:, None], d1[:, None], d2[:, None], d3[:, None]


@triton.jit
def grad_x_value(x, g, c1, c2, c3, d1, d2, d3):
    # MATH.md (6): dx = g (c_1 + x (c_2 + x c_3)) - x (d_1 + x^2 (d_2 + x^2 d_3)), two Horner
    # forms of 2 FMAs each.
    x2 = x * x
    return g * tl.fma(x, tl.fma(x, c3, c2), c1) - x * tl.fma(x2, tl.fma(x2, d3, d2), d1)
