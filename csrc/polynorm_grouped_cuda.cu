// The per-expert parameter gradients of polynorm::grouped_backward on CUDA devices
// (docs/MATH.md, "Grouped PolyNorm"). The grouped ops' launchers are in polynorm_cuda.cu: the
// single-expert kernels of csrc/cuda/ with a per-row expert (GroupArgs), whose backward
// writes each row's [r_3 S_3, r_2 S_2, r_1 S_1, sum g] to an [M, 4] buffer. This file sums that
// buffer per expert.
//
// One block of 1024 threads per expert. Thread t keeps kParamChains running sums: chain c adds
// rows begin + t + c T, begin + t + (c + kParamChains) T, ... (T = 1024) in order, so that each
// thread has kParamChains rows' loads in flight, not one (at E = 8 and M = 65536 a block of 256
// threads with one chain walked 32 dependent steps: the grouped backward ran at 1.16 of the
// single-expert kernel, bench/NOTES.md v11). Then each thread adds its chains in order, xor
// shuffles inside each warp, and the warp totals in warp order. That order depends only on the
// segment's length, so an expert's dW and dB are the same bits on every run and the same bits as
// this op gives for that expert's rows alone, whatever the other experts hold. No atomics, no
// host synchronisation (offsets are read on the device). Each segment [offsets[e-1], offsets[e])
// is clamped to [0, M] (empty where offsets decrease): never out of bounds.
#include "expert_offsets.cuh"
#include "polynorm.h"

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

namespace polynorm {
namespace {

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

}  // namespace

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

}  // namespace polynorm
