// PolyNorm's math (docs/MATH.md), written once for the CPU kernels (cpu_rows.h) and the CUDA
// kernels (cuda/forward*.cuh, cuda/backward*.cuh). Each function is the expression every kernel
// evaluates, in its order of operations; the Triton kernels' helpers (polynorm/triton_math.py)
// have the same names and follow the same equations in the same order. The backends still differ in their bits: nvcc contracts a * b + c into one FMA
// (-fmad=true, its default) where g++ for x86-64 has no FMA to contract into, and each backend
// sums a row in its own order.
//
// Named polynorm_math.h, not math.h: csrc is an include directory (-I), where a math.h would
// shadow the C library's <math.h> for every header that includes it.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define POLYNORM_HD __host__ __device__ __forceinline__
#else
#define POLYNORM_HD inline
#endif

namespace polynorm {

// MATH.md (1): adds one element's terms to a row's sums [sum x^2, sum x^4, sum x^6], which one
// pass over the row collects together (every kernel then reduces the three at once).
template <typename acc_t>
POLYNORM_HD void add_row_sums(acc_t* s, acc_t x) {
  const acc_t x2 = x * x;
  s[0] += x2;
  s[1] += x2 * x2;
  s[2] += x2 * x2 * x2;
}

// MATH.md (1)-(2): r_p = 1 / sqrt(m_p + eps), m_p = sum * inv_h (inv_h = 1 / H), from the row's
// sum of x^(2p). A correctly rounded division and square root, not rsqrt (approximate on the GPU),
// once a row, so the cost does not show.
template <typename acc_t>
POLYNORM_HD acc_t rstd_of(acc_t sum, acc_t inv_h, acc_t eps) {
#if defined(__CUDA_ARCH__)
  return acc_t(1) / sqrt(sum * inv_h + eps);
#else
  return acc_t(1) / std::sqrt(sum * inv_h + eps);
#endif
}

// MATH.md (3): y's Horner coefficients, formed once a row.
template <typename acc_t>
struct HornerCoeffs {
  acc_t a1, a2, a3;  // w2 r_1, w1 r_2, w0 r_3
};

template <typename acc_t>
POLYNORM_HD HornerCoeffs<acc_t> forward_coeffs(acc_t w0, acc_t w1, acc_t w2, acc_t r3, acc_t r2, acc_t r1) {
  const acc_t a3 = w0 * r3, a2 = w1 * r2, a1 = w2 * r1;
  return {a1, a2, a3};
}

// MATH.md (3): y = x (a_1 + x (a_2 + x a_3)) + b, three FMAs an element. The fused op multiplies
// this unrounded y by mul (MATH.md (8)) and its backward by grad_out (MATH.md (10)).
template <typename acc_t>
POLYNORM_HD acc_t poly_value(acc_t x, const HornerCoeffs<acc_t>& a, acc_t b) {
  return x * (a.a1 + x * (a.a2 + x * a.a3)) + b;
}

// MATH.md (4): adds one element's terms to a row's gradient sums [S_1, S_2, S_3, G], S_p = sum g x^p,
// G = sum g (g: dL/dy; the fused op's G_j mul_j, MATH.md (9)).
template <typename acc_t>
POLYNORM_HD void add_row_grad_sums(acc_t* s, acc_t x, acc_t g) {
  const acc_t gx = g * x;
  s[0] += gx;
  s[1] += gx * x;
  s[2] += gx * x * x;
  s[3] += g;
}

// MATH.md (5): the coefficients of dx, formed once a row.
template <typename acc_t>
struct GradCoeffs {
  acc_t c1, c2, c3, d1, d2, d3;
};

// c_p = w(p) p r_p and d_p = c_p r_p^2 S_p / H, multiplied as c_p ((r_p S_p / H) r_p): r_p S_p / H
// stays near the size of x^p g, where r_p^3 alone leaves fp32's range for |x| >~ 3e4 (r_3^3 ~
// |x|^-9) or for tiny rows with eps = 0.
template <typename acc_t>
POLYNORM_HD GradCoeffs<acc_t> backward_coeffs(acc_t w0, acc_t w1, acc_t w2, acc_t r3, acc_t r2, acc_t r1, acc_t S1,
                                              acc_t S2, acc_t S3, acc_t inv_h) {
  const acc_t c1 = w2 * r1, c2 = acc_t(2) * w1 * r2, c3 = acc_t(3) * w0 * r3;
  const acc_t d1 = c1 * ((r1 * S1 * inv_h) * r1);
  const acc_t d2 = c2 * ((r2 * S2 * inv_h) * r2);
  const acc_t d3 = c3 * ((r3 * S3 * inv_h) * r3);
  return {c1, c2, c3, d1, d2, d3};
}

// MATH.md (6): dx_j = g_j (c_1 + x_j (c_2 + x_j c_3)) - x_j (d_1 + x_j^2 (d_2 + x_j^2 d_3)).
template <typename acc_t>
POLYNORM_HD acc_t grad_x_value(acc_t x, acc_t g, const GradCoeffs<acc_t>& k) {
  const acc_t x2 = x * x;
  return g * (k.c1 + x * (k.c2 + x * k.c3)) - x * (k.d1 + x2 * (k.d2 + x2 * k.d3));
}

}  // namespace polynorm
