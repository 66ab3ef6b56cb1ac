// The backward ops on CUDA devices: polynorm::backward, mul_backward (the fused PolyNorm x mul)
// and grouped_backward with its per-expert parameter sums, and their private twins with an
// explicit launch configuration (_backward_config, ...: polynorm.h, LaunchConfig). The forward
// ops are in forward.cu: a change to one direction recompiles only its kernels.
#include "launch_backward.cuh"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>
#include <tuple>

namespace polynorm {
namespace {

// ---- grouped_backward's per-expert sums (docs/MATH.md, "Grouped PolyNorm") ----------------------
// The row kernels write each row's [r_3 S_3, r_2 S_2, r_1 S_1, sum g] to an [M, 4] buffer; one
// block of 1024 threads per expert sums its segment. Thread t keeps kParamChains running sums:
// chain c adds rows begin + t + c T, begin + t + (c + kParamChains) T, ... (T = 1024) in order, so
// that each thread has kParamChains rows' loads in flight, not one. Then each thread adds its chains in order, xor shuffles inside each warp, and
// the warp totals in warp order. That order depends only on the segment's length, so an expert's
// dW and dB are the same bits on every run and the same bits as this op gives for that expert's
// rows alone. No atomics, no host synchronisation (offsets are read on the device). Each segment
// [offsets[e-1], offsets[e]) is clamped to [0, M] (empty where offsets decrease): never out of
// bounds.
constexpr int kParamThreads = 1024;  // threads of a block, one block per expert
constexpr int kParamChains = 4;      // running sums a thread, each over every kParamChains-th of its rows

__device__ __forceinline__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

template <typename acc_t>
__global__ void __launch_bounds__(kParamThreads) poly_norm_grouped_param_kernel(
    const acc_t* __restrict__ row_terms,  // [M, 4] opmath: r_3 S_3, r_2 S_2, r_1 S_1, sum g per row
    ExpertOffsets offsets,                // [E] cumulative end offsets
    int64_t M,
    acc_t* __restrict__ grad_weight,  // [E, 3] opmath
    acc_t* __restrict__ grad_bias) {  // [E] opmath
  __shared__ acc_t red[kParamThreads / 32][4];
  const int64_t e = blockIdx.x;
  const int64_t begin = e == 0 ? 0 : clamp64(offset_at(offsets, e - 1), 0, M);
  const int64_t end = clamp64(offset_at(offsets, e), begin, M);
  acc_t chain[kParamChains][4] = {};
  for (int64_t r0 = begin + threadIdx.x; r0 < end; r0 += int64_t(kParamThreads) * kParamChains) {
#pragma unroll
    for (int c = 0; c < kParamChains; ++c) {
      const int64_t r = r0 + int64_t(c) * kParamThreads;
      if (r < end) {
#pragma unroll
        for (int k = 0; k < 4; ++k) chain[c][k] += row_terms[r * 4 + k];
      }
    }
  }
  acc_t v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[k] = chain[0][k];
#pragma unroll
    for (int c = 1; c < kParamChains; ++c) v[k] += chain[c][k];
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    for (int off = 16; off > 0; off /= 2) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
  }
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int k = 0; k < 4; ++k) red[threadIdx.x / 32][k] = v[k];
  }
  __syncthreads();
  if (threadIdx.x < 4) {
    const int k = threadIdx.x;
    acc_t total = red[0][k];
    for (int w = 1; w < kParamThreads / 32; ++w) total += red[w][k];
    if (k < 3) {
      grad_weight[e * 3 + k] = total;
    } else {
      grad_bias[e] = total;
    }
  }
}

// grad_weight [E, 3] and grad_bias [E] (opmath) as the per-expert sums of row_terms [M, 4],
// launched on the current stream.
void grouped_param_sums(const at::Tensor& row_terms, const at::Tensor& offsets, at::Tensor& grad_weight,
                        at::Tensor& grad_bias) {
  constexpr const char* op = "polynorm.grouped_backward";
  const int64_t E = offsets.size(0);  // <= INT32_MAX: the launcher checks it
  const c10::cuda::OptionalCUDAGuard guard(row_terms.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(row_terms.scalar_type(), op, [&] {
    poly_norm_grouped_param_kernel<scalar_t><<<static_cast<unsigned>(E), kParamThreads, 0, stream>>>(
        row_terms.const_data_ptr<scalar_t>(), expert_offsets(offsets), row_terms.size(0),
        grad_weight.mutable_data_ptr<scalar_t>(), grad_bias.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}


// ---- The ops ------------------------------------------------------------------------------------

// dW and dB are the fp32 (fp64) sums; autograd rounds each to its parameter's dtype.
at::TensorOptions param_grad_options(const at::Tensor& x, const at::Tensor& weight) {
  return weight.options().dtype(opmath_dtype(x.scalar_type()));
}
at::Tensor output_like(const at::Tensor& x) {
  return at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_cuda(const char* op, const LaunchConfig& config,
                                                             const at::Tensor& grad_y, const at::Tensor& x,
                                                             const at::Tensor& weight, const at::Tensor& rstd) {
  check_backward_args(grad_y, x, weight, rstd);
  TORCH_CHECK(x.is_cuda(), op, ": expected x on a CUDA device, got ", x.device());
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const Rows x_rows = as_rows(x);
  const Rows g_rows = as_rows(grad_y);
  at::Tensor grad_x = output_like(x);
  at::Tensor grad_weight = at::empty({3}, param_grad_options(x, weight));
  at::Tensor grad_bias = at::empty({1}, param_grad_options(x, weight));
  launch_backward<false>(op, config, g_rows, x_rows, nullptr, weight, nullptr, rstd, grad_x, nullptr, grad_weight,
                         grad_bias);
  return {grad_x, grad_weight, grad_bias};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> mul_backward_cuda(
    const char* op, const LaunchConfig& config, const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& mul,
    const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& rstd) {
  check_mul_backward_args(grad_out, x, mul, weight, bias, rstd);
  TORCH_CHECK(x.is_cuda(), op, ": expected x on a CUDA device, got ", x.device());
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const Rows x_rows = as_rows(x);
  const Rows g_rows = as_rows(grad_out);
  const Rows mul_rows = as_rows(mul);
  at::Tensor grad_x = output_like(x);
  at::Tensor grad_mul = output_like(x);
  at::Tensor grad_weight = at::empty({3}, param_grad_options(x, weight));
  at::Tensor grad_bias = at::empty({1}, param_grad_options(x, weight));
  launch_backward<true>(op, config, g_rows, x_rows, &mul_rows, weight, &bias, rstd, grad_x, &grad_mul, grad_weight,
                        grad_bias);
  return {grad_x, grad_mul, grad_weight, grad_bias};
}

// grad_x per row as polynorm::backward's, with the row's expert's weights; each row's
// [r_3 S_3, r_2 S_2, r_1 S_1, sum g] goes to an [M, 4] buffer whose segments grouped_param_sums
// sums per expert in a fixed order: grad_weight [E, 3] and grad_bias [E], opmath (autograd rounds
// each to its parameter's dtype), bitwise the same on every run.
std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_backward_cuda(const char* op, const LaunchConfig& config,
                                                                     const at::Tensor& grad_y, const at::Tensor& x,
                                                                     const at::Tensor& weight,
                                                                     const at::Tensor& offsets,
                                                                     const at::Tensor& rstd) {
  check_grouped_backward_args(grad_y, x, weight, offsets, rstd);
  TORCH_CHECK(x.is_cuda(), op, ": expected x on a CUDA device, got ", x.device());
  check_experts_fit(op, weight);
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const Rows x_rows = as_rows(x);
  const Rows g_rows = as_rows(grad_y);
  const int64_t E = weight.size(0);
  const auto acc_options = x.options().dtype(opmath_dtype(x.scalar_type()));
  at::Tensor grad_x = output_like(x);
  if (x_rows.M == 0) return {grad_x, at::zeros({E, 3}, acc_options), at::zeros({E}, acc_options)};
  at::Tensor grad_weight = at::empty({E, 3}, acc_options);
  at::Tensor grad_bias = at::empty({E}, acc_options);
  at::Tensor row_terms = at::empty({x_rows.M, 4}, acc_options);
  const GroupTensors groups{offsets, &row_terms};
  launch_backward<false>(op, config, g_rows, x_rows, nullptr, weight, nullptr, rstd, grad_x, nullptr, grad_weight,
                         grad_bias, &groups);
  grouped_param_sums(row_terms, offsets, grad_weight, grad_bias);
  return {grad_x, grad_weight, grad_bias};
}

// The public ops: the table's plan.
std::tuple<at::Tensor, at::Tensor, at::Tensor> poly_norm_backward_cuda(const at::Tensor& grad_y, const at::Tensor& x,
                                                                       const at::Tensor& weight,
                                                                       const at::Tensor& rstd) {
  return backward_cuda("polynorm.backward", LaunchConfig{}, grad_y, x, weight, rstd);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> poly_norm_mul_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& mul, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& rstd) {
  return mul_backward_cuda("polynorm.mul_backward", LaunchConfig{}, grad_out, x, mul, weight, bias, rstd);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> poly_norm_grouped_backward_cuda(const at::Tensor& grad_y,
                                                                               const at::Tensor& x,
                                                                               const at::Tensor& weight,
                                                                               const at::Tensor& offsets,
                                                                               const at::Tensor& rstd) {
  return grouped_backward_cuda("polynorm.grouped_backward", LaunchConfig{}, grad_y, x, weight, offsets, rstd);
}

// The private ops: an explicit configuration.
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_config_cuda(const at::Tensor& grad_y, const at::Tensor& x,
                                                                    const at::Tensor& weight, const at::Tensor& rstd,
                                                                    const std::string& family, bool clusters) {
  constexpr const char* op = "polynorm._backward_config";
  return backward_cuda(op, launch_config(op, family, clusters), grad_y, x, weight, rstd);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> mul_backward_config_cuda(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& mul, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& rstd, const std::string& family, bool clusters) {
  constexpr const char* op = "polynorm._mul_backward_config";
  return mul_backward_cuda(op, launch_config(op, family, clusters), grad_out, x, mul, weight, bias, rstd);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_backward_config_cuda(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& offsets,
    const at::Tensor& rstd, const std::string& family, bool clusters) {
  constexpr const char* op = "polynorm._grouped_backward_config";
  return grouped_backward_cuda(op, launch_config(op, family, clusters), grad_y, x, weight, offsets, rstd);
}

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, CUDA, m) {
  m.impl("backward", &poly_norm_backward_cuda);
  m.impl("mul_backward", &poly_norm_mul_backward_cuda);
  m.impl("grouped_backward", &poly_norm_grouped_backward_cuda);
  m.impl("_backward_config", &backward_config_cuda);
  m.impl("_mul_backward_config", &mul_backward_config_cuda);
  m.impl("_grouped_backward_config", &grouped_backward_config_cuda);
}

}  // namespace polynorm
