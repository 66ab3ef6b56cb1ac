// The CPU row code of PolyNorm, written once: polynorm::forward / backward and the fused
// PolyNorm x mul (polynorm_cpu.cpp), and the grouped ops (polynorm_grouped_cpu.cpp), run these
// row loops. They differ only in how a row finds its parameters [w0, w1, w2, b]:
// polynorm_cpu.cpp passes SameParams (one set for every row), the grouped ops look up each
// row's expert. So a grouped row is computed bit for bit as the single-expert op computes it.
//
// Rows run in parallel (at::parallel_for). Every sum along a row, and the sum of the
// parameter-gradient partials over rows, is a pairwise sum whose order depends only on its
// length, so the bits are the same on every run and for any thread count. Accumulation is in
// at::opmath_type (fp32 for fp16/bf16/fp32, fp64 for fp64).
#pragma once

#include "polynorm.h"
#include "polynorm_math.h"

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <array>
#include <cstdint>

namespace polynorm {
namespace {  // each including file gets its own copy, as the kernels of csrc/cuda/ do

// Pairwise sum of N running sums over [begin, begin + n): term(j, acc) adds element j's terms
// into acc. Blocks of up to 128 are summed in 8 interleaved lanes, longer ranges are split in
// two (at a multiple of 8), as numpy's pairwise sum does. The error grows as O(log n) rather
// than O(n), and the order depends only on n.
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

// Rows per at::parallel_for task: enough elements per task to amortise scheduling.
int64_t row_grain(int64_t H) { return std::max<int64_t>(1, 32768 / H); }

// One row's parameters in the accumulation type: [w0, w1, w2, b] (w0 scales the cubic term).
template <typename acc_t>
using Params = std::array<acc_t, 4>;

// Reads the three weights and (when given) the bias in the accumulation type (any float dtype).
template <typename acc_t>
Params<acc_t> read_params(const at::Tensor& weight, const at::Tensor* bias) {
  const at::Tensor w = weight.reshape({3}).to(c10::CppTypeToScalarType<acc_t>::value);
  Params<acc_t> p{w[0].template item<acc_t>(), w[1].template item<acc_t>(), w[2].template item<acc_t>(), acc_t(0)};
  if (bias != nullptr) p[3] = bias->reshape({1}).to(c10::CppTypeToScalarType<acc_t>::value)[0].template item<acc_t>();
  return p;
}

// The parameter lookup of plain PolyNorm: every row has the same parameters. (A lookup is
// called as params_of(row) and returns the row's Params, or nullptr for a row that belongs to
// no one: the grouped ops' rows past the last expert.)
template <typename acc_t>
struct SameParams {
  Params<acc_t> p;
  const Params<acc_t>* operator()(int64_t /*row*/) const { return &p; }
};

// The forward over x's rows: out [M, H] contiguous (y, or round(y_acc * mul) when kMul) and
// rstd [M, 3] (r_3, r_2, r_1) in the accumulation type. kMul: the fused PolyNorm x mul
// (MATH.md (8)): y_acc is never rounded on its own. A row whose
// lookup gives nullptr is not read; its out and rstd are 0.
template <typename scalar_t, bool kMul, typename ParamsOf>
void poly_norm_fwd_rows(const Rows& x, const Rows* mul, scalar_t* out, at::opmath_type<scalar_t>* rstd,
                        const ParamsOf& params_of, double eps) {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* x_data = x.tensor.const_data_ptr<scalar_t>();                         // [M, H], row stride x.row_stride
  const scalar_t* mul_data = kMul ? mul->tensor.const_data_ptr<scalar_t>() : nullptr;  // [M, H] or unused
  const int64_t H = x.H;
  at::parallel_for(0, x.M, row_grain(H), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      scalar_t* out_row = out + row * H;
      const Params<acc_t>* p = params_of(row);
      if (p == nullptr) {  // a row of no expert: not read
        std::fill(out_row, out_row + H, scalar_t(0));
        std::fill(rstd + row * 3, rstd + row * 3 + 3, acc_t(0));
        continue;
      }
      const scalar_t* x_row = x_data + row * x.row_stride;
      // One pass yields sum x^2, x^4, x^6 (MATH.md (1)).
      const auto s = pairwise_sum<3, acc_t>(0, H, [&](int64_t j, acc_t* acc) {
        add_row_sums(acc, static_cast<acc_t>(x_row[j]));
      });
      const acc_t inv_h = acc_t(1) / static_cast<acc_t>(H);
      const acc_t e = static_cast<acc_t>(eps);
      const acc_t r1 = rstd_of(s[0], inv_h, e), r2 = rstd_of(s[1], inv_h, e), r3 = rstd_of(s[2], inv_h, e);
      rstd[row * 3 + 0] = r3;
      rstd[row * 3 + 1] = r2;
      rstd[row * 3 + 2] = r1;
      const auto& [w0, w1, w2, b] = *p;
      const HornerCoeffs<acc_t> a = forward_coeffs(w0, w1, w2, r3, r2, r1);
      if constexpr (kMul) {  // MATH.md (8): y_j unrounded, times mul_j, rounded once
        const scalar_t* mul_row = mul_data + row * mul->row_stride;
        for (int64_t j = 0; j < H; ++j) {
          out_row[j] = static_cast<scalar_t>(poly_value(static_cast<acc_t>(x_row[j]), a, b) *
                                             static_cast<acc_t>(mul_row[j]));
        }
      } else {
        for (int64_t j = 0; j < H; ++j) out_row[j] = static_cast<scalar_t>(poly_value(static_cast<acc_t>(x_row[j]), a, b));
      }
    }
  });
}

// The backward over x's rows: dx [M, H] contiguous and row_partials [M, 4], each row's
// [r_3 S_3, r_2 S_2, r_1 S_1, G] (its share of dw0, dw1, dw2, db: MATH.md (7)).
// kMul: g_j = grad_out_j * mul_j, formed in acc_t and never rounded, drives PolyNorm's
// backward, and dmul_j = round(grad_out_j * y_j) with y_j recomputed from x and rstd (the
// lookup's bias is read only for that). A row whose lookup gives nullptr is not read: its dx
// (and dmul) and partials are 0.
template <typename scalar_t, bool kMul, typename ParamsOf>
void poly_norm_bwd_rows(const Rows& g, const Rows& x, const Rows* mul, const at::opmath_type<scalar_t>* rstd,
                        scalar_t* dx, scalar_t* dmul, at::opmath_type<scalar_t>* row_partials,
                        const ParamsOf& params_of) {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* g_data = g.tensor.const_data_ptr<scalar_t>();                         // [M, H] grad_y (grad_out)
  const scalar_t* x_data = x.tensor.const_data_ptr<scalar_t>();                         // [M, H]
  const scalar_t* mul_data = kMul ? mul->tensor.const_data_ptr<scalar_t>() : nullptr;  // [M, H] or unused
  const int64_t H = x.H;
  at::parallel_for(0, x.M, row_grain(H), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      scalar_t* dx_row = dx + row * H;
      scalar_t* dmul_row = kMul ? dmul + row * H : nullptr;
      const Params<acc_t>* p = params_of(row);
      if (p == nullptr) {  // a row of no expert: not read, no gradient
        std::fill(dx_row, dx_row + H, scalar_t(0));
        if constexpr (kMul) std::fill(dmul_row, dmul_row + H, scalar_t(0));
        std::fill(row_partials + row * 4, row_partials + row * 4 + 4, acc_t(0));
        continue;
      }
      const scalar_t* g_row = g_data + row * g.row_stride;
      const scalar_t* x_row = x_data + row * x.row_stride;
      const scalar_t* mul_row = kMul ? mul_data + row * mul->row_stride : nullptr;
      // PolyNorm's incoming gradient at column j (the fused op's: MATH.md (9)).
      const auto grad = [&](int64_t j) -> acc_t {
        if constexpr (kMul) {
          return static_cast<acc_t>(g_row[j]) * static_cast<acc_t>(mul_row[j]);
        } else {
          return static_cast<acc_t>(g_row[j]);
        }
      };
      // S_p = sum g x^p (p = 1, 2, 3) and G = sum g (MATH.md (4)).
      const auto s = pairwise_sum<4, acc_t>(0, H, [&](int64_t j, acc_t* acc) {
        add_row_grad_sums(acc, static_cast<acc_t>(x_row[j]), grad(j));
      });
      const acc_t r3 = rstd[row * 3 + 0], r2 = rstd[row * 3 + 1], r1 = rstd[row * 3 + 2];
      const acc_t inv_h = acc_t(1) / static_cast<acc_t>(H);
      const auto& [w0, w1, w2, b] = *p;
      const GradCoeffs<acc_t> k = backward_coeffs(w0, w1, w2, r3, r2, r1, s[0], s[1], s[2], inv_h);
      for (int64_t j = 0; j < H; ++j) {
        dx_row[j] = static_cast<scalar_t>(grad_x_value(static_cast<acc_t>(x_row[j]), grad(j), k));
      }
      if constexpr (kMul) {  // MATH.md (10): the forward's y_j, bit for bit, times grad_out_j
        const HornerCoeffs<acc_t> a = forward_coeffs(w0, w1, w2, r3, r2, r1);
        for (int64_t j = 0; j < H; ++j) {
          dmul_row[j] = static_cast<scalar_t>(static_cast<acc_t>(g_row[j]) * poly_value(static_cast<acc_t>(x_row[j]), a, b));
        }
      }
      // This row's share of dw0, dw1, dw2, db (MATH.md (7)).
      row_partials[row * 4 + 0] = r3 * s[2];
      row_partials[row * 4 + 1] = r2 * s[1];
      row_partials[row * 4 + 2] = r1 * s[0];
      row_partials[row * 4 + 3] = s[3];
    }
  });
}

// The sum of rows [begin, begin + n) of the [M, 4] row partials: [dw0, dw1, dw2, db], in a
// pairwise order that depends only on n.
template <typename acc_t>
std::array<acc_t, 4> sum_partials(const acc_t* row_partials, int64_t begin, int64_t n) {
  return pairwise_sum<4, acc_t>(begin, n, [&](int64_t r, acc_t* acc) {
    for (int k = 0; k < 4; ++k) acc[k] += row_partials[r * 4 + k];
  });
}

}  // namespace
}  // namespace polynorm
