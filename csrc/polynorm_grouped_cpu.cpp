// CPU kernels for polynorm::grouped_forward and polynorm::grouped_backward: PolyNorm with one
// [w0, w1, w2, b] per expert, for mixture-of-experts layers whose rows arrive sorted by expert.
//
// Expert e owns rows [offsets[e-1], offsets[e]) (offsets[-1] := 0); a row's expert is found by
// a binary search of offsets, and the row is then computed by the row loops polynorm::forward
// and polynorm::backward run on the CPU (cpu_rows.h: the same code, pairwise sums and order of
// operations), with that expert's parameters. Rows at or past offsets[E-1] belong to no
// expert: they are not read; y, rstd and grad_x are 0 there.
//
// Parameter gradients: each row writes its [r_3 S_3, r_2 S_2, r_1 S_1, G] (MATH.md (11)) to
// an [M, 4] buffer, and each expert's four sums are the pairwise sum of its own segment, whose
// order depends only on the segment's length. So an expert's dW and dB are bitwise those of
// polynorm::backward run on that expert's rows alone, whatever the other experts hold, on
// every run and for any thread count. Accumulation is in at::opmath_type (fp32, fp64 for
// fp64 x).
//
// Offsets are read in place (int32 or int64). Values that decrease, are negative or exceed M
// give undefined results but never read or write out of bounds: the search only ever yields
// an expert in [0, E], and each segment is clamped to [0, M].
#include "cpu_rows.h"
#include "polynorm.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

namespace polynorm {
namespace {

// The per-row parameter lookup: expert e's [w0, w1, w2, b] in the accumulation type, and the
// expert of each row. offsets are read in place, in their own integer type.
template <typename acc_t, typename index_t>
struct ExpertParams {
  std::vector<Params<acc_t>> params;  // [E][w0, w1, w2, b]
  const index_t* offsets;             // [E] cumulative end offsets, o_stride apart
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
  const Params<acc_t>* operator()(int64_t row) const {
    const int64_t e = expert_of(row);
    return e < E ? &params[e] : nullptr;
  }

  // Expert e's rows, [begin, end), clamped to [0, M] (and empty where offsets decrease).
  std::pair<int64_t, int64_t> segment(int64_t e) const {
    const int64_t begin = e == 0 ? 0 : std::clamp<int64_t>(offset(e - 1), 0, M);
    return {begin, std::clamp<int64_t>(offset(e), begin, M)};
  }
};

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
      poly_norm_fwd_rows<scalar_t, false>(rows, nullptr, y.mutable_data_ptr<scalar_t>(),
                                          rstd.mutable_data_ptr<acc_t>(), params, eps);
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
      poly_norm_bwd_rows<scalar_t, false>(g_rows, x_rows, nullptr, rstd_c.const_data_ptr<acc_t>(),
                                          grad_x.mutable_data_ptr<scalar_t>(), nullptr, part, params);
      acc_t* dw = grad_weight.mutable_data_ptr<acc_t>();
      acc_t* db = grad_bias.mutable_data_ptr<acc_t>();
      at::parallel_for(0, E, 1, [&](int64_t e_begin, int64_t e_end) {
        for (int64_t e = e_begin; e < e_end; ++e) {
          const auto [begin, end] = params.segment(e);
          const auto total = sum_partials<acc_t>(part, begin, end - begin);
          for (int k = 0; k < 3; ++k) dw[e * 3 + k] = total[k];
          db[e] = total[3];
        }
      });
    });
  });
  // In the accumulation dtype: autograd rounds each to its own parameter's dtype, once.
  return {grad_x, grad_weight, grad_bias};
}


// ---------------------------------------------------------------------------------------------
// Motif-3's MoE activation (docs/MATH.md (16)-(22)): the grouped rows above with mul, the hidden
// clamp c (+inf for none) and the output scale s. weight and bias are PolyNorm's coefficients
// w~ and b~ as given. x and mul are read in place with a row and a column stride each (the
// halves of one gate_up projection, chunked or interleaved). Row sums are the same pairwise sums
// (cpu_rows.h), so each expert's dw~ and db~ have the same bits on every run and thread count.
// ---------------------------------------------------------------------------------------------

// A tensor seen as M rows of H elements, element (row, j) at data + row * row_stride + j *
// col_stride: the tensor itself when its leading dims collapse into one row stride, whatever its
// last-dim stride; else a contiguous copy (the one documented copy).
struct StridedRows {
  at::Tensor tensor;
  int64_t M, H, row_stride, col_stride;
};

StridedRows as_strided_rows(const at::Tensor& t) {
  const int64_t H = t.size(-1);
  const int64_t M = H == 0 ? 0 : t.numel() / H;
  const int64_t col_stride = H > 1 ? t.stride(-1) : 1;
  int64_t row_stride = H * col_stride;
  int64_t expected = -1;
  bool ok = true;
  for (int64_t d = t.dim() - 2; d >= 0 && ok; --d) {
    if (t.size(d) == 1) continue;
    if (expected < 0) {
      row_stride = t.stride(d);
    } else if (t.stride(d) != expected) {
      ok = false;
    }
    expected = t.stride(d) * t.size(d);
  }
  if (ok) return {t, M, H, row_stride, col_stride};
  return {t.contiguous(), M, H, H, 1};
}

// MATH.md (16): clamp_c(v); a NaN stays NaN. clamped(v, c): whether clamp_c moves v.
template <typename acc_t>
acc_t clamp_c(acc_t v, acc_t c) {
  return v > c ? c : (v < -c ? -c : v);
}
template <typename acc_t>
bool clamped(acc_t v, acc_t c) {
  return v > c || v < -c;
}

// out: rows out_row_stride apart. rstd: [M, 3], or nullptr (the token-major forward keeps none).
// A row of no expert is not read; its out and rstd are 0, or, with keep_unowned (the token-major
// layout's rows of another rank's experts), out is left as it is.
template <typename scalar_t, typename Lookup>
void grouped_mul_fwd_rows(const StridedRows& x, const StridedRows& mul, scalar_t* out, int64_t out_row_stride,
                          at::opmath_type<scalar_t>* rstd, const Lookup& params_of, double eps, double clamp,
                          double scale, bool keep_unowned) {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* x_data = x.tensor.const_data_ptr<scalar_t>();
  const scalar_t* m_data = mul.tensor.const_data_ptr<scalar_t>();
  const int64_t H = x.H;
  const acc_t c = static_cast<acc_t>(clamp), s = static_cast<acc_t>(scale);
  at::parallel_for(0, x.M, row_grain(H), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      scalar_t* out_row = out + row * out_row_stride;
      const Params<acc_t>* p = params_of(row);
      if (p == nullptr) {  // a row of no expert: not read
        if (!keep_unowned) std::fill(out_row, out_row + H, scalar_t(0));
        if (rstd != nullptr) std::fill(rstd + row * 3, rstd + row * 3 + 3, acc_t(0));
        continue;
      }
      const scalar_t* x_row = x_data + row * x.row_stride;
      const scalar_t* m_row = m_data + row * mul.row_stride;
      const auto xc = [&](int64_t j) { return clamp_c(static_cast<acc_t>(x_row[j * x.col_stride]), c); };
      const auto sums = pairwise_sum<3, acc_t>(0, H, [&](int64_t j, acc_t* acc) { add_row_sums(acc, xc(j)); });
      const acc_t inv_h = acc_t(1) / static_cast<acc_t>(H);
      const acc_t e = static_cast<acc_t>(eps);
      const acc_t r1 = rstd_of(sums[0], inv_h, e), r2 = rstd_of(sums[1], inv_h, e), r3 = rstd_of(sums[2], inv_h, e);
      if (rstd != nullptr) {
        rstd[row * 3 + 0] = r3;
        rstd[row * 3 + 1] = r2;
        rstd[row * 3 + 2] = r1;
      }
      const auto& [w0, w1, w2, b] = *p;
      const HornerCoeffs<acc_t> a = forward_coeffs(w0, w1, w2, r3, r2, r1);
      for (int64_t j = 0; j < H; ++j) {  // MATH.md (18)-(19): one rounding
        const acc_t mc = clamp_c(static_cast<acc_t>(m_row[j * mul.col_stride]), c);
        out_row[j] = static_cast<scalar_t>(s * clamp_c(poly_value(xc(j), a, b) * mc, c));
      }
    }
  });
}

template <typename scalar_t, typename Lookup>
void grouped_mul_bwd_rows(const Rows& g, const StridedRows& x, const StridedRows& mul,
                          const at::opmath_type<scalar_t>* rstd, scalar_t* dx, scalar_t* dmul,
                          at::opmath_type<scalar_t>* row_partials, const Lookup& params_of, double clamp,
                          double scale) {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* g_data = g.tensor.const_data_ptr<scalar_t>();
  const scalar_t* x_data = x.tensor.const_data_ptr<scalar_t>();
  const scalar_t* m_data = mul.tensor.const_data_ptr<scalar_t>();
  const int64_t H = x.H;
  const acc_t c = static_cast<acc_t>(clamp), s = static_cast<acc_t>(scale);
  at::parallel_for(0, x.M, row_grain(H), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      scalar_t* dx_row = dx + row * H;
      scalar_t* dm_row = dmul + row * H;
      const Params<acc_t>* p = params_of(row);
      if (p == nullptr) {  // a row of no expert: not read, no gradient
        std::fill(dx_row, dx_row + H, scalar_t(0));
        std::fill(dm_row, dm_row + H, scalar_t(0));
        std::fill(row_partials + row * 4, row_partials + row * 4 + 4, acc_t(0));
        continue;
      }
      const scalar_t* g_row = g_data + row * g.row_stride;
      const scalar_t* x_row = x_data + row * x.row_stride;
      const scalar_t* m_row = m_data + row * mul.row_stride;
      const acc_t r3 = rstd[row * 3 + 0], r2 = rstd[row * 3 + 1], r1 = rstd[row * 3 + 2];
      const auto& [w0, w1, w2, b] = *p;
      const HornerCoeffs<acc_t> a = forward_coeffs(w0, w1, w2, r3, r2, r1);
      // Column j's (x~, y, q, g), MATH.md (20)-(21).
      struct Terms {
        acc_t xc, y, q, g;
      };
      const auto terms = [&](int64_t j) -> Terms {
        const acc_t xc = clamp_c(static_cast<acc_t>(x_row[j * x.col_stride]), c);
        const acc_t mc = clamp_c(static_cast<acc_t>(m_row[j * mul.col_stride]), c);
        const acc_t y = poly_value(xc, a, b);
        const acc_t q = clamped(y * mc, c) ? acc_t(0) : static_cast<acc_t>(g_row[j]) * s;
        return {xc, y, q, q * mc};
      };
      const auto sums = pairwise_sum<4, acc_t>(0, H, [&](int64_t j, acc_t* acc) {
        const Terms t = terms(j);
        add_row_grad_sums(acc, t.xc, t.g);
      });
      const acc_t inv_h = acc_t(1) / static_cast<acc_t>(H);
      const GradCoeffs<acc_t> k = backward_coeffs(w0, w1, w2, r3, r2, r1, sums[0], sums[1], sums[2], inv_h);
      for (int64_t j = 0; j < H; ++j) {
        const Terms t = terms(j);
        const bool x_moved = clamped(static_cast<acc_t>(x_row[j * x.col_stride]), c);
        const bool m_moved = clamped(static_cast<acc_t>(m_row[j * mul.col_stride]), c);
        dx_row[j] = static_cast<scalar_t>(x_moved ? acc_t(0) : grad_x_value(t.xc, t.g, k));
        dm_row[j] = static_cast<scalar_t>(m_moved ? acc_t(0) : t.q * t.y);
      }
      row_partials[row * 4 + 0] = r3 * sums[2];
      row_partials[row * 4 + 1] = r2 * sums[1];
      row_partials[row * 4 + 2] = r1 * sums[0];
      row_partials[row * 4 + 3] = sums[3];
    }
  });
}

double clamp_value(std::optional<double> hidden_clamp) {
  return hidden_clamp.has_value() ? *hidden_clamp : std::numeric_limits<double>::infinity();
}

std::tuple<at::Tensor, at::Tensor> poly_norm_grouped_mul_forward_cpu(const at::Tensor& x, const at::Tensor& mul,
                                                                     const at::Tensor& weight, const at::Tensor& bias,
                                                                     const at::Tensor& offsets, double eps,
                                                                     std::optional<double> hidden_clamp,
                                                                     double output_scale) {
  check_grouped_mul_forward_args(x, mul, weight, bias, offsets, eps, hidden_clamp, output_scale);
  const StridedRows x_rows = as_strided_rows(x);
  const StridedRows m_rows = as_strided_rows(mul);
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor rstd = at::empty({x_rows.M, 3}, x.options().dtype(opmath_dtype(x.scalar_type())));
  if (x_rows.M == 0) return {out, rstd};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "polynorm.grouped_mul_forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(offsets.scalar_type(), "polynorm.grouped_mul_forward", [&] {
      const ExpertParams<acc_t, index_t> params(weight, &bias, offsets, x_rows.M);
      grouped_mul_fwd_rows<scalar_t>(x_rows, m_rows, out.mutable_data_ptr<scalar_t>(), x_rows.H,
                                     rstd.mutable_data_ptr<acc_t>(), params, eps, clamp_value(hidden_clamp),
                                     output_scale, false);
    });
  });
  return {out, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> poly_norm_grouped_mul_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& mul, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& offsets, const at::Tensor& rstd, std::optional<double> hidden_clamp,
    double output_scale) {
  check_grouped_mul_backward_args(grad_out, x, mul, weight, bias, offsets, rstd, hidden_clamp, output_scale);
  const StridedRows x_rows = as_strided_rows(x);
  const StridedRows m_rows = as_strided_rows(mul);
  const Rows g_rows = as_rows(grad_out);
  const at::Tensor rstd_c = rstd.contiguous();  // [M, 3]: at most a small copy
  const auto acc_dtype = opmath_dtype(x.scalar_type());
  const int64_t E = weight.size(0);
  at::Tensor grad_x = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor grad_mul = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (x_rows.M == 0) {
    return {grad_x, grad_mul, at::zeros({E, 3}, x.options().dtype(acc_dtype)),
            at::zeros({E}, x.options().dtype(acc_dtype))};
  }
  at::Tensor grad_weight = at::empty({E, 3}, x.options().dtype(acc_dtype));
  at::Tensor grad_bias = at::empty({E}, x.options().dtype(acc_dtype));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "polynorm.grouped_mul_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(offsets.scalar_type(), "polynorm.grouped_mul_backward", [&] {
      const ExpertParams<acc_t, index_t> params(weight, &bias, offsets, x_rows.M);
      at::Tensor row_partials = at::empty({x_rows.M, 4}, x.options().dtype(acc_dtype));
      acc_t* part = row_partials.mutable_data_ptr<acc_t>();
      grouped_mul_bwd_rows<scalar_t>(g_rows, x_rows, m_rows, rstd_c.const_data_ptr<acc_t>(),
                                     grad_x.mutable_data_ptr<scalar_t>(), grad_mul.mutable_data_ptr<scalar_t>(), part,
                                     params, clamp_value(hidden_clamp), output_scale);
      acc_t* dw = grad_weight.mutable_data_ptr<acc_t>();
      acc_t* db = grad_bias.mutable_data_ptr<acc_t>();
      at::parallel_for(0, E, 1, [&](int64_t e_begin, int64_t e_end) {
        for (int64_t e = e_begin; e < e_end; ++e) {
          const auto [begin, end] = params.segment(e);
          const auto total = sum_partials<acc_t>(part, begin, end - begin);
          for (int k = 0; k < 3; ++k) dw[e * 3 + k] = total[k];
          db[e] = total[3];
        }
      });
    });
  });
  return {grad_x, grad_mul, grad_weight, grad_bias};
}

// The token-major layout's lookup: row r is token r / K's slot r % K, whose local expert is
// expert_map[topk_ids[r / K][r % K]] (the id itself without a map). An id outside [0, n_ids) or a map
// entry outside [0, E) (-1: another rank's expert) gives nullptr: nothing out of bounds is read.
template <typename acc_t, typename id_t, typename map_t>
struct TopkParams {
  std::vector<Params<acc_t>> params;  // [E][w0, w1, w2, b]
  const id_t* ids;                    // [T, K]
  int64_t s0, s1, K;
  const map_t* map;  // [n_ids] or nullptr
  int64_t map_stride, n_ids;

  const Params<acc_t>* operator()(int64_t row) const {
    const int64_t id = static_cast<int64_t>(ids[(row / K) * s0 + (row % K) * s1]);
    if (id < 0 || id >= n_ids) return nullptr;
    const int64_t e = map != nullptr ? static_cast<int64_t>(map[id * map_stride]) : id;
    return e >= 0 && e < static_cast<int64_t>(params.size()) ? &params[e] : nullptr;
  }
};

void poly_norm_grouped_mul_topk_forward_cpu(const at::Tensor& x, const at::Tensor& mul, const at::Tensor& weight,
                                            const at::Tensor& bias, const at::Tensor& topk_ids,
                                            const std::optional<at::Tensor>& expert_map, double eps,
                                            std::optional<double> hidden_clamp, double output_scale,
                                            const at::Tensor& out) {
  check_grouped_mul_topk_args(x, mul, weight, bias, topk_ids, expert_map, eps, hidden_clamp, output_scale, out);
  const StridedRows x_rows = as_strided_rows(x);
  const StridedRows m_rows = as_strided_rows(mul);
  const Rows out_rows = as_rows(out);
  TORCH_CHECK(out_rows.tensor.is_same(out), "polynorm.grouped_mul_topk_forward: expected out with a unit last-dim "
              "stride and one row stride (it is written in place), got another layout");
  if (x_rows.M == 0) return;
  const bool has_map = expert_map.has_value() && expert_map->defined();
  const int64_t E = weight.size(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "polynorm.grouped_mul_topk_forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto acc = c10::CppTypeToScalarType<acc_t>::value;
    const at::Tensor w = weight.to(acc).contiguous();  // [E, 3]
    const at::Tensor b = bias.reshape({E}).to(acc).contiguous();
    std::vector<Params<acc_t>> params(E);
    for (int64_t e = 0; e < E; ++e) {
      params[e] = {w.const_data_ptr<acc_t>()[e * 3], w.const_data_ptr<acc_t>()[e * 3 + 1],
                   w.const_data_ptr<acc_t>()[e * 3 + 2], b.const_data_ptr<acc_t>()[e]};
    }
    const auto run = [&](auto id_tag, auto map_tag) {
      using id_t = decltype(id_tag);
      using map_t = decltype(map_tag);
      TopkParams<acc_t, id_t, map_t> lookup{params,
                                             topk_ids.const_data_ptr<id_t>(),
                                             topk_ids.stride(0),
                                             topk_ids.stride(1),
                                             topk_ids.size(1),
                                             has_map ? expert_map->const_data_ptr<map_t>() : nullptr,
                                             has_map ? expert_map->stride(0) : 0,
                                             has_map ? expert_map->size(0) : E};
      grouped_mul_fwd_rows<scalar_t>(x_rows, m_rows, out.mutable_data_ptr<scalar_t>(), out_rows.row_stride, nullptr,
                                     lookup, eps, clamp_value(hidden_clamp), output_scale, true);
    };
    const bool map64 = has_map && expert_map->scalar_type() == at::kLong;
    if (topk_ids.scalar_type() == at::kLong) {
      map64 ? run(int64_t{}, int64_t{}) : run(int64_t{}, int32_t{});
    } else {
      map64 ? run(int32_t{}, int64_t{}) : run(int32_t{}, int32_t{});
    }
  });
}

// The CUDA kernels of this op are not written: CUDA tensors take the Triton kernels
// (polynorm.poly_norm_grouped_mul with backend "auto" or "triton"). A direct call of the C++ op
// on CUDA tensors says so, rather than copying to the CPU.
[[noreturn]] void grouped_mul_cuda_not_implemented(const char* op) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op,
                              ": no CUDA kernel; for CUDA tensors call polynorm.poly_norm_grouped_mul (backend "
                              "'auto' or 'triton') or torch.ops.polynorm.",
                              op + 9, "_triton");
}

std::tuple<at::Tensor, at::Tensor> grouped_mul_forward_cuda(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                            const at::Tensor&, const at::Tensor&, double,
                                                            std::optional<double>, double) {
  grouped_mul_cuda_not_implemented("polynorm.grouped_mul_forward");
}

void grouped_mul_topk_forward_cuda(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, const std::optional<at::Tensor>&, double,
                                   std::optional<double>, double, const at::Tensor&) {
  grouped_mul_cuda_not_implemented("polynorm.grouped_mul_topk_forward");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> grouped_mul_backward_cuda(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, std::optional<double>, double) {
  grouped_mul_cuda_not_implemented("polynorm.grouped_mul_backward");
}

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, CPU, m) {
  m.impl("grouped_forward", &poly_norm_grouped_forward_cpu);
  m.impl("grouped_backward", &poly_norm_grouped_backward_cpu);
  m.impl("grouped_mul_forward", &poly_norm_grouped_mul_forward_cpu);
  m.impl("grouped_mul_backward", &poly_norm_grouped_mul_backward_cpu);
  m.impl("grouped_mul_topk_forward", &poly_norm_grouped_mul_topk_forward_cpu);
}

TORCH_LIBRARY_IMPL(polynorm, CUDA, m) {
  m.impl("grouped_mul_forward", &grouped_mul_forward_cuda);
  m.impl("grouped_mul_backward", &grouped_mul_backward_cuda);
  m.impl("grouped_mul_topk_forward", &grouped_mul_topk_forward_cuda);
}

}  // namespace polynorm
