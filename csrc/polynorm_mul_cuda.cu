// The fused PolyNorm x mul on CUDA devices (polynorm::mul_forward, mul_backward): the
// launchers. The kernels are PolyNorm's (csrc/cuda/) built with kMul = true.
#include "cuda/launch.cuh"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

namespace polynorm {
namespace {

std::tuple<at::Tensor, at::Tensor> poly_norm_mul_forward_cuda(const at::Tensor& x, const at::Tensor& mul,
                                                              const at::Tensor& weight, const at::Tensor& bias,
                                                              double eps) {
  check_mul_forward_args(x, mul, weight, bias, eps);
  TORCH_CHECK(x.is_cuda(), "polynorm.mul_forward: expected x on a CUDA device, got ", x.device());
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const Rows rows = as_rows(x);
  const Rows mul_rows = as_rows(mul);
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor rstd = at::empty({rows.M, 3}, x.options().dtype(opmath_dtype(x.scalar_type())));
  launch_forward<true>(rows, &mul_rows, weight, bias, eps, out, rstd);
  return {out, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> poly_norm_mul_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& mul, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& rstd) {
  check_mul_backward_args(grad_out, x, mul, weight, bias, rstd);
  TORCH_CHECK(x.is_cuda(), "polynorm.mul_backward: expected x on a CUDA device, got ", x.device());
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const Rows x_rows = as_rows(x);
  const Rows g_rows = as_rows(grad_out);
  const Rows mul_rows = as_rows(mul);
  const auto contiguous = x.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor grad_x = at::empty(x.sizes(), contiguous);
  at::Tensor grad_mul = at::empty(x.sizes(), contiguous);
  // dW and dB are the fp32 (fp64) sums; autograd rounds each to its parameter's dtype.
  const auto param_options = weight.options().dtype(opmath_dtype(x.scalar_type()));
  at::Tensor grad_weight = at::empty({3}, param_options);
  at::Tensor grad_bias = at::empty({1}, param_options);
  launch_backward<true>(g_rows, x_rows, &mul_rows, weight, &bias, rstd, grad_x, &grad_mul, grad_weight, grad_bias);
  return {grad_x, grad_mul, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, CUDA, m) {
  m.impl("mul_forward", &poly_norm_mul_forward_cuda);
  m.impl("mul_backward", &poly_norm_mul_backward_cuda);
}

}  // namespace polynorm
