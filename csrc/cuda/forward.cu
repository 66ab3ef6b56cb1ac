// The forward ops on CUDA devices: polynorm::forward, mul_forward (the fused PolyNorm x mul) and
// grouped_forward (mixture-of-experts rows, each with its expert's parameters), and their private
// twins with an explicit launch configuration (_forward_config, ...: polynorm.h, LaunchConfig).
// The backward ops are in backward.cu: a change to one direction recompiles only its kernels.
#include "launch_forward.cuh"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>
#include <tuple>

namespace polynorm {
namespace {

at::Tensor rstd_like(const at::Tensor& x, int64_t M) {
  return at::empty({M, 3}, x.options().dtype(opmath_dtype(x.scalar_type())));
}
at::Tensor output_like(const at::Tensor& x) {
  return at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
}

std::tuple<at::Tensor, at::Tensor> forward_cuda(const char* op, const LaunchConfig& config, const at::Tensor& x,
                                                const at::Tensor& weight, const at::Tensor& bias, double eps) {
  check_forward_args(x, weight, bias, eps);
  TORCH_CHECK(x.is_cuda(), op, ": expected x on a CUDA device, got ", x.device());
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const Rows rows = as_rows(x);
  at::Tensor y = output_like(x);
  at::Tensor rstd = rstd_like(x, rows.M);
  launch_forward<false>(op, config, rows, nullptr, weight, bias, eps, y, rstd);
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor> mul_forward_cuda(const char* op, const LaunchConfig& config, const at::Tensor& x,
                                                    const at::Tensor& mul, const at::Tensor& weight,
                                                    const at::Tensor& bias, double eps) {
  check_mul_forward_args(x, mul, weight, bias, eps);
  TORCH_CHECK(x.is_cuda(), op, ": expected x on a CUDA device, got ", x.device());
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const Rows rows = as_rows(x);
  const Rows mul_rows = as_rows(mul);
  at::Tensor out = output_like(x);
  at::Tensor rstd = rstd_like(x, rows.M);
  launch_forward<true>(op, config, rows, &mul_rows, weight, bias, eps, out, rstd);
  return {out, rstd};
}

// Grouped PolyNorm (docs/MATH.md, "Grouped PolyNorm"): x's rows sorted by expert, weight [E, 3],
// bias [E] or [E, 1], offsets [E] (int32 or int64, read on the device: no host synchronisation).
// The single-expert kernels and launch plan (from H and the dtype only, never E or M), each row
// with its expert's parameters; rows of no expert get y = 0 and rstd = 0.
std::tuple<at::Tensor, at::Tensor> grouped_forward_cuda(const char* op, const LaunchConfig& config,
                                                        const at::Tensor& x, const at::Tensor& weight,
                                                        const at::Tensor& bias, const at::Tensor& offsets,
                                                        double eps) {
  check_grouped_forward_args(x, weight, bias, offsets, eps);
  TORCH_CHECK(x.is_cuda(), op, ": expected x on a CUDA device, got ", x.device());
  check_experts_fit(op, weight);
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const Rows rows = as_rows(x);
  at::Tensor y = output_like(x);
  at::Tensor rstd = rstd_like(x, rows.M);
  const GroupTensors groups{offsets, nullptr};
  launch_forward<false>(op, config, rows, nullptr, weight, bias, eps, y, rstd, &groups);
  return {y, rstd};
}

// The public ops: the table's plan.
std::tuple<at::Tensor, at::Tensor> poly_norm_forward_cuda(const at::Tensor& x, const at::Tensor& weight,
                                                          const at::Tensor& bias, double eps) {
  return forward_cuda("polynorm.forward", LaunchConfig{}, x, weight, bias, eps);
}
std::tuple<at::Tensor, at::Tensor> poly_norm_mul_forward_cuda(const at::Tensor& x, const at::Tensor& mul,
                                                              const at::Tensor& weight, const at::Tensor& bias,
                                                              double eps) {
  return mul_forward_cuda("polynorm.mul_forward", LaunchConfig{}, x, mul, weight, bias, eps);
}
std::tuple<at::Tensor, at::Tensor> poly_norm_grouped_forward_cuda(const at::Tensor& x, const at::Tensor& weight,
                                                                  const at::Tensor& bias, const at::Tensor& offsets,
                                                                  double eps) {
  return grouped_forward_cuda("polynorm.grouped_forward", LaunchConfig{}, x, weight, bias, offsets, eps);
}

// The private ops: an explicit configuration.
std::tuple<at::Tensor, at::Tensor> forward_config_cuda(const at::Tensor& x, const at::Tensor& weight,
                                                       const at::Tensor& bias, double eps, const std::string& family,
                                                       bool clusters) {
  constexpr const char* op = "polynorm._forward_config";
  return forward_cuda(op, launch_config(op, family, clusters), x, weight, bias, eps);
}
std::tuple<at::Tensor, at::Tensor> mul_forward_config_cuda(const at::Tensor& x, const at::Tensor& mul,
                                                           const at::Tensor& weight, const at::Tensor& bias,
                                                           double eps, const std::string& family, bool clusters) {
  constexpr const char* op = "polynorm._mul_forward_config";
  return mul_forward_cuda(op, launch_config(op, family, clusters), x, mul, weight, bias, eps);
}
std::tuple<at::Tensor, at::Tensor> grouped_forward_config_cuda(const at::Tensor& x, const at::Tensor& weight,
                                                               const at::Tensor& bias, const at::Tensor& offsets,
                                                               double eps, const std::string& family,
                                                               bool clusters) {
  constexpr const char* op = "polynorm._grouped_forward_config";
  return grouped_forward_cuda(op, launch_config(op, family, clusters), x, weight, bias, offsets, eps);
}

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, CUDA, m) {
  m.impl("forward", &poly_norm_forward_cuda);
  m.impl("mul_forward", &poly_norm_mul_forward_cuda);
  m.impl("grouped_forward", &poly_norm_grouped_forward_cuda);
  m.impl("_forward_config", &forward_config_cuda);
  m.impl("_mul_forward_config", &mul_forward_config_cuda);
  m.impl("_grouped_forward_config", &grouped_forward_config_cuda);
}

}  // namespace polynorm
