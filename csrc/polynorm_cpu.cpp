// CPU kernels for polynorm::forward and polynorm::backward, and for the fused PolyNorm x mul
// (polynorm::mul_forward, mul_backward), which run the same row loops (kMul = true).
//
// The row loops, the pairwise sums and their order are cpu_rows.h's, shared with the grouped
// ops (polynorm_grouped_cpu.cpp); here every row has the same parameters (SameParams).
// Accumulation is in at::opmath_type (fp32 for fp16/bf16/fp32, fp64 for fp64).
#include "cpu_rows.h"
#include "polynorm.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

namespace polynorm {
namespace {

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
    const SameParams<acc_t> params{read_params<acc_t>(weight, &bias)};
    scalar_t* out_data = out.mutable_data_ptr<scalar_t>();
    acc_t* rstd_data = rstd.mutable_data_ptr<acc_t>();
    if (mul != nullptr) {
      const Rows mul_rows = as_rows(*mul);
      poly_norm_fwd_rows<scalar_t, true>(x_rows, &mul_rows, out_data, rstd_data, params, eps);
    } else {
      poly_norm_fwd_rows<scalar_t, false>(x_rows, nullptr, out_data, rstd_data, params, eps);
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
    // bias (p[3]) is read only by the fused op's recomputation of y; PolyNorm's is 0 here.
    const SameParams<acc_t> params{read_params<acc_t>(weight, bias)};
    if (mul != nullptr) {
      const Rows mul_rows = as_rows(*mul);
      poly_norm_bwd_rows<scalar_t, true>(g_rows, x_rows, &mul_rows, rstd_data, grad_x.mutable_data_ptr<scalar_t>(),
                                         grad_mul.mutable_data_ptr<scalar_t>(), part, params);
    } else {
      poly_norm_bwd_rows<scalar_t, false>(g_rows, x_rows, nullptr, rstd_data, grad_x.mutable_data_ptr<scalar_t>(),
                                          nullptr, part, params);
    }
    const auto total = sum_partials<acc_t>(part, 0, x_rows.M);
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
