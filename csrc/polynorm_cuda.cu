// polynorm::forward and polynorm::backward on CUDA devices: the launchers. The kernels
// and their launch plans are in polynorm_cuda.cuh (shared with polynorm_mul_cuda.cu).
#include "polynorm_cuda.cuh"

#include <torch/library.h>

namespace polynorm {
namespace {

std::tuple<at::Tensor, at::Tensor> poly_norm_forward_cuda(const at::Tensor& x, const at::Tensor& weight,
                                                          const at::Tensor& bias, double eps) {
  check_forward_args(x, weight, bias, eps);
  TORCH_CHECK(x.is_cuda(), "polynorm.forward: expected x on a CUDA device, got ", x.device());
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const Rows rows = as_rows(x);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor rstd = at::empty({rows.M, 3}, x.options().dtype(opmath_dtype(x.scalar_type())));
  launch_forward<false>(rows, nullptr, weight, bias, eps, y, rstd);
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> poly_norm_backward_cuda(const at::Tensor& grad_y,
                                                                       const at::Tensor& x,
                                                                       const at::Tensor& weight,
                                                                       const at::Tensor& rstd) {
  check_backward_args(grad_y, x, weight, rstd);
  TORCH_CHECK(x.is_cuda(), "polynorm.backward: expected x on a CUDA device, got ", x.device());
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const Rows x_rows = as_rows(x);
  const Rows g_rows = as_rows(grad_y);
  at::Tensor grad_x = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  // dW and dB are the fp32 (fp64) sums; autograd rounds each to its parameter's dtype.
  const auto param_options = weight.options().dtype(opmath_dtype(x.scalar_type()));
  at::Tensor grad_weight = at::empty({3}, param_options);
  at::Tensor grad_bias = at::empty({1}, param_options);
  launch_backward<false>(g_rows, x_rows, nullptr, weight, nullptr, rstd, grad_x, nullptr, grad_weight, grad_bias);
  return {grad_x, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, CUDA, m) {
  m.impl("forward", &poly_norm_forward_cuda);
  m.impl("backward", &poly_norm_backward_cuda);
}

}  // namespace polynorm
