// CPU kernels for polynorm::forward and polynorm::backward, and for the fused PolyNorm x mul
// (polynorm::mul_forward, mul_backward), which run the same row loops (kMul = true).
//
// Rows run in parallel (at::parallel_for). Every sum along a row, and the sum of the
// parameter-gradient partials over rows, is a pairwise sum whose order depends only
// on its length, so the bits are the same on every run and for any thread count.
// Accumulation is in at::opmath_type (fp32 for fp16/bf16/fp32, fp64 for fp64).
#include "polynorm.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <array>
#include <cmath>

namespace polynorm {
namespace {

// Pairwise sum of N running sums over [0, n): term(j, acc) adds element j's terms
// into acc. Blocks of up to 128 are summed in 8 interleaved lanes, longer ranges
// are split in two (at a multiple of 8), as numpy's pairwise sum does. The error
// grows as O(log n) rather than O(n), and the order depends only on n.
template <int N, typename acc_t, typename Term>
std::array<acc_t, N> pairwise_sum(int64_t begin, int64_t n, const Term& term) {
  std::array<acc_t, N> out{};
  if (n <= 128) {
    acc_t lanes[8][N] = {};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      for (int l = 0; l < 8; ++l) term(begin + j + l, lanes[l]);
    }
    for (int l = 0; j < n; ++j, ++l) term(begin + j, lanes[l]);
    for (int k = 0; k < N; ++k) {
      out[k] = ((lanes[0][k] + lanes[1][k]) + (lanes[2][k] + lanes[3][k])) +
               ((lanes[4][k] + lanes[5][k]) + (lanes[6][k] + lanes[7][k]));
    }
    return out;
  }
  const int64_t half = (n / 2) / 8 * 8;
  const auto lo = pairwise_sum<N, acc_t>(begin, half, term);
  const auto hi = pairwise_sum<N, acc_t>(begin + half, n - half, term);
  for (int k = 0; k < N; ++k) out[k] = lo[k] + hi[k];
  return out;
}

// Reads the three weights and the bias in the accumulation type (any float dtype).
template <typename acc_t>
std::array<acc_t, 4> read_params(const at::Tensor& weight, const at::Tensor* bias) {
  const at::Tensor w = weight.reshape({3}).to(c10::CppTypeToScalarType<acc_t>::value);
  std::array<acc_t, 4> p{w[0].template item<acc_t>(), w[1].template item<acc_t>(), w[2].template item<acc_t>(), acc_t(0)};
  if (bias != nullptr) p[3] = bias->reshape({1}).to(c10::CppTypeToScalarType<acc_t>::value)[0].template item<acc_t>();
  return p;
}

// Rows per at::parallel_for task: enough elements per task to amortise scheduling.
int64_t row_grain(int64_t H) { return std::max<int64_t>(1, 32768 / H); }

// y_j in the accumulation type, in the Horner form of docs/MATH.md (Forward): the forward's
// value, and the fused backward's recomputation of it for grad_mul, bit for bit.
template <typename acc_t>
struct PolyCoeffs {
  acc_t a1, a2, a3, b;  // w2 * r_1, w1 * r_2, w0 * r_3, bias
  acc_t y(acc_t v) const { return v * (a1 + v * (a2 + v * a3)) + b; }
};

template <typename acc_t>
PolyCoeffs<acc_t> poly_coeffs(const std::array<acc_t, 4>& p, acc_t r3, acc_t r2, acc_t r1) {
  return {p[2] * r1, p[1] * r2, p[0] * r3, p[3]};
}

// kMul: the fused PolyNorm x mul (docs/MATH.md, "Fused PolyNorm x mul"). The forward then
// writes round(y_acc * mul) instead of round(y_acc): y_acc is never rounded on its own.
template <typename scalar_t, bool kMul>
void poly_norm_fwd_rows(const Rows& x, const Rows* mul, scalar_t* out, at::opmath_type<scalar_t>* rstd,
                        const std::array<at::opmath_type<scalar_t>, 4>& p, double eps) {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* x_data = x.tensor.const_data_ptr<scalar_t>();          // [M, H], row stride x.row_stride
  const scalar_t* mul_data = kMul ? mul->tensor.const_data_ptr<scalar_t>() : nullptr;  // [M, H] or unused
  const int64_t H = x.H;
  at::parallel_for(0, x.M, row_grain(H), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const scalar_t* x_row = x_data + row * x.row_stride;
      scalar_t* out_row = out + row * H;
      // One pass yields sum x^2, x^4, x^6.
      const auto s = pairwise_sum<3, acc_t>(0, H, [&](int64_t j, acc_t* acc) {
        const acc_t v = static_cast<acc_t>(x_row[j]);
        const acc_t v2 = v * v;
        acc[0] += v2;
        acc[1] += v2 * v2;
        acc[2] += v2 * v2 * v2;
      });
      const acc_t inv_h = acc_t(1) / static_cast<acc_t>(H);
      const acc_t r1 = acc_t(1) / std::sqrt(s[0] * inv_h + static_cast<acc_t>(eps));
      const acc_t r2 = acc_t(1) / std::sqrt(s[1] * inv_h + static_cast<acc_t>(eps));
      const acc_t r3 = acc_t(1) / std::sqrt(s[2] * inv_h + static_cast<acc_t>(eps));
      rstd[row * 3 + 0] = r3;
      rstd[row * 3 + 1] = r2;
      rstd[row * 3 + 2] = r1;
      const PolyCoeffs<acc_t> poly = poly_coeffs(p, r3, r2, r1);
      if constexpr (kMul) {
        const scalar_t* mul_row = mul_data + row * mul->row_stride;
        for (int64_t j = 0; j < H; ++j) {
          out_row[j] = static_cast<scalar_t>(poly.y(static_cast<acc_t>(x_row[j])) * static_cast<acc_t>(mul_row[j]));
        }
      } else {
        for (int64_t j = 0; j < H; ++j) out_row[j] = static_cast<scalar_t>(poly.y(static_cast<acc_t>(x_row[j])));
      }
    }
  });
}

// kMul: g_j = grad_out_j * mul_j, formed in acc_t and never rounded, drives PolyNorm's
// backward, and grad_mul_j = round(grad_out_j * y_j) with y_j recomputed from x and rstd.
// p holds the bias too (p[3]) for that recomputation; plain PolyNorm does not use it.
template <typename scalar_t, bool kMul>
void poly_norm_bwd_rows(const Rows& g, const Rows& x, const Rows* mul, const at::opmath_type<scalar_t>* rstd,
                        scalar_t* dx, scalar_t* dmul, at::opmath_type<scalar_t>* row_partials,
                        const std::array<at::opmath_type<scalar_t>, 4>& p) {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* g_data = g.tensor.const_data_ptr<scalar_t>();  // [M, H] grad_y (grad_out)
  const scalar_t* x_data = x.tensor.const_data_ptr<scalar_t>();  // [M, H]
  const scalar_t* mul_data = kMul ? mul->tensor.const_data_ptr<scalar_t>() : nullptr;  // [M, H] or unused
  const int64_t H = x.H;
  at::parallel_for(0, x.M, row_grain(H), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const scalar_t* g_row = g_data + row * g.row_stride;
      const scalar_t* x_row = x_data + row * x.row_stride;
      const scalar_t* mul_row = kMul ? mul_data + row * mul->row_stride : nullptr;
      scalar_t* dx_row = dx + row * H;
      // PolyNorm's incoming gradient at column j.
      const auto grad = [&](int64_t j) -> acc_t {
        if constexpr (kMul) {
          return static_cast<acc_t>(g_row[j]) * static_cast<acc_t>(mul_row[j]);
        } else {
          return static_cast<acc_t>(g_row[j]);
        }
      };
      // S_p = sum g x^p (p = 1, 2, 3) and G = sum g.
      const auto s = pairwise_sum<4, acc_t>(0, H, [&](int64_t j, acc_t* acc) {
        const acc_t gv = grad(j);
        const acc_t v = static_cast<acc_t>(x_row[j]);
        const acc_t gx = gv * v;
        acc[0] += gx;
        acc[1] += gx * v;
        acc[2] += gx * v * v;
        acc[3] += gv;
      });
      const acc_t r3 = rstd[row * 3 + 0], r2 = rstd[row * 3 + 1], r1 = rstd[row * 3 + 2];
      const acc_t inv_h = acc_t(1) / static_cast<acc_t>(H);
      // c_p = w(p) * p * r_p and d_p = c_p * r_p^2 * S_p / H (docs/MATH.md), multiplied as
      // c_p * ((r_p * S_p / H) * r_p): r_p * S_p / H stays near the size of x^p * g, where
      // r_p^3 alone under- or overflows fp32 for |x| >~ 3e4 (r_3^3 ~ |x|^-9) or tiny rows.
      const acc_t c1 = p[2] * r1, c2 = acc_t(2) * p[1] * r2, c3 = acc_t(3) * p[0] * r3;
      const acc_t d1 = c1 * ((r1 * s[0] * inv_h) * r1);
      const acc_t d2 = c2 * ((r2 * s[1] * inv_h) * r2);
      const acc_t d3 = c3 * ((r3 * s[2] * inv_h) * r3);
      for (int64_t j = 0; j < H; ++j) {
        const acc_t gv = grad(j);
        const acc_t v = static_cast<acc_t>(x_row[j]);
        const acc_t v2 = v * v;
        dx_row[j] = static_cast<scalar_t>(gv * (c1 + v * (c2 + v * c3)) - v * (d1 + v2 * (d2 + v2 * d3)));
      }
      if constexpr (kMul) {
        const PolyCoeffs<acc_t> poly = poly_coeffs(p, r3, r2, r1);  // the forward's y_j, bit for bit
        scalar_t* dmul_row = dmul + row * H;
        for (int64_t j = 0; j < H; ++j) {
          dmul_row[j] = static_cast<scalar_t>(static_cast<acc_t>(g_row[j]) * poly.y(static_cast<acc_t>(x_row[j])));
        }
      }
      // This row's share of dw0, dw1, dw2, db.
      row_partials[row * 4 + 0] = r3 * s[2];
      row_partials[row * 4 + 1] = r2 * s[1];
      row_partials[row * 4 + 2] = r1 * s[0];
      row_partials[row * 4 + 3] = s[3];
    }
  });
}

// The forward of PolyNorm (mul == nullptr) or of the fused PolyNorm x mul: out [x's shape,
// contiguous] and rstd [M, 3] (r_3, r_2, r_1) in the accumulation dtype.
std::tuple<at::Tensor, at::Tensor> forward_cpu(const at::Tensor& x, const at::Tensor* mul, const at::Tensor& weight,
                                               const at::Tensor& bias, double eps) {
  const Rows x_rows = as_rows(x);
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor rstd = at::empty({x_rows.M, 3}, x.options().dtype(opmath_dtype(x.scalar_type())));
  if (x_rows.M == 0) return {out, rstd};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "polynorm.forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto p = read_params<acc_t>(weight, &bias);
    scalar_t* out_data = out.mutable_data_ptr<scalar_t>();
    acc_t* rstd_data = rstd.mutable_data_ptr<acc_t>();
    if (mul != nullptr) {
      const Rows mul_rows = as_rows(*mul);
      poly_norm_fwd_rows<scalar_t, true>(x_rows, &mul_rows, out_data, rstd_data, p, eps);
    } else {
      poly_norm_fwd_rows<scalar_t, false>(x_rows, nullptr, out_data, rstd_data, p, eps);
    }
  });
  return {out, rstd};
}

// The backward of PolyNorm (mul == nullptr; grad_mul stays undefined) or of the fused
// PolyNorm x mul. grad_x (and grad_mul) [x's shape, contiguous] in x's dtype; grad_weight (3,)
// and grad_bias (1,) in the accumulation dtype: autograd rounds each to its own parameter's
// dtype, once. bias is read only for the fused op's recomputation of y.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                                                        const at::Tensor* mul,
                                                                        const at::Tensor& weight,
                                                                        const at::Tensor* bias,
                                                                        const at::Tensor& rstd) {
  const Rows x_rows = as_rows(x);
  const Rows g_rows = as_rows(grad);
  const at::Tensor rstd_c = rstd.contiguous();
  const auto acc_dtype = opmath_dtype(x.scalar_type());
  const auto like_x = x.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor grad_x = at::empty(x.sizes(), like_x);
  at::Tensor grad_mul = mul != nullptr ? at::empty(x.sizes(), like_x) : at::Tensor();
  if (x_rows.M == 0) {
    return {grad_x, grad_mul, at::zeros({3}, x.options().dtype(acc_dtype)), at::zeros({1}, x.options().dtype(acc_dtype))};
  }
  at::Tensor grad_weight = at::empty({3}, x.options().dtype(acc_dtype));
  at::Tensor grad_bias = at::empty({1}, x.options().dtype(acc_dtype));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "polynorm.backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    // O(M) partials, one row each, reduced below in a fixed pairwise order.
    at::Tensor row_partials = at::empty({x_rows.M, 4}, x.options().dtype(acc_dtype));
    acc_t* part = row_partials.mutable_data_ptr<acc_t>();
    const acc_t* rstd_data = rstd_c.const_data_ptr<acc_t>();
    const auto p = read_params<acc_t>(weight, bias);
    if (mul != nullptr) {
      const Rows mul_rows = as_rows(*mul);
      poly_norm_bwd_rows<scalar_t, true>(g_rows, x_rows, &mul_rows, rstd_data, grad_x.mutable_data_ptr<scalar_t>(),
                                         grad_mul.mutable_data_ptr<scalar_t>(), part, p);
    } else {
      poly_norm_bwd_rows<scalar_t, false>(g_rows, x_rows, nullptr, rstd_data, grad_x.mutable_data_ptr<scalar_t>(),
                                          nullptr, part, p);
    }
    const auto total = pairwise_sum<4, acc_t>(0, x_rows.M, [&](int64_t r, acc_t* acc) {
      for (int k = 0; k < 4; ++k) acc[k] += part[r * 4 + k];
    });
    for (int k = 0; k < 3; ++k) grad_weight.mutable_data_ptr<acc_t>()[k] = total[k];
    grad_bias.mutable_data_ptr<acc_t>()[0] = total[3];
  });
  return {grad_x, grad_mul, grad_weight, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> poly_norm_forward_cpu(const at::Tensor& x, const at::Tensor& weight,
                                                         const at::Tensor& bias, double eps) {
  check_forward_args(x, weight, bias, eps);
  return forward_cpu(x, nullptr, weight, bias, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> poly_norm_backward_cpu(const at::Tensor& grad_y, const at::Tensor& x,
                                                                      const at::Tensor& weight,
                                                                      const at::Tensor& rstd) {
  check_backward_args(grad_y, x, weight, rstd);
  auto [grad_x, grad_mul, grad_weight, grad_bias] = backward_cpu(grad_y, x, nullptr, weight, nullptr, rstd);
  return {grad_x, grad_weight, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> poly_norm_mul_forward_cpu(const at::Tensor& x, const at::Tensor& mul,
                                                             const at::Tensor& weight, const at::Tensor& bias,
                                                             double eps) {
  check_mul_forward_args(x, mul, weight, bias, eps);
  return forward_cpu(x, &mul, weight, bias, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> poly_norm_mul_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& mul, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& rstd) {
  check_mul_backward_args(grad_out, x, mul, weight, bias, rstd);
  return backward_cpu(grad_out, x, &mul, weight, &bias, rstd);
}

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, CPU, m) {
  m.impl("forward", &poly_norm_forward_cpu);
  m.impl("backward", &poly_norm_backward_cpu);
  m.impl("mul_forward", &poly_norm_mul_forward_cpu);
  m.impl("mul_backward", &poly_norm_mul_backward_cpu);
}

}  // namespace polynorm
