// CPU kernels for polynorm::forward and polynorm::backward.
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

template <typename scalar_t>
void poly_norm_fwd_rows(const Rows& x, scalar_t* y, at::opmath_type<scalar_t>* rstd,
                        const std::array<at::opmath_type<scalar_t>, 4>& p, double eps) {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* x_data = x.tensor.const_data_ptr<scalar_t>();
  const int64_t H = x.H;
  at::parallel_for(0, x.M, row_grain(H), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const scalar_t* x_row = x_data + row * x.row_stride;
      scalar_t* y_row = y + row * H;
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
      const acc_t a3 = p[0] * r3, a2 = p[1] * r2, a1 = p[2] * r1, b = p[3];
      for (int64_t j = 0; j < H; ++j) {
        const acc_t v = static_cast<acc_t>(x_row[j]);
        y_row[j] = static_cast<scalar_t>(v * (a1 + v * (a2 + v * a3)) + b);  // Horner form
      }
    }
  });
}

template <typename scalar_t>
void poly_norm_bwd_rows(const Rows& g, const Rows& x, const at::opmath_type<scalar_t>* rstd, scalar_t* dx,
                        at::opmath_type<scalar_t>* row_partials, const std::array<at::opmath_type<scalar_t>, 4>& p) {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* g_data = g.tensor.const_data_ptr<scalar_t>();
  const scalar_t* x_data = x.tensor.const_data_ptr<scalar_t>();
  const int64_t H = x.H;
  at::parallel_for(0, x.M, row_grain(H), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const scalar_t* g_row = g_data + row * g.row_stride;
      const scalar_t* x_row = x_data + row * x.row_stride;
      scalar_t* dx_row = dx + row * H;
      // S_p = sum g x^p (p = 1, 2, 3) and G = sum g.
      const auto s = pairwise_sum<4, acc_t>(0, H, [&](int64_t j, acc_t* acc) {
        const acc_t gv = static_cast<acc_t>(g_row[j]);
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
        const acc_t gv = static_cast<acc_t>(g_row[j]);
        const acc_t v = static_cast<acc_t>(x_row[j]);
        const acc_t v2 = v * v;
        dx_row[j] = static_cast<scalar_t>(gv * (c1 + v * (c2 + v * c3)) - v * (d1 + v2 * (d2 + v2 * d3)));
      }
      // This row's share of dw0, dw1, dw2, db.
      row_partials[row * 4 + 0] = r3 * s[2];
      row_partials[row * 4 + 1] = r2 * s[1];
      row_partials[row * 4 + 2] = r1 * s[0];
      row_partials[row * 4 + 3] = s[3];
    }
  });
}

std::tuple<at::Tensor, at::Tensor> poly_norm_forward_cpu(const at::Tensor& x, const at::Tensor& weight,
                                                         const at::Tensor& bias, double eps) {
  check_forward_args(x, weight, bias, eps);
  const Rows rows = as_rows(x);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor rstd = at::empty({rows.M, 3}, x.options().dtype(opmath_dtype(x.scalar_type())));
  if (rows.M == 0) return {y, rstd};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "polynorm.forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    poly_norm_fwd_rows<scalar_t>(rows, y.mutable_data_ptr<scalar_t>(), rstd.mutable_data_ptr<acc_t>(),
                                 read_params<acc_t>(weight, &bias), eps);
  });
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> poly_norm_backward_cpu(const at::Tensor& grad_y, const at::Tensor& x,
                                                                      const at::Tensor& weight,
                                                                      const at::Tensor& rstd) {
  check_backward_args(grad_y, x, weight, rstd);
  const Rows x_rows = as_rows(x);
  const Rows g_rows = as_rows(grad_y);
  const at::Tensor rstd_c = rstd.contiguous();
  const auto acc_dtype = opmath_dtype(x.scalar_type());
  at::Tensor grad_x = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (x_rows.M == 0) {
    return {grad_x, at::zeros({3}, x.options().dtype(acc_dtype)), at::zeros({1}, x.options().dtype(acc_dtype))};
  }
  at::Tensor grad_weight = at::empty({3}, x.options().dtype(acc_dtype));
  at::Tensor grad_bias = at::empty({1}, x.options().dtype(acc_dtype));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "polynorm.backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    // O(M) partials, one row each, reduced below in a fixed pairwise order.
    at::Tensor row_partials = at::empty({x_rows.M, 4}, x.options().dtype(acc_dtype));
    acc_t* part = row_partials.mutable_data_ptr<acc_t>();
    poly_norm_bwd_rows<scalar_t>(g_rows, x_rows, rstd_c.const_data_ptr<acc_t>(), grad_x.mutable_data_ptr<scalar_t>(),
                                 part, read_params<acc_t>(weight, nullptr));
    const auto total = pairwise_sum<4, acc_t>(0, x_rows.M, [&](int64_t r, acc_t* acc) {
      for (int k = 0; k < 4; ++k) acc[k] += part[r * 4 + k];
    });
    for (int k = 0; k < 3; ++k) grad_weight.mutable_data_ptr<acc_t>()[k] = total[k];
    grad_bias.mutable_data_ptr<acc_t>()[0] = total[3];
  });
  // In the accumulation dtype: autograd rounds each to its own parameter's dtype, once.
  return {grad_x, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, CPU, m) {
  m.impl("forward", &poly_norm_forward_cpu);
  m.impl("backward", &poly_norm_backward_cpu);
}

}  // namespace polynorm
