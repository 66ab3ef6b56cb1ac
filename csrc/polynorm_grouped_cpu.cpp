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

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, CPU, m) {
  m.impl("grouped_forward", &poly_norm_grouped_forward_cpu);
  m.impl("grouped_backward", &poly_norm_grouped_backward_cpu);
}

}  // namespace polynorm
