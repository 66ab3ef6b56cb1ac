// polynorm::forward and polynorm::backward on CUDA devices, and the grouped PolyNorm of
// mixture-of-experts layers (grouped_forward, grouped_backward): the launchers. The kernels and
// their launch plans are in csrc/cuda/ (launch.cuh says where each part lives; shared with
// polynorm_mul_cuda.cu); the grouped ops are the same kernels with a per-row expert (GroupArgs),
// launched from this file so that the kernels are compiled once.
#include "cuda/launch.cuh"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>

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

// Grouped PolyNorm (docs/MATH.md, "Grouped PolyNorm"): x's rows sorted by expert, weight [E, 3],
// bias [E] or [E, 1], offsets [E] (int32 or int64, read on the device: no host synchronisation).
// The single-expert kernels and launch plan (from H and the dtype only, never E or M), each row
// with its expert's parameters; rows of no expert get y = 0 and rstd = 0.
// The kernels keep a row's expert in 32 bits (one register): E < 2^31, far beyond any model.
void check_experts_fit(const char* op, const at::Tensor& weight) {
  TORCH_CHECK(weight.size(0) <= std::numeric_limits<int32_t>::max(), op, ": expected at most ",
              num(std::numeric_limits<int32_t>::max()), " experts, got ", num(weight.size(0)));
}

std::tuple<at::Tensor, at::Tensor> poly_norm_grouped_forward_cuda(const at::Tensor& x, const at::Tensor& weight,
                                                                  const at::Tensor& bias, const at::Tensor& offsets,
                                                                  double eps) {
  check_grouped_forward_args(x, weight, bias, offsets, eps);
  TORCH_CHECK(x.is_cuda(), "polynorm.grouped_forward: expected x on a CUDA device, got ", x.device());
  check_experts_fit("polynorm.grouped_forward", weight);
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const Rows rows = as_rows(x);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor rstd = at::empty({rows.M, 3}, x.options().dtype(opmath_dtype(x.scalar_type())));
  const GroupTensors groups{offsets, nullptr};
  launch_forward<false>(rows, nullptr, weight, bias, eps, y, rstd, &groups);
  return {y, rstd};
}

// grad_x per row as polynorm::backward's, with the row's expert's weights; each row's
// [r_3 S_3, r_2 S_2, r_1 S_1, sum g] goes to an [M, 4] buffer whose segments grouped_param_sums
// sums per expert in a fixed order: grad_weight [E, 3] and grad_bias [E], opmath (autograd
// rounds each to its parameter's dtype), bitwise the same on every run.
std::tuple<at::Tensor, at::Tensor, at::Tensor> poly_norm_grouped_backward_cuda(const at::Tensor& grad_y,
                                                                               const at::Tensor& x,
                                                                               const at::Tensor& weight,
                                                                               const at::Tensor& offsets,
                                                                               const at::Tensor& rstd) {
  check_grouped_backward_args(grad_y, x, weight, offsets, rstd);
  TORCH_CHECK(x.is_cuda(), "polynorm.grouped_backward: expected x on a CUDA device, got ", x.device());
  check_experts_fit("polynorm.grouped_backward", weight);
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const Rows x_rows = as_rows(x);
  const Rows g_rows = as_rows(grad_y);
  const int64_t E = weight.size(0);
  const auto acc_options = x.options().dtype(opmath_dtype(x.scalar_type()));
  at::Tensor grad_x = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (x_rows.M == 0) return {grad_x, at::zeros({E, 3}, acc_options), at::zeros({E}, acc_options)};
  at::Tensor grad_weight = at::empty({E, 3}, acc_options);
  at::Tensor grad_bias = at::empty({E}, acc_options);
  at::Tensor row_terms = at::empty({x_rows.M, 4}, acc_options);
  const GroupTensors groups{offsets, &row_terms};
  launch_backward<false>(g_rows, x_rows, nullptr, weight, nullptr, rstd, grad_x, nullptr, grad_weight, grad_bias,
                         &groups);
  grouped_param_sums(row_terms, offsets, grad_weight, grad_bias);
  return {grad_x, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, CUDA, m) {
  m.impl("forward", &poly_norm_forward_cuda);
  m.impl("backward", &poly_norm_backward_cuda);
  m.impl("grouped_forward", &poly_norm_grouped_forward_cuda);
  m.impl("grouped_backward", &poly_norm_grouped_backward_cuda);
}

}  // namespace polynorm
