// CPU kernels for polynorm::grouped_forward and polynorm::grouped_backward: PolyNorm with one
// [w0, w1, w2, b] per expert, for mixture-of-experts layers whose rows arrive sorted by expert.
//
// Expert e owns rows [offsets[e-1], offsets[e]) (offsets[-1] := 0); a row's expert is found by
// a binary search of offsets, and the row is then computed exactly as polynorm::forward and
// polynorm::backward compute it on the CPU (polynorm_cpu.cpp: the same pairwise sums and the
// same order of operations), with that expert's parameters. Rows at or past offsets[E-1]
// belong to no expert: they are not read; y, rstd and grad_x are 0 there.
//
// Parameter gradients: each row writes its [r_3 S_3, r_2 S_2, r_1 S_1, G] (docs/MATH.md) to
// an [M, 4] buffer, and each expert's four sums are the pairwise sum of its own segment, whose
// order depends only on the segment's length. So an expert's dW and dB are bitwise those of
// polynorm::backward run on that expert's rows alone, whatever the other experts hold, on
// every run and for any thread count. Accumulation is in at::opmath_type (fp32, fp64 for
// fp64 x).
//
// Offsets are read in place (int32 or int64). Values that decrease, are negative or exceed M
// give undefined results but never read or write out of bounds: the search only ever yields
// an expert in [0, E], and each segment is clamped to [0, M].
#include "polynorm.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace polynorm {
namespace {

// Pairwise sum of N running sums over [begin, begin + n): term(j, acc) adds element j's terms
// into acc. The same function as polynorm_cpu.cpp's (blocks of up to 128 in 8 interleaved
// lanes, longer ranges split in two at a multiple of 8): its order depends only on n, which is
// what makes a grouped row, and an expert's parameter gradients, bitwise those of the
// single-expert op. TODO(merge): one shared header for both files.
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

// The per-row parameter lookup: expert e's [w0, w1, w2, b] in the accumulation type, and the
// expert of each row. offsets are read in place, in their own integer type.
template <typename acc_t, typename index_t>
struct ExpertParams {
  std::vector<std::array<acc_t, 4>> params;  // [E][w0, w1, w2, b]
  const index_t* offsets;                    // [E] cumulative end offsets, o_stride apart
  int64_t o_stride;
  int64_t E;
  int64_t M;

  ExpertParams(const at::Tensor& weight, const at::Tensor* bias, const at::Tensor& offsets_, int64_t M_)
      : params(weight.size(0)),
        offsets(offsets_.const_data_ptr<index_t>()),
        o_stride(offsets_.stride(0)),
        E(weight.size(0)),
        M(M_) {
    const auto acc = c10::CppTypeToScalarType<acc_t>::value;
    const at::Tensor w = weight.to(acc).contiguous();  // [E, 3]: E * 3 numbers
    const acc_t* w_data = w.const_data_ptr<acc_t>();
    for (int64_t e = 0; e < E; ++e) params[e] = {w_data[e * 3 + 0], w_data[e * 3 + 1], w_data[e * 3 + 2], acc_t(0)};
    if (bias != nullptr) {
      const at::Tensor b = bias->reshape({E}).to(acc).contiguous();
      const acc_t* b_data = b.const_data_ptr<acc_t>();
      for (int64_t e = 0; e < E; ++e) params[e][3] = b_data[e];
    }
  }

  int64_t offset(int64_t e) const { return static_cast<int64_t>(offsets[e * o_stride]); }

  // The first e with offsets[e] > row: row's expert, or E for a row of no expert.
  int64_t expert_of(int64_t row) const {
    int64_t lo = 0, hi = E;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (offset(mid) <= row) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }

  // Row's parameters, or nullptr for a row of no expert.
  const std::array<acc_t, 4>* operator()(int64_t row) const {
    const int64_t e = expert_of(row);
    return e < E ? &params[e] : nullptr;
  }

  // Expert e's rows, [begin, end), clamped to [0, M] (and empty where offsets decrease).
  std::pair<int64_t, int64_t> segment(int64_t e) const {
    const int64_t begin = e == 0 ? 0 : std::clamp<int64_t>(offset(e - 1), 0, M);
    return {begin, std::clamp<int64_t>(offset(e), begin, M)};
  }
};

template <typename scalar_t, typename Params>
void poly_norm_grouped_fwd_rows(const Rows& x, scalar_t* y, at::opmath_type<scalar_t>* rstd, const Params& params_of,
                                double eps) {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* x_data = x.tensor.const_data_ptr<scalar_t>();
  const int64_t H = x.H;
  at::parallel_for(0, x.M, row_grain(H), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      scalar_t* y_row = y + row * H;
      const std::array<acc_t, 4>* p = params_of(row);
      if (p == nullptr) {  // no expert: not read
        std::fill(y_row, y_row + H, scalar_t(0));
        std::fill(rstd + row * 3, rstd + row * 3 + 3, acc_t(0));
        continue;
      }
      const scalar_t* x_row = x_data + row * x.row_stride;
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
      const acc_t a3 = (*p)[0] * r3, a2 = (*p)[1] * r2, a1 = (*p)[2] * r1, b = (*p)[3];
      for (int64_t j = 0; j < H; ++j) {
        const acc_t v = static_cast<acc_t>(x_row[j]);
        y_row[j] = static_cast<scalar_t>(v * (a1 + v * (a2 + v * a3)) + b);  // Horner form
      }
    }
  });
}

template <typename scalar_t, typename Params>
void poly_norm_grouped_bwd_rows(const Rows& g, const Rows& x, const at::opmath_type<scalar_t>* rstd, scalar_t* dx,
                                at::opmath_type<scalar_t>* row_partials, const Params& params_of) {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* g_data = g.tensor.const_data_ptr<scalar_t>();
  const scalar_t* x_data = x.tensor.const_data_ptr<scalar_t>();
  const int64_t H = x.H;
  at::parallel_for(0, x.M, row_grain(H), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      scalar_t* dx_row = dx + row * H;
      const std::array<acc_t, 4>* p = params_of(row);
      if (p == nullptr) {  // no expert: not read, no gradient
        std::fill(dx_row, dx_row + H, scalar_t(0));
        std::fill(row_partials + row * 4, row_partials + row * 4 + 4, acc_t(0));
        continue;
      }
      const scalar_t* g_row = g_data + row * g.row_stride;
      const scalar_t* x_row = x_data + row * x.row_stride;
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
      // c_p = w(p) p r_p, d_p = c_p r_p^2 S_p / H (docs/MATH.md), as c_p ((r_p S_p / H) r_p):
      // r_p^3 alone leaves fp32's range for |x| >~ 3e4 (see polynorm_cpu.cpp).
      const acc_t c1 = (*p)[2] * r1, c2 = acc_t(2) * (*p)[1] * r2, c3 = acc_t(3) * (*p)[0] * r3;
      const acc_t d1 = c1 * ((r1 * s[0] * inv_h) * r1);
      const acc_t d2 = c2 * ((r2 * s[1] * inv_h) * r2);
      const acc_t d3 = c3 * ((r3 * s[2] * inv_h) * r3);
      for (int64_t j = 0; j < H; ++j) {
        const acc_t gv = static_cast<acc_t>(g_row[j]);
        const acc_t v = static_cast<acc_t>(x_row[j]);
        const acc_t v2 = v * v;
        dx_row[j] = static_cast<scalar_t>(gv * (c1 + v * (c2 + v * c3)) - v * (d1 + v2 * (d2 + v2 * d3)));
      }
      // This row's share of its expert's dw0, dw1, dw2, db.
      row_partials[row * 4 + 0] = r3 * s[2];
      row_partials[row * 4 + 1] = r2 * s[1];
      row_partials[row * 4 + 2] = r1 * s[0];
      row_partials[row * 4 + 3] = s[3];
    }
  });
}

std::tuple<at::Tensor, at::Tensor> poly_norm_grouped_forward_cpu(const at::Tensor& x, const at::Tensor& weight,
                                                                 const at::Tensor& bias, const at::Tensor& offsets,
                                                                 double eps) {
  check_grouped_forward_args(x, weight, bias, offsets, eps);
  const Rows rows = as_rows(x);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor rstd = at::empty({rows.M, 3}, x.options().dtype(opmath_dtype(x.scalar_type())));
  if (rows.M == 0) return {y, rstd};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "polynorm.grouped_forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(offsets.scalar_type(), "polynorm.grouped_forward", [&] {
      const ExpertParams<acc_t, index_t> params(weight, &bias, offsets, rows.M);
      poly_norm_grouped_fwd_rows<scalar_t>(rows, y.mutable_data_ptr<scalar_t>(), rstd.mutable_data_ptr<acc_t>(),
                                           params, eps);
    });
  });
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> poly_norm_grouped_backward_cpu(const at::Tensor& grad_y,
                                                                              const at::Tensor& x,
                                                                              const at::Tensor& weight,
                                                                              const at::Tensor& offsets,
                                                                              const at::Tensor& rstd) {
  check_grouped_backward_args(grad_y, x, weight, offsets, rstd);
  const Rows x_rows = as_rows(x);
  const Rows g_rows = as_rows(grad_y);
  const at::Tensor rstd_c = rstd.contiguous();  // [M, 3]: at most a small copy
  const auto acc_dtype = opmath_dtype(x.scalar_type());
  const int64_t E = weight.size(0);
  at::Tensor grad_x = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (x_rows.M == 0) {
    return {grad_x, at::zeros({E, 3}, x.options().dtype(acc_dtype)), at::zeros({E}, x.options().dtype(acc_dtype))};
  }
  at::Tensor grad_weight = at::empty({E, 3}, x.options().dtype(acc_dtype));
  at::Tensor grad_bias = at::empty({E}, x.options().dtype(acc_dtype));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "polynorm.grouped_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(offsets.scalar_type(), "polynorm.grouped_backward", [&] {
      const ExpertParams<acc_t, index_t> params(weight, nullptr, offsets, x_rows.M);
      // [M, 4] row partials, then each expert's segment summed in a fixed pairwise order.
      at::Tensor row_partials = at::empty({x_rows.M, 4}, x.options().dtype(acc_dtype));
      acc_t* part = row_partials.mutable_data_ptr<acc_t>();
      poly_norm_grouped_bwd_rows<scalar_t>(g_rows, x_rows, rstd_c.const_data_ptr<acc_t>(),
                                           grad_x.mutable_data_ptr<scalar_t>(), part, params);
      acc_t* dw = grad_weight.mutable_data_ptr<acc_t>();
      acc_t* db = grad_bias.mutable_data_ptr<acc_t>();
      at::parallel_for(0, E, 1, [&](int64_t e_begin, int64_t e_end) {
        for (int64_t e = e_begin; e < e_end; ++e) {
          const auto [begin, end] = params.segment(e);
          const auto total = pairwise_sum<4, acc_t>(begin, end - begin, [&](int64_t r, acc_t* acc) {
            for (int k = 0; k < 4; ++k) acc[k] += part[r * 4 + k];
          });
          for (int k = 0; k < 3; ++k) dw[e * 3 + k] = total[k];
          db[e] = total[3];
        }
      });
    });
  });
  // In the accumulation dtype: autograd rounds each to its own parameter's dtype, once.
  return {grad_x, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, CPU, m) {
  m.impl("grouped_forward", &poly_norm_grouped_forward_cpu);
  m.impl("grouped_backward", &poly_norm_grouped_backward_cpu);
}

}  // namespace polynorm
