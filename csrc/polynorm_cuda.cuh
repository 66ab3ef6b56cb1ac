// CUDA kernels for polynorm::forward and backward, for the fused PolyNorm x mul
// (mul_forward, mul_backward) and for the grouped PolyNorm of mixture-of-experts layers
// (grouped_forward, grouped_backward): the kernel bodies and their launch plans, included by
// polynorm_cuda.cu (PolyNorm, grouped) and polynorm_mul_cuda.cu (the fused op), which compile
// in parallel. The fused op is the same kernels with kMul = true (see MulArgs); the grouped
// ops are the row and tiled kernels with a per-row expert, a runtime switch (see GroupArgs).
//
// Three kernel families, chosen by H and the dtype alone (so a row's bits never depend on
// its batch or on M):
// - Row kernels (poly_norm_{fwd,bwd}_row_kernel): a row of up to 1024 * kPacks 16-byte
//   packs (bf16: H <= 65536 forward, 32768 backward) is held in registers by G threads,
//   read from device memory once; see "Row kernels (v5)" below. Almost every model runs here.
// - Staged kernels (poly_norm_{fwd,bwd}_kernel): longer rows whose one-row stage still
//   fits in shared memory, copied in with cp.async.
// - Tiled kernels (poly_norm_{fwd,bwd}_tiled_kernel): any longer row, walked twice.
// Common to all:
// - Every warp access is 512 contiguous bytes (row kernels: a warp segment's lanes; tiled
//   and staged: lane t of G owns packs t, t + G, ...); each per-thread sum runs over its
//   packs in order and the group reduction has a fixed shape, set by (H, dtype): results
//   are bitwise the same whatever the batch, the alignment of the row, or the run.
// - All accumulation is in at::opmath_type (fp32, or fp64 for fp64 inputs); offsets are
//   64-bit; dW and dB come from per-block partials that the backward's last block sums
//   in block order (finish_param_grads): one launch, and the same bits on every run
//   (grouped: per-row terms, summed per expert by a second kernel, grouped_param_sums).
// bench/NOTES.md records each version's prediction and measured outcome.
#pragma once

#include "expert_offsets.cuh"
#include "launch_plan.h"
#include "polynorm.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

namespace polynorm {
namespace {

// Launch geometry (threads, packs per thread, stage sizes) and the choice of kernel family:
// launch_plan.h.

// A pack is 16 bytes of one row, kept as four raw 32-bit words. Elements are
// converted to opmath when used, not when loaded: the registers hold the row in its
// own (narrow) dtype, and keep_raw() stops the compiler from caching the converted
// values across the row reduction instead (twice the registers for fp16/bf16).
using Pack = uint4;

__device__ __forceinline__ uint32_t& word(Pack& p, int i) { return i == 0 ? p.x : i == 1 ? p.y : i == 2 ? p.z : p.w; }
__device__ __forceinline__ uint32_t word(const Pack& p, int i) {
  return i == 0 ? p.x : i == 1 ? p.y : i == 2 ? p.z : p.w;
}
__device__ __forceinline__ void keep_raw(Pack& p) {
  asm volatile("" : "+r"(p.x), "+r"(p.y), "+r"(p.z), "+r"(p.w));
}

// Element access and conversion by dtype. Raw bits travel as uint16/32/64.
template <typename scalar_t>
struct Elem;

template <>
struct Elem<float> {
  using raw_t = uint32_t;
  __device__ static float to_acc(raw_t r) { return __uint_as_float(r); }
  __device__ static raw_t from_acc(float v) { return __float_as_uint(v); }
};
template <>
struct Elem<double> {
  using raw_t = unsigned long long;
  __device__ static double to_acc(raw_t r) { return __longlong_as_double(static_cast<long long>(r)); }
  __device__ static raw_t from_acc(double v) { return static_cast<raw_t>(__double_as_longlong(v)); }
};
template <>
struct Elem<c10::Half> {
  using raw_t = unsigned short;
  __device__ static float to_acc(raw_t r) { return __half2float(__ushort_as_half(r)); }
  __device__ static raw_t from_acc(float v) { return __half_as_ushort(__float2half_rn(v)); }
};
template <>
struct Elem<c10::BFloat16> {
  using raw_t = unsigned short;
  __device__ static float to_acc(raw_t r) { return __uint_as_float(static_cast<uint32_t>(r) << 16); }
  __device__ static raw_t from_acc(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};

template <typename scalar_t>
struct PackOf {
  using raw_t = typename Elem<scalar_t>::raw_t;
  static constexpr int kVec = 16 / sizeof(scalar_t);

  __device__ static raw_t get(const Pack& p, int e) {
    if constexpr (sizeof(raw_t) == 2) {
      return static_cast<raw_t>(word(p, e / 2) >> (16 * (e % 2)));
    } else if constexpr (sizeof(raw_t) == 4) {
      return word(p, e);
    } else {
      return (static_cast<raw_t>(word(p, 2 * e + 1)) << 32) | word(p, 2 * e);
    }
  }
  __device__ static void set(Pack& p, int e, raw_t r) {
    if constexpr (sizeof(raw_t) == 2) {
      uint32_t& w = word(p, e / 2);
      w = e % 2 == 0 ? (w & 0xffff0000u) | r : (w & 0x0000ffffu) | (static_cast<uint32_t>(r) << 16);
    } else if constexpr (sizeof(raw_t) == 4) {
      word(p, e) = r;
    } else {
      word(p, 2 * e) = static_cast<uint32_t>(r);
      word(p, 2 * e + 1) = static_cast<uint32_t>(r >> 32);
    }
  }
  __device__ static at::opmath_type<scalar_t> value(const Pack& p, int e) { return Elem<scalar_t>::to_acc(get(p, e)); }
  // Rounds and stores element e of every pack from f(e): two 16-bit elements a word with
  // one paired conversion (cvt.rn.bf16x2.f32 / f16x2) instead of two and a merge.
  template <typename F>
  __device__ static Pack make(F f) {
    Pack out;
    if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(f(2 * w), f(2 * w + 1));
        word(out, w) = *reinterpret_cast<const uint32_t*>(&v);
      }
    } else if constexpr (std::is_same_v<scalar_t, c10::Half>) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const __half2 v = __floats2half2_rn(f(2 * w), f(2 * w + 1));
        word(out, w) = *reinterpret_cast<const uint32_t*>(&v);
      }
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) set(out, e, Elem<scalar_t>::from_acc(f(e)));
    }
    return out;
  }
};

// A weight or bias element of any float dtype, read on the device so that no host
// synchronisation (and no conversion kernel) is needed.
struct ParamRef {
  const void* ptr;
  int64_t stride;
  c10::ScalarType dtype;
};

template <typename acc_t>
__device__ __forceinline__ acc_t load_param(const ParamRef& p, int64_t i) {
  switch (p.dtype) {
    case c10::ScalarType::Double:
      return static_cast<acc_t>(static_cast<const double*>(p.ptr)[i * p.stride]);
    case c10::ScalarType::Half:
      return static_cast<acc_t>(static_cast<float>(static_cast<const c10::Half*>(p.ptr)[i * p.stride]));
    case c10::ScalarType::BFloat16:
      return static_cast<acc_t>(static_cast<float>(static_cast<const c10::BFloat16*>(p.ptr)[i * p.stride]));
    default:
      return static_cast<acc_t>(static_cast<const float*>(p.ptr)[i * p.stride]);
  }
}

// Loads pack `p` of a row (columns p*VEC .. p*VEC+VEC-1), zero past H. The
// element-wise path (misaligned rows, the tail of an odd H) gives the same values.
template <typename scalar_t>
__device__ __forceinline__ Pack load_pack(const scalar_t* row, int64_t p, int64_t H, bool vec_ok) {
  using P = PackOf<scalar_t>;
  const int64_t col = p * P::kVec;
  if (vec_ok && col + P::kVec <= H) return *reinterpret_cast<const Pack*>(row + col);
  const auto* raw = reinterpret_cast<const typename P::raw_t*>(row);
  Pack out = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int e = 0; e < P::kVec; ++e) {
    if (col + e < H) P::set(out, e, raw[col + e]);
  }
  return out;
}

template <typename scalar_t>
__device__ __forceinline__ void store_pack(scalar_t* row, int64_t p, int64_t H, bool vec_ok, const Pack& val) {
  using P = PackOf<scalar_t>;
  const int64_t col = p * P::kVec;
  if (vec_ok && col + P::kVec <= H) {
    *reinterpret_cast<Pack*>(row + col) = val;
    return;
  }
  auto* raw = reinterpret_cast<typename P::raw_t*>(row);
#pragma unroll
  for (int e = 0; e < P::kVec; ++e) {
    if (col + e < H) raw[col + e] = P::get(val, e);
  }
}

// Sums N values over the G threads of each row group; every thread of the group gets
// the total. Inside a warp: xor shuffles over offsets < min(G, 32) (groups are aligned
// to G lanes). Across the G / 32 warps of a larger group: each warp's lane 0 writes to
// shared memory and every thread adds the warp totals in warp order. The shape of the
// tree depends only on G. All threads of the block must call it.
template <int N, typename acc_t>
__device__ __forceinline__ void group_reduce(acc_t (&v)[N], acc_t (*smem)[N]) {
  const int G = blockDim.x;
  const int width = G < 32 ? G : 32;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    for (int off = width / 2; off > 0; off /= 2) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
  }
  if (G > 32) {
    const int warps = G / 32;
    const int warp = threadIdx.x / 32;
    acc_t(*group_smem)[N] = smem + threadIdx.y * warps;
    if (threadIdx.x % 32 == 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) group_smem[warp][k] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < N; ++k) {
      acc_t total = group_smem[0][k];
      for (int w = 1; w < warps; ++w) total += group_smem[w][k];
      v[k] = total;
    }
  }
}

// Where a backward launch puts dW and dB (docs/MATH.md): each block writes its partial
// sums [dw0, dw1, dw2, db] for its rows, and the last block to finish sums all the partials.
template <typename acc_t>
struct ParamGrads {
  acc_t* partials;          // [gridDim.x, 4] opmath: one block's sums each
  unsigned int* arrivals;   // blocks done so far; 0 between launches
  acc_t* grad_weight;       // (3,) opmath: [dw0, dw1, dw2]
  acc_t* grad_bias;         // (1,) opmath
};

// The fused multiply (kMul = true: mul_forward, mul_backward), docs/MATH.md:
//   forward:  out = y * mul, with y in opmath, never rounded by itself;
//   backward: g = grad_out * mul (opmath) drives PolyNorm's backward, and
//             grad_mul = grad_out * y, y recomputed from x and rstd (Horner form, as forward).
// Unused (and compiled out) when kMul = false.
template <typename scalar_t>
struct MulArgs {
  const scalar_t* mul;   // [M, H], rows row_stride apart
  int64_t row_stride;
  bool vec_ok;           // mul's rows are 16-byte aligned (else element-wise loads)
  scalar_t* grad_mul;    // backward: [M, H] contiguous
  bool grad_vec_ok;      // grad_mul's rows are 16-byte aligned and H % VEC == 0
  ParamRef bias;         // backward: (1,) any float dtype, for y
};

// Grouped PolyNorm (grouped_forward, grouped_backward; docs/MATH.md, "Grouped PolyNorm"): the
// same kernels with a per-row expert, a runtime switch (offsets.ptr == nullptr: not grouped;
// the fused op's builds, kMul = true, compile it out). The kernel's weight and bias are then
// the [E, 3] and [E] (or [E, 1]) tensors: weight.stride steps between an expert's w0, w1, w2,
// and the expert strides below between experts. Per row:
// - the row's expert e is the first with offsets[e] > row (expert_of, a binary search, done
//   before the row's loads are issued: it runs while few registers are live); its w0, w1, w2
//   and b are read for the row (L1-cached) instead of the kernel-wide values;
// - a row at or past offsets[E-1] (e = E) belongs to no expert: it is not read (a load of
//   length 0), it computes on zeros with zero parameters, and its y, rstd, grad_x and row
//   terms are 0;
// - backward: each row writes its [r_3 S_3, r_2 S_2, r_1 S_1, sum g] (what the single-expert
//   launch adds to the block's partial: the same expressions) to row_terms, and no block
//   partial or finish_param_grads runs; grouped_param_sums (polynorm_grouped_cuda.cu) then
//   sums each expert's segment in a fixed order.
// A row's bits therefore depend only on its data, its expert's parameters, H and the dtype.
template <typename acc_t>
struct GroupArgs {
  ExpertOffsets offsets;    // [E] int32/int64 cumulative end offsets; ptr == nullptr: not grouped
  int64_t w_expert_stride;  // weight [E, 3]: expert e's w_k at e * w_expert_stride + k * weight.stride
  int64_t b_expert_stride;  // bias [E] or [E, 1]: expert e's b at e * b_expert_stride
  acc_t* row_terms;         // backward: [M, 4] opmath, [r_3 S_3, r_2 S_2, r_1 S_1, sum g] per row
};

// Element i of a parameter tensor, strides applied by the caller.
template <typename acc_t>
__device__ __forceinline__ acc_t load_param_at(const ParamRef& p, int64_t i) {
  return load_param<acc_t>(ParamRef{p.ptr, 1, p.dtype}, i);
}

// Expert e's [w0, w1, w2] and (where `bias` is given) b; zeros for e = E (a row of no expert).
template <typename acc_t>
__device__ __forceinline__ void expert_params(const GroupArgs<acc_t>& grouping, const ParamRef& weight,
                                              const ParamRef* bias, int64_t e, acc_t& w0, acc_t& w1, acc_t& w2,
                                              acc_t& b) {
  w0 = w1 = w2 = b = acc_t(0);
  if (e < grouping.offsets.E) {
    const int64_t w_at = e * grouping.w_expert_stride;
    w0 = load_param_at<acc_t>(weight, w_at);
    w1 = load_param_at<acc_t>(weight, w_at + weight.stride);
    w2 = load_param_at<acc_t>(weight, w_at + 2 * weight.stride);
    if (bias != nullptr) b = load_param_at<acc_t>(*bias, e * grouping.b_expert_stride);
  }
}

// Called by every thread of a block right after its threads have written the block's
// partial (`tid`: the thread's index in the block of `threads`, a multiple of 32). The
// last block to arrive sums the partials in block order: warp k sums column k (lane l
// takes blocks l, l + 32, ...; then a fixed xor tree), so the bits do not depend on which
// block is last, and there are no atomics on the values: the same bits on every run. This
// replaces a second kernel launch (the threadFenceReduction pattern of the CUDA samples).
// atomicInc wraps the counter back to 0 on the last block, ready for the next launch;
// launches on one stream never overlap, so one counter per stream suffices
// (arrival_counter), and a launch captured in a CUDA graph has a counter of its own.
template <typename acc_t>
__device__ __forceinline__ void finish_param_grads(const ParamGrads<acc_t>& pg, int tid, int threads) {
  __shared__ bool last;
  __threadfence();  // this block's partial is visible to all blocks before it is counted
  __syncthreads();
  if (tid == 0) {
    __threadfence();  // cumulative: the partial's stores, ordered before it by the barrier
    last = atomicInc(pg.arrivals, gridDim.x - 1) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // every other block's partial is visible to this one
  // Warp k sums columns k, k + warps, ... (blocks of 96 threads: warp 0 takes column 3 too).
  const int lane = tid % 32;
  for (int col = tid / 32; col < 4; col += threads / 32) {
    acc_t total = acc_t(0);
    for (int64_t b = lane; b < gridDim.x; b += 32) total += __ldcg(pg.partials + b * 4 + col);
    for (int off = 16; off > 0; off /= 2) total += __shfl_xor_sync(0xffffffffu, total, off);
    if (lane == 0) {
      if (col < 3) {
        pg.grad_weight[col] = total;
      } else {
        pg.grad_bias[0] = total;
      }
    }
  }
}

// Forward. One pass accumulates sum x^2, x^4, x^6 in opmath; one group reduction
// combines all three; then rstd = [r_3, r_2, r_1] and y (Horner form) are written.
template <typename scalar_t, bool kMul>
__global__ void __launch_bounds__(kMaxGroup) poly_norm_fwd_tiled_kernel(
    const scalar_t* __restrict__ x,                // [M, H], rows x_row_stride apart
    int64_t x_row_stride,
    bool x_vec_ok,                                 // x rows are 16-byte aligned
    scalar_t* __restrict__ y,                      // [M, H] contiguous
    bool y_vec_ok,                                 // y rows are 16-byte aligned (H % VEC == 0)
    at::opmath_type<scalar_t>* __restrict__ rstd,  // [M, 3] opmath: rstd of x^3, x^2, x
    ParamRef weight,                               // (3,) any float dtype: [w0, w1, w2]
    ParamRef bias,                                 // (1,) any float dtype
    MulArgs<scalar_t> mul,                         // kMul: y is multiplied by mul
    GroupArgs<at::opmath_type<scalar_t>> grouping, // grouped: a per-row expert (weight [E, 3], bias [E])
    int64_t M,
    int64_t H,
    double eps) {
  using acc_t = at::opmath_type<scalar_t>;
  using P = PackOf<scalar_t>;
  __shared__ acc_t smem[kMaxGroup / 32][3];

  const int G = blockDim.x;
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool active = row < M;  // inactive threads still join the reductions
  const scalar_t* x_row = x + (active ? row : 0) * x_row_stride;
  scalar_t* y_row = y + (active ? row : 0) * H;

  // Grouped (GroupArgs): the row's expert (E: none); a row of no expert is not read.
  const bool grouped = !kMul && grouping.offsets.ptr != nullptr;
  const int64_t expert = grouped && active ? expert_of(grouping.offsets, row) : grouping.offsets.E;
  const bool owned = !grouped || expert < grouping.offsets.E;

  const int64_t packs = active && owned ? (H + P::kVec - 1) / P::kVec : 0;
  // Rows of up to G * kFwdPacks packs stay in registers (x read once); the launch
  // picks G so that every row up to kMaxGroup * kFwdPacks packs does. Longer rows are
  // walked twice, tile by tile; the second walk mostly hits L2.
  const bool resident = packs <= int64_t(G) * kFwdPacks;

  Pack buf[kFwdPacks];
  acc_t s[3] = {acc_t(0), acc_t(0), acc_t(0)};
  auto accumulate = [&](const Pack& pk) {
#pragma unroll
    for (int e = 0; e < P::kVec; ++e) {
      const acc_t v = P::value(pk, e);
      const acc_t v2 = v * v;
      s[0] += v2;
      s[1] += v2 * v2;
      s[2] += v2 * v2 * v2;
    }
  };
  if (resident) {
    const int n = static_cast<int>(packs);
#pragma unroll
    for (int i = 0; i < kFwdPacks; ++i) {
      const int p = threadIdx.x + i * G;
      if (p < n) buf[i] = load_pack(x_row, p, H, x_vec_ok);
    }
#pragma unroll
    for (int i = 0; i < kFwdPacks; ++i) {
      if (int(threadIdx.x) + i * G < n) accumulate(buf[i]);
    }
  } else {
    for (int64_t p0 = threadIdx.x; p0 < packs; p0 += int64_t(G) * kFwdPacks) {
#pragma unroll
      for (int i = 0; i < kFwdPacks; ++i) {
        const int64_t p = p0 + int64_t(i) * G;
        if (p < packs) buf[i] = load_pack(x_row, p, H, x_vec_ok);
      }
#pragma unroll
      for (int i = 0; i < kFwdPacks; ++i) {
        if (p0 + int64_t(i) * G < packs) accumulate(buf[i]);
      }
    }
  }
  group_reduce<3>(s, smem);

  const acc_t inv_h = acc_t(1) / static_cast<acc_t>(H);
  const acc_t e = static_cast<acc_t>(eps);
  // 1/sqrt rather than rsqrt: IEEE-rounded, once per row.
  const acc_t r1 = acc_t(1) / sqrt(s[0] * inv_h + e);
  const acc_t r2 = acc_t(1) / sqrt(s[1] * inv_h + e);
  const acc_t r3 = acc_t(1) / sqrt(s[2] * inv_h + e);
  if (!active) return;  // no barrier below
  if (!owned) {  // grouped, a row of no expert: y = 0, rstd = 0
    for (int64_t p = threadIdx.x; p < (H + P::kVec - 1) / P::kVec; p += G) {
      store_pack(y_row, p, H, y_vec_ok, make_uint4(0u, 0u, 0u, 0u));
    }
    if (threadIdx.x == 0) {
      for (int k = 0; k < 3; ++k) rstd[row * 3 + k] = acc_t(0);
    }
    return;
  }
  if (threadIdx.x == 0) {
    rstd[row * 3 + 0] = r3;
    rstd[row * 3 + 1] = r2;
    rstd[row * 3 + 2] = r1;
  }
  // The row's parameters: the kernel's, or its expert's.
  acc_t w0, w1, w2, b;
  if (grouped) {
    expert_params(grouping, weight, &bias, expert, w0, w1, w2, b);
  } else {
    w0 = load_param<acc_t>(weight, 0), w1 = load_param<acc_t>(weight, 1);
    w2 = load_param<acc_t>(weight, 2), b = load_param<acc_t>(bias, 0);
  }
  const acc_t a3 = w0 * r3;
  const acc_t a2 = w1 * r2;
  const acc_t a1 = w2 * r1;
  const scalar_t* m_row = kMul ? mul.mul + row * mul.row_stride : nullptr;
  auto output = [&](const Pack& pk, int64_t p) {
    Pack m;
    if constexpr (kMul) m = load_pack(m_row, p, H, mul.vec_ok);
    Pack out;
#pragma unroll
    for (int e = 0; e < P::kVec; ++e) {
      const acc_t v = P::value(pk, e);
      acc_t o = v * (a1 + v * (a2 + v * a3)) + b;  // Horner form
      if constexpr (kMul) o *= P::value(m, e);
      P::set(out, e, Elem<scalar_t>::from_acc(o));
    }
    return out;
  };

  if (resident) {
    const int n = static_cast<int>(packs);
#pragma unroll
    for (int i = 0; i < kFwdPacks; ++i) {
      const int p = threadIdx.x + i * G;
      if (p < n) {
        keep_raw(buf[i]);
        store_pack(y_row, p, H, y_vec_ok, output(buf[i], p));
      }
    }
  } else {
    for (int64_t p0 = threadIdx.x; p0 < packs; p0 += int64_t(G) * kFwdPacks) {
#pragma unroll
      for (int i = 0; i < kFwdPacks; ++i) {
        const int64_t p = p0 + int64_t(i) * G;
        if (p < packs) buf[i] = load_pack(x_row, p, H, x_vec_ok);
      }
#pragma unroll
      for (int i = 0; i < kFwdPacks; ++i) {
        const int64_t p = p0 + int64_t(i) * G;
        if (p < packs) store_pack(y_row, p, H, y_vec_ok, output(buf[i], p));
      }
    }
  }
}

// Backward. One pass accumulates S_1, S_2, S_3 (S_p = sum g x^p) and sum g; one group
// reduction combines all four; then dx is written (docs/MATH.md):
//   c_p = w(p) p r_p,  d_p = c_p r_p^2 S_p / H,
//   dx  = g (c_1 + x (c_2 + x c_3)) - x (d_1 + x^2 (d_2 + x^2 d_3)).
// Each block also writes its rows' share of [dw0, dw1, dw2, db] = sum over rows of
// [r_3 S_3, r_2 S_2, r_1 S_1, sum g], summed over its row groups in a fixed order.
template <typename scalar_t, bool kMul>
__global__ void __launch_bounds__(kMaxGroup) poly_norm_bwd_tiled_kernel(
    const scalar_t* __restrict__ grad_y,                 // [M, H], rows g_row_stride apart (0 for an expand)
    int64_t g_row_stride,
    bool g_vec_ok,
    const scalar_t* __restrict__ x,                      // [M, H], rows x_row_stride apart
    int64_t x_row_stride,
    bool x_vec_ok,
    const at::opmath_type<scalar_t>* __restrict__ rstd,  // [M, 3] opmath: rstd of x^3, x^2, x
    ParamRef weight,                                     // (3,) any float dtype: [w0, w1, w2]
    scalar_t* __restrict__ grad_x,                       // [M, H] contiguous
    bool dx_vec_ok,
    ParamGrads<at::opmath_type<scalar_t>> param_grads,   // dW, dB: partials, then the last block's sum
    MulArgs<scalar_t> mul,                               // kMul: grad_y = grad_out * mul; writes grad_mul
    GroupArgs<at::opmath_type<scalar_t>> grouping,       // grouped: a per-row expert; row terms, not param_grads
    int64_t M,
    int64_t H) {
  using acc_t = at::opmath_type<scalar_t>;
  using P = PackOf<scalar_t>;
  __shared__ acc_t smem[kMaxGroup / 32][4];
  __shared__ acc_t row_part[kBlockThreads][4];

  const int G = blockDim.x;
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool active = row < M;
  const scalar_t* g_row = grad_y + (active ? row : 0) * g_row_stride;
  const scalar_t* x_row = x + (active ? row : 0) * x_row_stride;
  scalar_t* dx_row = grad_x + (active ? row : 0) * H;
  const scalar_t* m_row = kMul ? mul.mul + (active ? row : 0) * mul.row_stride : nullptr;
  scalar_t* dm_row = kMul ? mul.grad_mul + (active ? row : 0) * H : nullptr;

  // Grouped (GroupArgs): the row's expert (E: none); a row of no expert is not read.
  const bool grouped = !kMul && grouping.offsets.ptr != nullptr;
  const int64_t expert = grouped && active ? expert_of(grouping.offsets, row) : grouping.offsets.E;
  const bool owned = !grouped || expert < grouping.offsets.E;

  const int64_t packs = active && owned ? (H + P::kVec - 1) / P::kVec : 0;
  // As in forward: rows of up to G * kBwdPacks packs keep x and grad_y in registers.
  const bool resident = packs <= int64_t(G) * kBwdPacks;

  Pack xb[kBwdPacks];
  Pack gb[kBwdPacks];
  Pack mb[kMul ? kBwdPacks : 1];  // kMul: mul's packs; gb holds grad_out's
  // g: the gradient reaching PolyNorm's y (grad_out * mul when kMul), in opmath.
  auto grad_of = [&](const Pack& gp, const Pack& mp, int e) {
    if constexpr (kMul) return P::value(gp, e) * P::value(mp, e);
    return P::value(gp, e);
  };
  acc_t s[4] = {acc_t(0), acc_t(0), acc_t(0), acc_t(0)};
  auto accumulate = [&](const Pack& xp, const Pack& gp, const Pack& mp) {
#pragma unroll
    for (int e = 0; e < P::kVec; ++e) {
      const acc_t v = P::value(xp, e);
      const acc_t g = grad_of(gp, mp, e);
      const acc_t gx = g * v;
      s[0] += gx;
      s[1] += gx * v;
      s[2] += gx * v * v;
      s[3] += g;
    }
  };
  if (resident) {
    const int n = static_cast<int>(packs);
#pragma unroll
    for (int i = 0; i < kBwdPacks; ++i) {
      const int p = threadIdx.x + i * G;
      if (p < n) {
        xb[i] = load_pack(x_row, p, H, x_vec_ok);
        gb[i] = load_pack(g_row, p, H, g_vec_ok);
        if constexpr (kMul) mb[i] = load_pack(m_row, p, H, mul.vec_ok);
      }
    }
#pragma unroll
    for (int i = 0; i < kBwdPacks; ++i) {
      if (int(threadIdx.x) + i * G < n) accumulate(xb[i], gb[i], mb[kMul ? i : 0]);
    }
  } else {
    for (int64_t p0 = threadIdx.x; p0 < packs; p0 += int64_t(G) * kBwdPacks) {
#pragma unroll
      for (int i = 0; i < kBwdPacks; ++i) {
        const int64_t p = p0 + int64_t(i) * G;
        if (p < packs) {
          xb[i] = load_pack(x_row, p, H, x_vec_ok);
          gb[i] = load_pack(g_row, p, H, g_vec_ok);
          if constexpr (kMul) mb[i] = load_pack(m_row, p, H, mul.vec_ok);
        }
      }
#pragma unroll
      for (int i = 0; i < kBwdPacks; ++i) {
        if (p0 + int64_t(i) * G < packs) accumulate(xb[i], gb[i], mb[kMul ? i : 0]);
      }
    }
  }
  group_reduce<4>(s, smem);

  acc_t r3 = acc_t(0), r2 = acc_t(0), r1 = acc_t(0);
  if (active && owned) {
    r3 = rstd[row * 3 + 0];
    r2 = rstd[row * 3 + 1];
    r1 = rstd[row * 3 + 2];
  }
  if (grouped) {
    // The row's share of its expert's [dw0, dw1, dw2, db] (0 for a row of no expert).
    if (active && threadIdx.x == 0) {
      grouping.row_terms[row * 4 + 0] = r3 * s[2];
      grouping.row_terms[row * 4 + 1] = r2 * s[1];
      grouping.row_terms[row * 4 + 2] = r1 * s[0];
      grouping.row_terms[row * 4 + 3] = s[3];
    }
  } else {
    // This block's share of the parameter gradients: row groups in order, then one write.
    if (threadIdx.x == 0) {
      row_part[threadIdx.y][0] = active ? r3 * s[2] : acc_t(0);
      row_part[threadIdx.y][1] = active ? r2 * s[1] : acc_t(0);
      row_part[threadIdx.y][2] = active ? r1 * s[0] : acc_t(0);
      row_part[threadIdx.y][3] = active ? s[3] : acc_t(0);
    }
    __syncthreads();
    const int tid = threadIdx.y * G + threadIdx.x;  // G may be smaller than 4
    if (tid < 4) {
      acc_t total = row_part[0][tid];
      for (int r = 1; r < blockDim.y; ++r) total += row_part[r][tid];
      param_grads.partials[int64_t(blockIdx.x) * 4 + tid] = total;
    }
    finish_param_grads(param_grads, tid, int(blockDim.x * blockDim.y));
  }
  if (!active) return;  // no barrier below
  if (!owned) {  // grouped, a row of no expert: grad_x = 0
    for (int64_t p = threadIdx.x; p < (H + P::kVec - 1) / P::kVec; p += G) {
      store_pack(dx_row, p, H, dx_vec_ok, make_uint4(0u, 0u, 0u, 0u));
    }
    return;
  }

  // The row's weights: the kernel's, or its expert's.
  acc_t w0, w1, w2, no_bias;
  if (grouped) {
    expert_params(grouping, weight, nullptr, expert, w0, w1, w2, no_bias);
  } else {
    w0 = load_param<acc_t>(weight, 0), w1 = load_param<acc_t>(weight, 1), w2 = load_param<acc_t>(weight, 2);
  }
  const acc_t inv_h = acc_t(1) / static_cast<acc_t>(H);
  const acc_t c1 = w2 * r1;
  const acc_t c2 = acc_t(2) * w1 * r2;
  const acc_t c3 = acc_t(3) * w0 * r3;
  const acc_t d1 = c1 * ((r1 * s[0] * inv_h) * r1);  // not r^3 first: see the row kernel
  const acc_t d2 = c2 * ((r2 * s[1] * inv_h) * r2);
  const acc_t d3 = c3 * ((r3 * s[2] * inv_h) * r3);

  // kMul: y's Horner coefficients, as forward computes them.
  const acc_t a3 = kMul ? w0 * r3 : acc_t(0);
  const acc_t a2 = kMul ? w1 * r2 : acc_t(0);
  const acc_t a1 = kMul ? w2 * r1 : acc_t(0);
  const acc_t b = kMul ? load_param<acc_t>(mul.bias, 0) : acc_t(0);
  // Writes pack p of dx (and, kMul, of grad_mul).
  auto output = [&](const Pack& xp, const Pack& gp, const Pack& mp, int64_t p) {
    Pack out;
#pragma unroll
    for (int e = 0; e < P::kVec; ++e) {
      const acc_t v = P::value(xp, e);
      const acc_t g = grad_of(gp, mp, e);
      const acc_t v2 = v * v;
      P::set(out, e, Elem<scalar_t>::from_acc(g * (c1 + v * (c2 + v * c3)) - v * (d1 + v2 * (d2 + v2 * d3))));
    }
    store_pack(dx_row, p, H, dx_vec_ok, out);
    if constexpr (kMul) {
#pragma unroll
      for (int e = 0; e < P::kVec; ++e) {
        const acc_t v = P::value(xp, e);
        P::set(out, e, Elem<scalar_t>::from_acc(P::value(gp, e) * (v * (a1 + v * (a2 + v * a3)) + b)));
      }
      store_pack(dm_row, p, H, mul.grad_vec_ok, out);
    }
  };
  if (resident) {
    const int n = static_cast<int>(packs);
#pragma unroll
    for (int i = 0; i < kBwdPacks; ++i) {
      const int p = threadIdx.x + i * G;
      if (p < n) {
        keep_raw(xb[i]);
        keep_raw(gb[i]);
        output(xb[i], gb[i], mb[kMul ? i : 0], p);
      }
    }
  } else {
    for (int64_t p0 = threadIdx.x; p0 < packs; p0 += int64_t(G) * kBwdPacks) {
#pragma unroll
      for (int i = 0; i < kBwdPacks; ++i) {
        const int64_t p = p0 + int64_t(i) * G;
        if (p < packs) {
          xb[i] = load_pack(x_row, p, H, x_vec_ok);
          gb[i] = load_pack(g_row, p, H, g_vec_ok);
          if constexpr (kMul) mb[i] = load_pack(m_row, p, H, mul.vec_ok);
        }
      }
#pragma unroll
      for (int i = 0; i < kBwdPacks; ++i) {
        const int64_t p = p0 + int64_t(i) * G;
        if (p < packs) output(xb[i], gb[i], mb[kMul ? i : 0], p);
      }
    }
  }
}

// ----------------------------------------------------------------------------------
// Row kernels (v5): a row held in registers by G threads with few threads a row and
// many bytes a thread (kPacks 16-byte packs: 128 bytes of x forward, 64 of x and 64 of
// grad_y backward), so that an SM keeps ~100 KB of loads in flight with no barrier
// but the reduction's. This is the layout of QuACK's norms (Tri Dao et al.). Used for
// every row of up to 1024 * kPacks packs.
// - The row's packs are split into warp segments (RowLane): every warp access is 512
//   contiguous bytes, and the neighbour of a lane's pack is the next lane's.
// - Blocks of R = threads / G rows; a grid-stride loop, persistent or a block per R rows
//   (launch_forward_row says which).
// - Misaligned rows (odd H, views such as buf[1:]) read and write whole aligned 16-byte
//   chunks. Realigned build: a lane's pack is realigned from its chunk and the next one
//   (a shuffle; past its segment, one more load), and stores go the other way, narrowly
//   only at the row's ends and where segments meet. Same-phase build (every tensor's rows
//   start alike): the elementwise part works on the chunks as loaded and only the sums
//   see realigned packs. Either way the sums, and so the bits, are the aligned row's.
// ----------------------------------------------------------------------------------

// Blocks of the <= 256-thread builds that must fit an SM at once: 3 caps them at 80
// registers a thread. Set with -DPOLYNORM_ROW_MIN_BLOCKS=1 (no cap) for measurements.
#ifndef POLYNORM_ROW_MIN_BLOCKS
#define POLYNORM_ROW_MIN_BLOCKS 3
#endif

// Blocks of a <= 256-thread build that must fit an SM at once: 3 (80 registers a thread)
// for rows of 8 or more packs a thread in registers; 4 (64 registers) for fewer, which
// need fewer registers, so that more rows are in flight.
constexpr int row_min_blocks(int max_threads, bool mul, int packs_held) {
  return max_threads != 256 ? 1 : (mul || packs_held >= 8) ? POLYNORM_ROW_MIN_BLOCKS : 4;
}

// Where the group's lanes stand: G threads a row, in warp segments of W = min(G, 32)
// lanes. Segment k owns the row's packs [k S, (k + 1) S), S = W * kPacks, and its lane j
// owns packs k S + j, k S + j + W, ..., so every warp access is 512 contiguous bytes and
// the neighbour of a lane's pack is the next lane's (the segment's last lane: lane 0's next
// pack, or, past its last, the next segment's first).
struct RowLane {
  int lane;  // 0..G-1
  int G;
  int W;
  int j;     // lane within its segment, 0..W-1
  int base;  // the lane's first pack: packs base + i * W, i < kPacks
  int seg_end;  // first pack past the segment: base of the next segment's lane 0
};

// A row of C > 1 CTAs (a thread-block cluster, C consecutive blocks): CTA `rank` holds lanes
// [rank G, (rank + 1) G) of the row's C G, so the lane layout, the packs a lane owns and the
// load/store code are those of one CTA of C G threads.
template <int kPacks>
__device__ __forceinline__ RowLane row_lane(int G, int C) {
  const int rank = C > 1 ? static_cast<int>(blockIdx.x % C) : 0;
  const int lane = rank * G + static_cast<int>(threadIdx.x) % G;
  const int Gt = G * C;
  const int W = Gt < 32 ? Gt : 32;
  const int j = lane % W;
  const int seg = lane / W;
  return RowLane{lane, Gt, W, j, seg * W * kPacks + j, (seg + 1) * W * kPacks};
}

// Whether pack slot i of every lane of this warp lies past the row's `packs` (the same for
// the whole warp: its lanes differ only in j). Such slots hold zeros or bytes past the row;
// their arithmetic is skipped in the aligned builds (measured: in the realigning builds the
// skip cost more in spills than it saved, bench/NOTES.md v5).
__device__ __forceinline__ bool warp_idle(const RowLane& rl, int i, int packs) {
  return rl.base - rl.j + i * rl.W >= packs;
}

// The 16 bytes that start `shift` bytes into chunk a (and run on into chunk b), for a
// shift that varies by row: selects, no branch (rows of one warp may differ).
__device__ __forceinline__ Pack realign_any(const Pack& a, const Pack& b, int shift) {
  const bool hi2 = (shift & 8) != 0, hi1 = (shift & 4) != 0;
  const uint32_t v0 = hi2 ? a.z : a.x, v1 = hi2 ? a.w : a.y, v2 = hi2 ? b.x : a.z;
  const uint32_t v3 = hi2 ? b.y : a.w, v4 = hi2 ? b.z : b.x, v5 = hi2 ? b.w : b.y;
  const uint32_t w0 = hi1 ? v1 : v0, w1 = hi1 ? v2 : v1, w2 = hi1 ? v3 : v2;
  const uint32_t w3 = hi1 ? v4 : v3, w4 = hi1 ? v5 : v4;
  const unsigned bits = (shift & 3) * 8;
  return make_uint4(__funnelshift_r(w0, w1, bits), __funnelshift_r(w1, w2, bits), __funnelshift_r(w2, w3, bits),
                    __funnelshift_r(w3, w4, bits));
}

__device__ __forceinline__ Pack shfl_pack(const Pack& v, int src, int width) {
  return make_uint4(__shfl_sync(0xffffffffu, v.x, src, width), __shfl_sync(0xffffffffu, v.y, src, width),
                    __shfl_sync(0xffffffffu, v.z, src, width), __shfl_sync(0xffffffffu, v.w, src, width));
}

// Loads a row's packs into registers in two steps, so that the loads of several rows
// (x and grad_y) are in flight together: issue_row starts them, finish_row realigns.
// Afterwards buf[i] = pack base + i * W (zero past the row; elements past H inside the
// last pack are garbage until finish_row masks them). `realign_rows`: some rows of the
// tensor are not 16-byte aligned; each lane then loads the aligned 16-byte chunk of its
// pack's index, and the segment's last lane also the chunk after its segment (`ext`).
// kMayBeEmpty (the grouped builds, kGrouped): H may be 0, which loads nothing (every pack
// zero): a grouped row of no expert.
template <typename scalar_t, int kPacks, bool kMayBeEmpty = false>
__device__ __forceinline__ void issue_row(Pack (&buf)[kPacks], Pack& ext, const scalar_t* row, int64_t H,
                                          const RowLane& rl, bool realign_rows) {
  constexpr int kVec = PackOf<scalar_t>::kVec;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(row);
  const int shift = realign_rows ? static_cast<int>(addr & 15) : 0;
  const Pack* src = reinterpret_cast<const Pack*>(addr - shift);
  // Chunks covering the row: its packs, or one more when a misaligned row spills over.
  int chunks = realign_rows ? static_cast<int>((shift + H * int64_t(sizeof(scalar_t)) + 15) / 16)
                            : static_cast<int>((H + kVec - 1) / kVec);
  if (kMayBeEmpty && H == 0) chunks = 0;  // not even the chunk where a misaligned row starts
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const int p = rl.base + i * rl.W;
    buf[i] = p < chunks ? src[p] : make_uint4(0u, 0u, 0u, 0u);
  }
  if (realign_rows) {
    ext = (rl.j == rl.W - 1 && rl.seg_end < chunks) ? src[rl.seg_end] : make_uint4(0u, 0u, 0u, 0u);
  }
}

template <typename scalar_t, int kPacks>
__device__ __forceinline__ void finish_row(Pack (&buf)[kPacks], const Pack& ext, const scalar_t* row, int64_t H,
                                           const RowLane& rl, bool realign_rows, bool mask_tail) {
  using P = PackOf<scalar_t>;
  if (realign_rows) {
    const int shift = static_cast<int>(reinterpret_cast<uintptr_t>(row) & 15);
    const int from = rl.j + 1 == rl.W ? 0 : rl.j + 1;
    // Pack p = the chunks p and p + 1 from `shift` on. Chunk p + 1 is the next lane's
    // chunk; for the segment's last lane, lane 0's next one (or ext, after the last).
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const Pack offer = (rl.j == 0 && i + 1 < kPacks) ? buf[i + 1 < kPacks ? i + 1 : i] : buf[i];
      Pack next = shfl_pack(offer, from, rl.W);  // every lane takes part
      if (rl.j == rl.W - 1 && i + 1 == kPacks) next = ext;
      buf[i] = realign_any(buf[i], next, shift);
    }
  }
  // Zero what lies past the row (packs past the end, the tail of a partial last pack),
  // so that the sums need no per-element test. Without mask_tail the row is whole packs.
  if (mask_tail) {
    const int packs = static_cast<int>((H + P::kVec - 1) / P::kVec);
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int p = rl.base + i * rl.W;
      if (p >= packs) {
        buf[i] = make_uint4(0u, 0u, 0u, 0u);
      } else if (p == packs - 1) {
        const int valid = static_cast<int>(H - int64_t(p) * P::kVec);
#pragma unroll
        for (int e = 1; e < P::kVec; ++e) {
          if (e >= valid) P::set(buf[i], e, typename P::raw_t(0));
        }
      }
    }
  }
}

// Writes elements of `v` at byte offsets [lo, hi) of the 16-byte chunk `dst`.
template <typename scalar_t>
__device__ __forceinline__ void store_chunk_part(Pack* dst, const Pack& v, int lo, int hi) {
  using P = PackOf<scalar_t>;
  using raw_t = typename P::raw_t;
  raw_t* out = reinterpret_cast<raw_t*>(dst);
#pragma unroll
  for (int e = 0; e < P::kVec; ++e) {
    const int at = e * int(sizeof(raw_t));
    if (at >= lo && at < hi) out[e] = P::get(v, e);
  }
}

// Stores the packs of a row (the inverse of issue_row + finish_row). Without
// `realign_rows` every row is 16-byte aligned and H is a multiple of the pack width.
// Otherwise each lane writes the aligned chunk of its pack's index: the tail of the
// previous pack (the previous lane's; for lane 0, the segment's last lane's previous one)
// and the head of its own. Only the row's two ends and the chunk where two segments meet
// are written narrowly (each segment writes its own bytes of it).
template <typename scalar_t, int kPacks>
__device__ __forceinline__ void store_row(scalar_t* row, const Pack (&out)[kPacks], int64_t H, const RowLane& rl,
                                          bool realign_rows, bool active) {
  constexpr int kVec = PackOf<scalar_t>::kVec;
  const int P = static_cast<int>((H + kVec - 1) / kVec);
  if (!realign_rows) {
    if (!active) return;
    Pack* dst = reinterpret_cast<Pack*>(row);
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int p = rl.base + i * rl.W;
      if (p < P) dst[p] = out[i];
    }
    return;
  }
  const uintptr_t addr = reinterpret_cast<uintptr_t>(row);
  const int shift = static_cast<int>(addr & 15);
  Pack* dst = reinterpret_cast<Pack*>(addr - shift);
  const int end = shift + static_cast<int>(H) * int(sizeof(scalar_t));  // row end, in bytes from dst
  const int chunks = (end + 15) / 16;
  const int from = rl.j == 0 ? rl.W - 1 : rl.j - 1;
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const Pack offer = (rl.j == rl.W - 1 && i > 0) ? out[i > 0 ? i - 1 : i] : out[i];
    const Pack prev = shfl_pack(offer, from, rl.W);  // every lane takes part
    const int p = rl.base + i * rl.W;
    if (!active || p >= P) continue;
    // Chunk p: the last `shift` bytes of pack p - 1, then the first 16 - shift of pack p.
    // The segment's first pack has no pack p - 1 here: its owner writes that tail.
    const bool first = rl.j == 0 && i == 0;
    const int lo = (shift != 0 && first) ? shift : 0;
    const int hi = min(16, end - 16 * p);
    const Pack chunk = shift == 0 ? out[i] : realign_any(prev, out[i], 16 - shift);
    if (lo == 0 && hi == 16) {
      dst[p] = chunk;
    } else {
      store_chunk_part<scalar_t>(dst + p, chunk, lo, hi);
    }
    const bool seg_last = rl.j == rl.W - 1 && i + 1 == kPacks;
    if (shift != 0 && (seg_last || p == P - 1) && p + 1 < chunks) {
      // This pack's tail: the first `shift` bytes of chunk p + 1.
      store_chunk_part<scalar_t>(dst + p + 1, realign_any(out[i], out[i], 16 - shift), 0,
                                 min(shift, end - 16 * (p + 1)));
    }
  }
}

// The row kernels' builds by layout (the kLayout template argument).
enum RowLayout : int { kAligned = 0, kRealigned = 1, kSamePhase = 2 };

// Same-phase rows (every tensor of a row starts at the same offset into its 16-byte chunk,
// as odd-H rows of contiguous tensors do): the elementwise part runs on the chunks as
// loaded, and only the sums see realigned packs, one at a time (realigned_pack), so that
// their order, and so the bits, are those of the aligned row. The stores then write
// whole aligned chunks, narrowly only at the row's two ends (store_own_chunk).
template <int kPacks>
__device__ __forceinline__ Pack realigned_pack(const Pack (&buf)[kPacks], const Pack& ext, int i, int shift,
                                               const RowLane& rl) {
  const int from = rl.j + 1 == rl.W ? 0 : rl.j + 1;
  const Pack offer = (rl.j == 0 && i + 1 < kPacks) ? buf[i + 1 < kPacks ? i + 1 : i] : buf[i];
  Pack next = shfl_pack(offer, from, rl.W);  // every lane takes part
  if (rl.j == rl.W - 1 && i + 1 == kPacks) next = ext;
  return realign_any(buf[i], next, shift);
}

// Pack p with what lies past the row (packs past the end, the tail of a partial last
// pack) zeroed.
template <typename scalar_t>
__device__ __forceinline__ Pack mask_pack(Pack v, int p, int64_t H) {
  using P = PackOf<scalar_t>;
  const int packs = static_cast<int>((H + P::kVec - 1) / P::kVec);
  if (p >= packs) return make_uint4(0u, 0u, 0u, 0u);
  if (p == packs - 1) {
    const int valid = static_cast<int>(H - int64_t(p) * P::kVec);
#pragma unroll
    for (int e = 1; e < P::kVec; ++e) {
      if (e >= valid) P::set(v, e, typename P::raw_t(0));
    }
  }
  return v;
}

// Writes chunk p of a same-phase row: bytes [shift, 16) of the first chunk, [0, end - 16 p)
// of the last, the whole chunk in between. `dst`: the row's first chunk; `end`: the row's
// end in bytes from it.
template <typename scalar_t>
__device__ __forceinline__ void store_own_chunk(Pack* dst, int p, const Pack& v, int shift, int end) {
  const int lo = p == 0 ? shift : 0;
  const int hi = min(16, end - 16 * p);
  if (lo == 0 && hi == 16) {
    dst[p] = v;
  } else {
    store_chunk_part<scalar_t>(dst + p, v, lo, hi);
  }
}

// Sums N values over the G lanes of each row group; every lane gets the total. Inside
// a warp: xor shuffles over offsets < W. Across the G / 32 warps of a larger group: a
// double-buffered shared slot per warp (`red[parity]`), one barrier, then every lane
// adds the warp totals in warp order. The tree depends only on G.
template <int N, typename acc_t>
__device__ __forceinline__ void row_reduce(acc_t (&v)[N], acc_t (*red)[N], const RowLane& rl) {
#pragma unroll
  for (int k = 0; k < N; ++k) {
    for (int off = rl.W / 2; off > 0; off /= 2) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
  }
  if (rl.G > 32) {
    const int warps = rl.G / 32;
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) red[warp][k] = v[k];
    }
    __syncthreads();
    acc_t(*group_red)[N] = red + (warp / warps) * warps;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      acc_t total = group_red[0][k];
      for (int w = 1; w < warps; ++w) total += group_red[w][k];
      v[k] = total;
    }
  }
}

// Sums N values over a row held by a cluster of C CTAs of G threads each (G a multiple of
// 32); every lane gets the total. Each warp's total goes to its slot (the row's warp index,
// rl.lane / 32) in every CTA's `slots` (dynamic shared memory, [2][C G / 32][N], written
// through distributed shared memory by lanes 0..C-1), then one cluster barrier, then every
// lane adds all C G / 32 slots in a fixed order: lane l slots l, l + 32, ..., then an xor
// tree. The tree depends only on C G. Double-buffered by row parity like row_reduce: a CTA
// writes a peer's slots of parity p again only after passing the next row's barrier, which
// the peer reaches only after it has read them.
template <int N, typename acc_t>
__device__ __forceinline__ void cluster_row_reduce(acc_t (&v)[N], acc_t* slots, int parity, const RowLane& rl,
                                                   int C) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    for (int off = 16; off > 0; off /= 2) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
  }
  const int warps = rl.G / 32;
  acc_t* buffer = slots + parity * warps * N;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  cg::cluster_group cluster = cg::this_cluster();
  if (lane < C) {
    acc_t* dst = cluster.map_shared_rank(buffer + (rl.lane / 32) * N, lane);
#pragma unroll
    for (int k = 0; k < N; ++k) dst[k] = v[k];
  }
  cluster.sync();  // barrier.cluster arrive.release + wait.acquire: every slot written
#pragma unroll
  for (int k = 0; k < N; ++k) {
    acc_t total = acc_t(0);
    for (int w = lane; w < warps; w += 32) total += buffer[w * N + k];
    for (int off = 16; off > 0; off /= 2) total += __shfl_xor_sync(0xffffffffu, total, off);
    v[k] = total;
  }
#else
  __trap();  // clusters are launched on sm_90 and later only (plan_for)
#endif
}

// Forward, row kernel. blockDim.x = R * G; a row of C > 1 CTAs when launched as clusters
// of C (R = 1).
// kPrefetch (aligned builds, bench tuning): a row's loads are issued while the previous
// row is reduced and stored, into a second set of registers.
// kGrouped: the grouped builds (GroupArgs read); the others carry no code or registers for it.
template <typename scalar_t, int kPacks, int kLayout, int kMaxThreads, bool kMul, bool kGrouped, bool kPrefetch = false>
__global__ void __launch_bounds__(kMaxThreads, row_min_blocks(kMaxThreads, kMul, kPrefetch ? 2 * kPacks : kPacks))
    poly_norm_fwd_row_kernel(
    const scalar_t* __restrict__ x,                // [M, H], rows x_row_stride apart
    int64_t x_row_stride,
    bool x_realign_arg,                            // some x rows are not 16-byte aligned
    scalar_t* __restrict__ y,                      // [M, H] contiguous
    bool y_realign_arg,                            // y rows are not all aligned, or H % VEC != 0
    bool same_phase_arg,                           // x, y (and mul) rows start alike in their chunks
    at::opmath_type<scalar_t>* __restrict__ rstd,  // [M, 3] opmath: rstd of x^3, x^2, x
    ParamRef weight,                               // (3,) any float dtype: [w0, w1, w2]
    ParamRef bias,                                 // (1,) any float dtype
    MulArgs<scalar_t> mul,                         // kMul: y is multiplied by mul
    GroupArgs<at::opmath_type<scalar_t>> grouping, // grouped: a per-row expert (weight [E, 3], bias [E])
    int64_t M,
    int64_t H,
    double eps,
    int G,
    int C) {                                       // CTAs a row (a cluster of C, R = 1), or 1
  using acc_t = at::opmath_type<scalar_t>;
  using P = PackOf<scalar_t>;
  __shared__ acc_t red[2][kRowMaxThreads / 32][3];
  extern __shared__ __align__(16) unsigned char cluster_slots[];  // C > 1: [2][C G / 32][3]
  // kLayout (RowLayout): kAligned, every row aligned and H a multiple of the pack width
  // (no realignment code, no registers for it); kRealigned, rows realigned on load and
  // store; kSamePhase, rows that start alike in every tensor (realigned_pack).
  constexpr bool kRealign = kLayout != kAligned;
  const bool x_realign = kLayout == kRealigned && x_realign_arg;
  const bool y_realign = kLayout == kRealigned && y_realign_arg;
  const bool same_phase = kLayout == kSamePhase && same_phase_arg;

  const RowLane rl = row_lane<kPacks>(G, C);
  const int R = blockDim.x / G;
  const int group = threadIdx.x / G;
  const bool last_segment = rl.lane / rl.W + 1 == rl.G / rl.W;
  const int64_t cluster_id = C > 1 ? blockIdx.x / C : blockIdx.x;  // the block's rows: R from cluster_id R
  const int64_t clusters = C > 1 ? gridDim.x / C : gridDim.x;

  const acc_t w0 = load_param<acc_t>(weight, 0), w1 = load_param<acc_t>(weight, 1);
  const acc_t w2 = load_param<acc_t>(weight, 2), b = load_param<acc_t>(bias, 0);
  const acc_t inv_h = acc_t(1) / static_cast<acc_t>(H);
  const acc_t e = static_cast<acc_t>(eps);
  // Grouped (GroupArgs): a row's expert, E for a row of no expert or past M. Searched before
  // the row's loads are issued, so that a row of no expert is not read (a load of length 0,
  // all zeros); it then computes with zero parameters and rstd: y = 0. The expert's
  // parameters are read late (during the row's reduction), so that only the expert's index
  // is live while the row is in registers.
  const bool grouped = kGrouped && !kMul && grouping.offsets.ptr != nullptr;
  const int E = static_cast<int>(grouping.offsets.E);  // < 2^31: the launchers check it
  const auto expert_of_row = [&](int64_t row) {
    return row < M ? static_cast<int>(expert_of(grouping.offsets, row)) : E;
  };

  static_assert(!kPrefetch || (!kRealign && !kMul), "prefetch: aligned PolyNorm builds only");
  const int64_t step = clusters * R;
  Pack ahead[kPrefetch ? kPacks : 1];
  Pack ext;
  int ahead_expert = 0;  // kPrefetch, grouped: the expert of the row in `ahead`
  if constexpr (kPrefetch) {
    const int64_t row = cluster_id * R + group;
    if (grouped) ahead_expert = expert_of_row(row);
    issue_row<scalar_t, kPacks, kGrouped>(ahead, ext, x + (row < M ? row : 0) * x_row_stride,
                                grouped && ahead_expert == E ? 0 : H, rl, false);
  }
  int parity = 0;
  for (int64_t first = cluster_id * R; first < M; first += step, parity ^= 1) {
    const int64_t row = first + group;
    const bool active = row < M;  // inactive groups read row 0 and join the barriers
    const scalar_t* x_row = x + (active ? row : 0) * x_row_stride;
    int expert = 0;
    if (grouped) expert = kPrefetch ? ahead_expert : expert_of_row(row);
    const bool owned = !grouped || expert < E;
    Pack buf[kPacks];
    if constexpr (kPrefetch) {
#pragma unroll
      for (int i = 0; i < kPacks; ++i) buf[i] = ahead[i];
      const int64_t next = row + step;
      if (grouped) ahead_expert = expert_of_row(next);
      issue_row<scalar_t, kPacks, kGrouped>(ahead, ext, x + (next < M ? next : 0) * x_row_stride,
                                  grouped && ahead_expert == E ? 0 : H, rl, false);
    } else {
      issue_row<scalar_t, kPacks, kGrouped>(buf, ext, x_row, owned ? H : 0, rl, x_realign || same_phase);
    }
    // kMul: mul's packs (zero past the row), loaded with x's so that they are in flight
    // during the reduction; element-wise when mul's rows are misaligned.
    // Same phase: mul's chunks as loaded, like x's.
    Pack mb[kMul ? kPacks : 1] = {};
    Pack m_ext = make_uint4(0u, 0u, 0u, 0u);
    if constexpr (kMul) {
      const scalar_t* m_row = mul.mul + (active ? row : 0) * mul.row_stride;
      if (same_phase) {
        issue_row<scalar_t, kPacks>(mb, m_ext, m_row, H, rl, true);
      } else {
        const int packs = static_cast<int>((H + P::kVec - 1) / P::kVec);
#pragma unroll
        for (int i = 0; i < kPacks; ++i) {
          const int p = rl.base + i * rl.W;
          mb[i] = p < packs ? load_pack(m_row, p, H, mul.vec_ok) : make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
    const int shift = static_cast<int>(reinterpret_cast<uintptr_t>(x_row) & 15);
    if (!same_phase) finish_row<scalar_t, kPacks>(buf, ext, x_row, H, rl, x_realign, kRealign);

    acc_t s[3] = {acc_t(0), acc_t(0), acc_t(0)};  // past the row, the packs hold zeros
    const int packs = static_cast<int>((H + P::kVec - 1) / P::kVec);
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      if (kLayout == kAligned && warp_idle(rl, i, packs)) continue;
      const Pack in = same_phase ? mask_pack<scalar_t>(realigned_pack(buf, ext, i, shift, rl), rl.base + i * rl.W, H)
                                 : buf[i];
#pragma unroll
      for (int k = 0; k < P::kVec; ++k) {
        const acc_t v = P::value(in, k);
        const acc_t v2 = v * v;
        s[0] += v2;
        s[1] += v2 * v2;
        s[2] += v2 * v2 * v2;
      }
    }
    // The row's parameters: the kernel's, or its expert's (zeros for a row of no expert).
    acc_t rw0 = w0, rw1 = w1, rw2 = w2, rb = b;
    if (grouped) expert_params(grouping, weight, &bias, expert, rw0, rw1, rw2, rb);
    if (C > 1) {
      cluster_row_reduce<3>(s, reinterpret_cast<acc_t*>(cluster_slots), parity, rl, C);
    } else {
      row_reduce<3>(s, red[parity], rl);
    }

    // 1/sqrt rather than rsqrt: IEEE-rounded, once per row.
    acc_t r1 = acc_t(1) / sqrt(s[0] * inv_h + e);
    acc_t r2 = acc_t(1) / sqrt(s[1] * inv_h + e);
    acc_t r3 = acc_t(1) / sqrt(s[2] * inv_h + e);
    if (!owned) r1 = r2 = r3 = acc_t(0);  // grouped, a row of no expert: rstd = 0
    if (active && rl.lane == 0) {
      rstd[row * 3 + 0] = r3;
      rstd[row * 3 + 1] = r2;
      rstd[row * 3 + 2] = r1;
    }
    const acc_t a3 = rw0 * r3, a2 = rw1 * r2, a1 = rw2 * r1;
    const auto output = [&](const Pack& in, const Pack& m) {
      return P::make([&](int k) {
        const acc_t v = P::value(in, k);
        const acc_t yv = v * (a1 + v * (a2 + v * a3)) + rb;  // Horner form
        if constexpr (kMul) return yv * P::value(m, k);
        return yv;
      });
    };
    scalar_t* y_row = y + (active ? row : 0) * H;
    if (same_phase) {
      // Chunk p of y from chunk p of x (and mul); the chunk after the last segment, held in
      // ext by its last lane only, when the row reaches into it.
      Pack* dst = reinterpret_cast<Pack*>(reinterpret_cast<uintptr_t>(y_row) - shift);
      const int end = shift + static_cast<int>(H) * int(sizeof(scalar_t));
      const int chunks = (end + 15) / 16;
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        keep_raw(buf[i]);
        const int p = rl.base + i * rl.W;
        if (active && p < chunks) store_own_chunk<scalar_t>(dst, p, output(buf[i], mb[kMul ? i : 0]), shift, end);
      }
      if (active && last_segment && rl.j == rl.W - 1 && rl.seg_end < chunks) {
        store_own_chunk<scalar_t>(dst, rl.seg_end, output(ext, m_ext), shift, end);
      }
      continue;
    }
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      keep_raw(buf[i]);
      if (kLayout != kAligned || !warp_idle(rl, i, packs)) buf[i] = output(buf[i], mb[kMul ? i : 0]);  // idle: never stored
    }
    store_row<scalar_t, kPacks>(y_row, buf, H, rl, y_realign, active);
  }
}

// Backward, row kernel: x and grad_y in registers, S_1, S_2, S_3 and sum g in one
// reduction, then dx; the block's share of [dw0, dw1, dw2, db] goes to partials.
// kPrefetch (aligned PolyNorm builds, bench tuning): the next row's x, grad_y and rstd are
// loaded while this row is reduced and written, into a second set of registers.
template <typename scalar_t, int kPacks, int kLayout, int kMaxThreads, bool kMul, bool kGrouped, bool kPrefetch = false>
__global__ void __launch_bounds__(kMaxThreads, row_min_blocks(kMaxThreads, kMul, (kPrefetch ? 4 : 2) * kPacks))
    poly_norm_bwd_row_kernel(
    const scalar_t* __restrict__ grad_y,                 // [M, H], rows g_row_stride apart (0 for an expand)
    int64_t g_row_stride,
    bool g_realign_arg,
    const scalar_t* __restrict__ x,                      // [M, H], rows x_row_stride apart
    int64_t x_row_stride,
    bool x_realign_arg,
    const at::opmath_type<scalar_t>* __restrict__ rstd,  // [M, 3] opmath: rstd of x^3, x^2, x
    ParamRef weight,                                     // (3,) any float dtype: [w0, w1, w2]
    scalar_t* __restrict__ grad_x,                       // [M, H] contiguous
    bool dx_realign_arg,
    bool same_phase_arg,                                 // every tensor's rows start alike in their chunks
    ParamGrads<at::opmath_type<scalar_t>> param_grads,   // dW, dB: partials, then the last block's sum
    MulArgs<scalar_t> mul,                               // kMul: grad_y = grad_out * mul; writes grad_mul
    GroupArgs<at::opmath_type<scalar_t>> grouping,       // grouped: a per-row expert; row terms, not param_grads
    int64_t M,
    int64_t H,
    int G,
    int C) {                                             // CTAs a row (a cluster of C, R = 1), or 1
  using acc_t = at::opmath_type<scalar_t>;
  using P = PackOf<scalar_t>;
  __shared__ acc_t red[2][kRowMaxThreads / 32][4];
  __shared__ acc_t group_part[kRowMinThreads][4];  // R <= kRowMinThreads
  extern __shared__ __align__(16) unsigned char cluster_slots[];  // C > 1: [2][C G / 32][4]
  constexpr bool kRealign = kLayout != kAligned;  // as in forward
  const bool x_realign = kLayout == kRealigned && x_realign_arg;
  const bool g_realign = kLayout == kRealigned && g_realign_arg;
  const bool dx_realign = kLayout == kRealigned && dx_realign_arg;
  const bool same_phase = kLayout == kSamePhase && same_phase_arg;

  const RowLane rl = row_lane<kPacks>(G, C);
  const int R = blockDim.x / G;
  const int group = threadIdx.x / G;
  const bool last_segment = rl.lane / rl.W + 1 == rl.G / rl.W;
  const int64_t cluster_id = C > 1 ? blockIdx.x / C : blockIdx.x;  // as in forward
  const int64_t clusters = C > 1 ? gridDim.x / C : gridDim.x;
  const bool rank0 = rl.lane < G;  // the row's first CTA: its parameter-gradient terms

  const acc_t w0 = load_param<acc_t>(weight, 0), w1 = load_param<acc_t>(weight, 1);
  const acc_t w2 = load_param<acc_t>(weight, 2);
  const acc_t mb_bias = kMul ? load_param<acc_t>(mul.bias, 0) : acc_t(0);  // kMul: y's bias
  const acc_t inv_h = acc_t(1) / static_cast<acc_t>(H);
  // Grouped (GroupArgs): the row's expert, searched before its loads are issued, its weights
  // read during the reduction (as in forward). A row of no expert is not read (x, grad_y and
  // rstd): it computes on zeros with zero weights and rstd, so grad_x = 0 and its row terms 0.
  const bool grouped = kGrouped && !kMul && grouping.offsets.ptr != nullptr;
  const int E = static_cast<int>(grouping.offsets.E);  // < 2^31: the launchers check it

  acc_t part[4] = {acc_t(0), acc_t(0), acc_t(0), acc_t(0)};  // this group's rows, in order
  static_assert(!kPrefetch || (kLayout == kAligned && !kMul && !kGrouped), "prefetch: aligned PolyNorm builds only");
  const int64_t step = clusters * R;
  Pack x_ahead[kPrefetch ? kPacks : 1], g_ahead[kPrefetch ? kPacks : 1];
  acc_t r_ahead[3] = {acc_t(0), acc_t(0), acc_t(0)};
  Pack x_ext, g_ext;
  // kPrefetch: loads a row's x, grad_y and rstd into the registers `ahead` (row 0's data for
  // a row past M, which is never stored).
  const auto load_ahead = [&](int64_t row) {
    if constexpr (kPrefetch) {
      const int64_t at = row < M ? row : 0;
      issue_row<scalar_t, kPacks>(x_ahead, x_ext, x + at * x_row_stride, H, rl, false);
      issue_row<scalar_t, kPacks>(g_ahead, g_ext, grad_y + at * g_row_stride, H, rl, false);
      r_ahead[0] = rstd[at * 3 + 0];
      r_ahead[1] = rstd[at * 3 + 1];
      r_ahead[2] = rstd[at * 3 + 2];
    }
  };
  if constexpr (kPrefetch) load_ahead(cluster_id * R + group);
  int parity = 0;
  for (int64_t first = cluster_id * R; first < M; first += step, parity ^= 1) {
    const int64_t row = first + group;
    const bool active = row < M;
    const int64_t r = active ? row : 0;
    const int expert = !grouped ? 0 : active ? static_cast<int>(expert_of(grouping.offsets, row)) : E;  // E: none
    const bool owned = !grouped || expert < E;
    acc_t r3 = acc_t(0), r2 = acc_t(0), r1 = acc_t(0);
    const scalar_t* x_row = x + r * x_row_stride;
    const scalar_t* g_row = grad_y + r * g_row_stride;
    Pack xb[kPacks];
    Pack gb[kPacks];
    if constexpr (kPrefetch) {
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        xb[i] = x_ahead[i];
        gb[i] = g_ahead[i];
      }
      r3 = r_ahead[0];
      r2 = r_ahead[1];
      r1 = r_ahead[2];
      load_ahead(row + step);
    } else {
      if (active && owned) {  // issued before the row's loads complete
        r3 = rstd[row * 3 + 0];
        r2 = rstd[row * 3 + 1];
        r1 = rstd[row * 3 + 2];
      }
      issue_row<scalar_t, kPacks, kGrouped>(xb, x_ext, x_row, owned ? H : 0, rl, x_realign || same_phase);
      issue_row<scalar_t, kPacks, kGrouped>(gb, g_ext, g_row, owned ? H : 0, rl, g_realign || same_phase);
    }
    // kMul: gb holds grad_out, mb mul (zero past the row; element-wise loads when mul's
    // rows are misaligned), and g = grad_out * mul in opmath is PolyNorm's grad_y.
    Pack mb[kMul ? kPacks : 1] = {};
    Pack m_ext = make_uint4(0u, 0u, 0u, 0u);
    if constexpr (kMul) {
      const scalar_t* m_row = mul.mul + r * mul.row_stride;
      if (same_phase) {
        issue_row<scalar_t, kPacks>(mb, m_ext, m_row, H, rl, true);
      } else {
        const int packs = static_cast<int>((H + P::kVec - 1) / P::kVec);
#pragma unroll
        for (int i = 0; i < kPacks; ++i) {
          const int p = rl.base + i * rl.W;
          mb[i] = p < packs ? load_pack(m_row, p, H, mul.vec_ok) : make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
    auto grad_of = [&](const Pack& gp, const Pack& mp, int k) {
      if constexpr (kMul) return P::value(gp, k) * P::value(mp, k);
      return P::value(gp, k);
    };
    const int shift = static_cast<int>(reinterpret_cast<uintptr_t>(x_row) & 15);
    if (!same_phase) {
      finish_row<scalar_t, kPacks>(xb, x_ext, x_row, H, rl, x_realign, kRealign);
      finish_row<scalar_t, kPacks>(gb, g_ext, g_row, H, rl, g_realign, kRealign);
    }

    acc_t s[4] = {acc_t(0), acc_t(0), acc_t(0), acc_t(0)};  // past the row, the packs hold zeros
    const int packs = static_cast<int>((H + P::kVec - 1) / P::kVec);
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      if (kLayout == kAligned && warp_idle(rl, i, packs)) continue;
      const int p = rl.base + i * rl.W;
      const Pack xi = same_phase ? mask_pack<scalar_t>(realigned_pack(xb, x_ext, i, shift, rl), p, H) : xb[i];
      const Pack gi = same_phase ? mask_pack<scalar_t>(realigned_pack(gb, g_ext, i, shift, rl), p, H) : gb[i];
      Pack mi = mb[kMul ? i : 0];
      if constexpr (kMul) {
        if (same_phase) mi = mask_pack<scalar_t>(realigned_pack(mb, m_ext, i, shift, rl), p, H);
      }
#pragma unroll
      for (int k = 0; k < P::kVec; ++k) {
        const acc_t v = P::value(xi, k);
        const acc_t g = grad_of(gi, mi, k);
        const acc_t gx = g * v;
        s[0] += gx;
        s[1] += gx * v;
        s[2] += gx * v * v;
        s[3] += g;
      }
    }
    // The row's weights: the kernel's, or its expert's (zeros for a row of no expert).
    acc_t rw0 = w0, rw1 = w1, rw2 = w2, no_bias;
    if (grouped) expert_params(grouping, weight, nullptr, expert, rw0, rw1, rw2, no_bias);
    if (C > 1) {
      cluster_row_reduce<4>(s, reinterpret_cast<acc_t*>(cluster_slots), parity, rl, C);
    } else {
      row_reduce<4>(s, red[parity], rl);
    }

    if (grouped) {
      // The row's share of its expert's [dw0, dw1, dw2, db]: the terms `part` adds below.
      if (active && rl.lane == 0) {
        grouping.row_terms[row * 4 + 0] = r3 * s[2];
        grouping.row_terms[row * 4 + 1] = r2 * s[1];
        grouping.row_terms[row * 4 + 2] = r1 * s[0];
        grouping.row_terms[row * 4 + 3] = s[3];
      }
    } else if (active && rank0) {  // a cluster's other CTAs add nothing: their partials stay 0
      part[0] += r3 * s[2];
      part[1] += r2 * s[1];
      part[2] += r1 * s[0];
      part[3] += s[3];
    }
    // d_p = c_p r_p^2 S_p / H, as c_p ((r_p S_p / H) r_p): r_p^3 alone leaves fp32's
    // range for |x| ~ 3e4 or tiny rows with eps = 0.
    const acc_t c1 = rw2 * r1, c2 = acc_t(2) * rw1 * r2, c3 = acc_t(3) * rw0 * r3;
    const acc_t d1 = c1 * ((r1 * s[0] * inv_h) * r1);
    const acc_t d2 = c2 * ((r2 * s[1] * inv_h) * r2);
    const acc_t d3 = c3 * ((r3 * s[2] * inv_h) * r3);
    // kMul: y's Horner coefficients, as forward computes them; grad_mul = grad_out * y
    // goes to gb (grad_out's registers), x's become dx.
    const acc_t a3 = rw0 * r3, a2 = rw1 * r2, a1 = rw2 * r1;
    const auto dx_of = [&](const Pack& xp, const Pack& gp, const Pack& mp) {
      return P::make([&](int k) {
        const acc_t v = P::value(xp, k);
        const acc_t g = grad_of(gp, mp, k);
        const acc_t v2 = v * v;
        return g * (c1 + v * (c2 + v * c3)) - v * (d1 + v2 * (d2 + v2 * d3));
      });
    };
    const auto grad_mul_of = [&](const Pack& xp, const Pack& gp) {
      return P::make([&](int k) {
        const acc_t v = P::value(xp, k);
        return P::value(gp, k) * (v * (a1 + v * (a2 + v * a3)) + mb_bias);
      });
    };
    if (same_phase) {  // chunk p of every output from chunk p of every input, as in forward
      const int end = shift + static_cast<int>(H) * int(sizeof(scalar_t));
      const int chunks = (end + 15) / 16;
      Pack* dx_dst = reinterpret_cast<Pack*>(reinterpret_cast<uintptr_t>(grad_x + r * H) - shift);
      Pack* gm_dst = kMul ? reinterpret_cast<Pack*>(reinterpret_cast<uintptr_t>(mul.grad_mul + r * H) - shift) : nullptr;
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        keep_raw(xb[i]);
        keep_raw(gb[i]);
        const int p = rl.base + i * rl.W;
        if (active && p < chunks) {
          store_own_chunk<scalar_t>(dx_dst, p, dx_of(xb[i], gb[i], mb[kMul ? i : 0]), shift, end);
          if constexpr (kMul) store_own_chunk<scalar_t>(gm_dst, p, grad_mul_of(xb[i], gb[i]), shift, end);
        }
      }
      if (active && last_segment && rl.j == rl.W - 1 && rl.seg_end < chunks) {
        store_own_chunk<scalar_t>(dx_dst, rl.seg_end, dx_of(x_ext, g_ext, m_ext), shift, end);
        if constexpr (kMul) store_own_chunk<scalar_t>(gm_dst, rl.seg_end, grad_mul_of(x_ext, g_ext), shift, end);
      }
      continue;
    }
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      keep_raw(xb[i]);
      keep_raw(gb[i]);
      if (kLayout == kAligned && warp_idle(rl, i, packs)) continue;  // never stored
      const Pack xp = xb[i], gp = gb[i], mp = mb[kMul ? i : 0];
      xb[i] = dx_of(xp, gp, mp);
      if constexpr (kMul) gb[i] = grad_mul_of(xp, gp);
    }
    store_row<scalar_t, kPacks>(grad_x + r * H, xb, H, rl, dx_realign, active);
    if constexpr (kMul) store_row<scalar_t, kPacks>(mul.grad_mul + r * H, gb, H, rl, kLayout == kRealigned && !mul.grad_vec_ok, active);
  }

  if (grouped) return;  // the row terms are summed per expert by grouped_param_sums
  // The block's partial: its groups in order (each group's rows already in order).
  if (threadIdx.x % G == 0) {
#pragma unroll
    for (int k = 0; k < 4; ++k) group_part[group][k] = part[k];
  }
  __syncthreads();
  if (threadIdx.x < 4) {
    acc_t total = group_part[0][threadIdx.x];
    for (int g = 1; g < R; ++g) total += group_part[g][threadIdx.x];
    param_grads.partials[int64_t(blockIdx.x) * 4 + threadIdx.x] = total;
  }
  finish_param_grads(param_grads, threadIdx.x, int(blockDim.x));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

ParamRef param_ref(const at::Tensor& t) {
  // numel is 1 or 3; a flat view's stride steps between elements (the tensor may be a view).
  const at::Tensor flat = t.reshape({t.numel()});
  return {t.const_data_ptr(), flat.stride(0), t.scalar_type()};
}

// Whether the current device launches thread-block clusters (sm_90 and later), cached.
bool device_launches_clusters() {
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<int, bool> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  int value = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrClusterLaunch, device));
  cache.emplace(device, value != 0);
  return value != 0;
}

// launch_plan.h's choice for this launch: on this device (clusters or not), under the family
// a benchmark or test forces (_force_kernel).
LaunchPlan plan_for(bool backward, bool mul, int64_t H, int elem_size, bool out_misaligned) {
  const KernelKind forced = forced_kernel();
  const bool clusters = device_launches_clusters();
  return plan_launch(backward, mul, H, elem_size, out_misaligned, forced, clusters);
}

// Row kernels (G and the block size: row_plan in launch_plan.h). The persistent grid is
// as many blocks as fit at once (their register use caps it, ~64 a thread under the
// 1024-thread bound), each walking rows gridDim apart. Only H and the dtype choose G, the
// tree of the reduction; M only sets the grid, which no row's bits depend on.
// Six builds of each row kernel: by layout (RowLayout: aligned rows, realigned rows,
// same-phase rows), and for blocks of up to 256 threads (free to use 64-80 registers a
// thread) or up to 1024 (capped at 64, where a few values spill to local memory).
template <template <int, int> class Build>
auto row_kernel(const RowPlan& plan, int layout) {
  const bool small = plan.threads <= 256;
  if (layout == kAligned) return small ? Build<kAligned, 256>::get() : Build<kAligned, kRowMaxThreads>::get();
  if (layout == kRealigned) return small ? Build<kRealigned, 256>::get() : Build<kRealigned, kRowMaxThreads>::get();
  return small ? Build<kSamePhase, 256>::get() : Build<kSamePhase, kRowMaxThreads>::get();
}

// The SM count and a kernel's resident blocks per SM, cached per device: querying them
// takes microseconds, as long as a small kernel runs.
template <typename Kernel>
int64_t resident_blocks(Kernel kernel, int threads, size_t smem) {
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  using Key = std::tuple<int, const void*, int, size_t>;
  static std::mutex mutex;
  static std::map<Key, int64_t> cache;
  const Key key{device, reinterpret_cast<const void*>(kernel), threads, smem};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int sms = 0, per_sm = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  const int64_t blocks = int64_t(sms) * std::max(per_sm, 1);
  cache.emplace(key, blocks);
  return blocks;
}

// Whether rows of a and b (row strides in elements) start at the same offset into their
// 16-byte chunks, row for row: the row kernels' same-phase path (realigned_pack).
template <typename scalar_t>
bool same_phase_rows(const scalar_t* a, int64_t a_stride, const scalar_t* b, int64_t b_stride) {
  const int64_t size = sizeof(scalar_t);
  return reinterpret_cast<uintptr_t>(a) % 16 == reinterpret_cast<uintptr_t>(b) % 16 &&
         (a_stride * size) % 16 == (b_stride * size) % 16;
}

// Dynamic shared memory of a row launch: cluster_row_reduce's slots, [2][C G / 32][sums].
size_t cluster_slot_bytes(const RowPlan& plan, int sums, size_t acc_size) {
  return plan.cluster > 1 ? 2 * size_t(plan.cluster) * (plan.G / 32) * sums * acc_size : 0;
}

// The launch configuration of a row kernel's grid: clusters of plan.cluster CTAs when > 1.
struct RowLaunch {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute cluster{};
};

RowLaunch row_launch(const RowPlan& plan, int64_t grid, size_t smem, cudaStream_t stream) {
  RowLaunch launch;
  launch.config.gridDim = dim3(static_cast<unsigned>(grid));
  launch.config.blockDim = dim3(static_cast<unsigned>(plan.threads));
  launch.config.dynamicSmemBytes = smem;
  launch.config.stream = stream;
  launch.cluster.id = cudaLaunchAttributeClusterDimension;
  launch.cluster.val.clusterDim.x = static_cast<unsigned>(plan.cluster);
  launch.cluster.val.clusterDim.y = 1;
  launch.cluster.val.clusterDim.z = 1;
  launch.config.attrs = &launch.cluster;
  launch.config.numAttrs = 1;
  return launch;
}

// Clusters of a row kernel resident on the device at once (cached per device, kernel and
// geometry); clusters of more than 8 CTAs (not portable) are allowed for the kernel first.
// Zero when the device cannot place one such cluster: plan_row_launch's error.
template <typename Kernel>
int64_t resident_clusters(Kernel kernel, const RowPlan& plan, size_t smem) {
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  using Key = std::tuple<int, const void*, int, int, size_t>;
  static std::mutex mutex;
  static std::map<Key, int64_t> cache;
  const Key key{device, reinterpret_cast<const void*>(kernel), plan.threads, plan.cluster, smem};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (plan.cluster > 8) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  const RowLaunch launch = row_launch(plan, plan.cluster, smem, nullptr);
  int clusters = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config));
  cache.emplace(key, clusters);
  return clusters;
}

// `waves`: at most this many blocks (clusters) per resident slot (1: a persistent grid); 0:
// a block per R rows (a cluster per row), scheduled by the hardware. Blocks, a multiple of
// plan.cluster.
template <typename Kernel>
int64_t row_grid(Kernel kernel, const RowPlan& plan, int64_t M, size_t smem, int waves = 1) {
  const int64_t row_blocks = (M + plan.threads / plan.G - 1) / (plan.threads / plan.G);
  if (plan.cluster > 1) {
    const int64_t resident = resident_clusters(kernel, plan, smem);
    TORCH_CHECK(resident > 0, "polynorm: this device cannot run a cluster of ", plan.cluster, " blocks of ",
                plan.threads, " threads (rows of ", plan.cluster * plan.G, " threads); _tune_rows sets smaller clusters");
    const int64_t clusters = waves == 0 ? row_blocks : std::min<int64_t>(row_blocks, waves * resident);
    return std::max<int64_t>(1, clusters) * plan.cluster;
  }
  if (waves == 0) return std::max<int64_t>(1, row_blocks);
  return std::max<int64_t>(1, std::min<int64_t>(row_blocks, waves * resident_blocks(kernel, plan.threads, 0)));
}

// Launches a row kernel: plainly, or as clusters (cudaLaunchKernelEx) with its slots.
template <typename... Params, typename... Args>
void launch_row_kernel(void (*kernel)(Params...), const RowPlan& plan, int64_t grid, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  if (plan.cluster == 1) {
    kernel<<<static_cast<unsigned>(grid), plan.threads, 0, stream>>>(std::forward<Args>(args)...);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const RowLaunch launch = row_launch(plan, grid, smem, stream);
  C10_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, std::forward<Args>(args)...));
}

// The row kernel's forward launch for kPacks packs a thread. The grid: persistent for
// aligned rows of 128-256 threads, a block per R rows otherwise (below); `_tune_rows`
// overrides it.
template <typename scalar_t, int kPacks, bool kMul>
struct FwdRowBuild {
  template <int kLayout, int kMaxThreads>
  struct Of {
    static auto get() { return &poly_norm_fwd_row_kernel<scalar_t, kPacks, kLayout, kMaxThreads, kMul, false>; }
  };
  template <int kLayout, int kMaxThreads>
  struct Grouped {
    static auto get() { return &poly_norm_fwd_row_kernel<scalar_t, kPacks, kLayout, kMaxThreads, false, true>; }
  };
};

template <typename scalar_t, int kPacks, bool kMul>
void launch_forward_row(const LaunchPlan& lp, bool x_vec_ok, bool y_vec_ok, const scalar_t* x_ptr, int64_t x_stride,
                        scalar_t* y_ptr, at::opmath_type<scalar_t>* rstd, ParamRef weight, ParamRef bias,
                        const MulArgs<scalar_t>& mul, const GroupArgs<at::opmath_type<scalar_t>>& grouping, int64_t M,
                        int64_t H, double eps, cudaStream_t stream) {
  const RowPlan& row = lp.row;
  const RowTuning tuning = row_tuning();
  const bool realign = !x_vec_ok || !y_vec_ok;
  bool same_phase = realign && tuning.same_phase && same_phase_rows(x_ptr, x_stride, y_ptr, H);
  if constexpr (kMul) same_phase = same_phase && same_phase_rows(x_ptr, x_stride, mul.mul, mul.row_stride);
  const int layout = !realign ? kAligned : same_phase ? kSamePhase : kRealigned;
  const bool grouped = !kMul && grouping.offsets.ptr != nullptr;  // the grouped builds (kGrouped)
  auto kernel = row_kernel<FwdRowBuild<scalar_t, kPacks, kMul>::template Of>(row, layout);
  if constexpr (!kMul) {
    if (grouped) kernel = row_kernel<FwdRowBuild<scalar_t, kPacks, kMul>::template Grouped>(row, layout);
  }
  bool prefetch = false;
  if constexpr (!kMul && sizeof(scalar_t) == 2 && kPacks <= 4) {
    // 2-byte rows of 4 packs a thread: the next row's loads in flight while this one is
    // reduced (measured 1-7% faster, bench/NOTES.md v5).
    prefetch = layout == kAligned && tuning.prefetch && !grouped;
    if (prefetch) {
      kernel = row.threads <= 256 ? poly_norm_fwd_row_kernel<scalar_t, kPacks, kAligned, 256, false, false, true>
                                  : poly_norm_fwd_row_kernel<scalar_t, kPacks, kAligned, kRowMaxThreads, false, false, true>;
    }
  }
  // Persistent for aligned rows of 128-256 threads and for rows of clusters, a block per R
  // rows otherwise (tune_rows: 2-5% faster for short rows, 6-9% for realigned and long rows
  // of one CTA, bench/NOTES.md v5; clusters: mul_forward at H = 32768-131072 10-15% faster
  // persistent, v6 call 3).
  const bool persistent = (layout == kAligned && row.G >= 128 && row.G < 512) || row.cluster > 1;
  const int waves = tuning.grid_waves >= 0 ? tuning.grid_waves : (persistent ? 1 : 0);
  const size_t smem = cluster_slot_bytes(row, 3, sizeof(at::opmath_type<scalar_t>));
  const int64_t grid = row_grid(kernel, row, M, smem, waves);
  launch_row_kernel(kernel, row, grid, smem, stream, x_ptr, x_stride, !x_vec_ok, y_ptr, !y_vec_ok, same_phase, rstd,
                    weight, bias, mul, grouping, M, H, eps, row.G, row.cluster);
}

// The row kernel's backward launch for kPacks packs a thread; allocates the partials (not
// for a grouped launch, whose rows write their terms to grouping.row_terms instead).
template <typename scalar_t, int kPacks, bool kMul>
struct BwdRowBuild {
  template <int kLayout, int kMaxThreads>
  struct Of {
    static auto get() { return &poly_norm_bwd_row_kernel<scalar_t, kPacks, kLayout, kMaxThreads, kMul, false>; }
  };
  template <int kLayout, int kMaxThreads>
  struct Grouped {
    static auto get() { return &poly_norm_bwd_row_kernel<scalar_t, kPacks, kLayout, kMaxThreads, false, true>; }
  };
};

template <typename scalar_t, int kPacks, bool kMul>
void launch_backward_row(const LaunchPlan& lp, bool g_vec_ok, bool x_vec_ok, bool dx_vec_ok, const scalar_t* g_ptr,
                         int64_t g_stride, const scalar_t* x_ptr, int64_t x_stride,
                         const at::opmath_type<scalar_t>* rstd, ParamRef weight, scalar_t* dx_ptr,
                         ParamGrads<at::opmath_type<scalar_t>> pg, at::Tensor& partials, const at::Tensor& acc_like,
                         const MulArgs<scalar_t>& mul, const GroupArgs<at::opmath_type<scalar_t>>& grouping,
                         int64_t M, int64_t H, cudaStream_t stream) {
  const RowPlan& row = lp.row;
  const bool realign = !x_vec_ok || !g_vec_ok || !dx_vec_ok || (kMul && !mul.grad_vec_ok);
  bool same_phase = realign && row_tuning().same_phase && same_phase_rows(x_ptr, x_stride, g_ptr, g_stride) &&
                    same_phase_rows(x_ptr, x_stride, dx_ptr, H);
  if constexpr (kMul) {
    same_phase = same_phase && same_phase_rows(x_ptr, x_stride, mul.mul, mul.row_stride) &&
                 same_phase_rows(x_ptr, x_stride, mul.grad_mul, H);
  }
  const int layout = !realign ? kAligned : same_phase ? kSamePhase : kRealigned;
  const bool grouped = !kMul && grouping.offsets.ptr != nullptr;  // the grouped builds (kGrouped)
  auto kernel = poly_norm_bwd_row_kernel<scalar_t, kPacks, kAligned, 256, kMul, false>;
  if constexpr (!kMul && sizeof(scalar_t) == 2 && kPacks == 2) {
    // Bench tuning only (_tune_rows(bwd_packs=2)): 2 packs of x and grad_y a thread, aligned
    // PolyNorm rows, with or without the next row's loads in flight (prefetch).
    TORCH_CHECK(layout == kAligned && !grouped,
                "polynorm._tune_rows: bwd_packs=2 is built for aligned PolyNorm rows only");
    const bool small = row.threads <= 256, prefetch = row_tuning().prefetch;
    kernel = prefetch ? (small ? poly_norm_bwd_row_kernel<scalar_t, 2, kAligned, 256, false, false, true>
                               : poly_norm_bwd_row_kernel<scalar_t, 2, kAligned, kRowMaxThreads, false, false, true>)
                      : (small ? poly_norm_bwd_row_kernel<scalar_t, 2, kAligned, 256, false, false>
                               : poly_norm_bwd_row_kernel<scalar_t, 2, kAligned, kRowMaxThreads, false, false>);
  } else {
    kernel = row_kernel<BwdRowBuild<scalar_t, kPacks, kMul>::template Of>(row, layout);
    if constexpr (!kMul) {
      if (grouped) kernel = row_kernel<BwdRowBuild<scalar_t, kPacks, kMul>::template Grouped>(row, layout);
    }
  }
  const size_t smem = cluster_slot_bytes(row, 4, sizeof(at::opmath_type<scalar_t>));
  const int waves = row_tuning().grid_waves;  // bench tuning; the table: persistent
  const int64_t blocks = row_grid(kernel, row, M, smem, waves >= 0 ? waves : 1);
  if (grouping.offsets.ptr == nullptr) {
    partials = at::empty({blocks, 4}, acc_like.options());
    pg.partials = partials.mutable_data_ptr<at::opmath_type<scalar_t>>();
  }
  launch_row_kernel(kernel, row, blocks, smem, stream, g_ptr, g_stride, !g_vec_ok, x_ptr, x_stride, !x_vec_ok, rstd,
                    weight, dx_ptr, !dx_vec_ok, same_phase, pg, mul, grouping, M, H, row.G, row.cluster);
}

// Arrival counters for the backward's last-block reduction (finish_param_grads), in static
// device memory: zero when the module loads, never allocated (so a first use inside
// CUDA-graph capture is fine), and back at zero after every launch. Two launches must never
// run on one counter at the same time:
// - An eager launch takes its stream's counter. Launches on one stream run one after
//   another. Streams get counters in order of first use; past kStreamSlots streams on a
//   device they share, which matters only if two of those streams run a backward at once.
// - A launch captured into a CUDA graph takes a counter of its own, never used by another
//   launch (a graph may be replayed on any stream, concurrently with eager work, while one
//   graph's replays run one after another). Past kCaptureSlots captures on a device, the
//   capture counters are reused, oldest first.
constexpr int kStreamSlots = 4096;
constexpr int kCaptureSlots = 61440;
__device__ unsigned int g_arrivals[kStreamSlots + kCaptureSlots];  // 256 KB a device

unsigned int* arrival_counter(cudaStream_t stream) {
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  struct DeviceSlots {
    unsigned int* base = nullptr;
    std::map<cudaStream_t, unsigned int*> streams;
    int64_t captures = 0;
  };
  static std::mutex mutex;
  static std::map<int, DeviceSlots> devices;
  const std::lock_guard<std::mutex> lock(mutex);
  DeviceSlots& slots = devices[device];
  if (slots.base == nullptr) {
    void* ptr = nullptr;
    C10_CUDA_CHECK(cudaGetSymbolAddress(&ptr, g_arrivals));
    slots.base = static_cast<unsigned int*>(ptr);
  }
  if (capture != cudaStreamCaptureStatusNone) {
    return slots.base + kStreamSlots + (slots.captures++ % kCaptureSlots);
  }
  const auto it = slots.streams.find(stream);
  if (it != slots.streams.end()) return it->second;
  unsigned int* slot = slots.base + static_cast<int64_t>(slots.streams.size()) % kStreamSlots;
  slots.streams.emplace(stream, slot);
  return slot;
}

// The extra tensors of a grouped launch (grouped_forward, grouped_backward; GroupArgs): the
// launch's weight and bias are then [E, 3] and [E] or [E, 1].
struct GroupTensors {
  const at::Tensor& offsets;  // [E] int32 or int64 on x's device: cumulative end offsets
  at::Tensor* row_terms;      // backward: [M, 4] opmath, filled with each row's terms
};

// A launch's GroupArgs: not grouped (offsets.ptr == nullptr) without `groups`.
template <typename acc_t>
GroupArgs<acc_t> group_args(const GroupTensors* groups, const at::Tensor& weight, const at::Tensor* bias) {
  GroupArgs<acc_t> args{};
  if (groups == nullptr) return args;
  args.offsets = expert_offsets(groups->offsets);
  args.w_expert_stride = weight.stride(0);
  args.b_expert_stride = bias != nullptr ? bias->stride(0) : 0;
  args.row_terms = groups->row_terms != nullptr ? groups->row_terms->mutable_data_ptr<acc_t>() : nullptr;
  return args;
}

// The kernel's weight and bias: (3,) and (1,), or, grouped, [E, 3] and [E] / [E, 1], whose
// ParamRef steps between w0, w1, w2 (GroupArgs steps between experts).
ParamRef weight_ref(const at::Tensor& weight, const GroupTensors* groups) {
  return groups != nullptr ? ParamRef{weight.const_data_ptr(), weight.stride(1), weight.scalar_type()}
                           : param_ref(weight);
}
ParamRef bias_ref(const at::Tensor& bias, const GroupTensors* groups) {
  return groups != nullptr ? ParamRef{bias.const_data_ptr(), 0, bias.scalar_type()} : param_ref(bias);
}

// One launch of the forward (kMul = false: polynorm::forward, or grouped_forward with
// `groups`; true: mul_forward, with `mul` read like x). Fills out [M, H] and rstd [M, 3];
// argument checks are the caller's.
template <bool kMul>
void launch_forward(const Rows& rows, const Rows* mul_rows, const at::Tensor& weight, const at::Tensor& bias,
                    double eps, at::Tensor& out, at::Tensor& rstd, const GroupTensors* groups = nullptr) {
  if (rows.M == 0) return;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "polynorm.forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    constexpr int kVec = PackOf<scalar_t>::kVec;
    constexpr int kPacks = kMul ? kRowMulFwdPacks : kRowFwdPacks;  // = lp.packs
    const scalar_t* x_ptr = rows.tensor.const_data_ptr<scalar_t>();
    scalar_t* y_ptr = out.mutable_data_ptr<scalar_t>();
    const bool y_vec_ok = aligned16(y_ptr) && rows.H % kVec == 0;
    const bool x_vec_ok = aligned16(x_ptr) && rows.row_stride % kVec == 0;
    MulArgs<scalar_t> mul{};
    if constexpr (kMul) {
      mul.mul = mul_rows->tensor.const_data_ptr<scalar_t>();
      mul.row_stride = mul_rows->row_stride;
      mul.vec_ok = aligned16(mul.mul) && mul.row_stride % kVec == 0;
    }
    const GroupArgs<acc_t> grouping = group_args<acc_t>(groups, weight, &bias);
    const ParamRef w_ref = weight_ref(weight, groups), b_ref = bias_ref(bias, groups);
    const LaunchPlan lp = plan_for(false, kMul, rows.H, sizeof(scalar_t), !y_vec_ok);
    if (lp.kind == KernelKind::kRow) {
      // PolyNorm's 2-byte builds come with 4 or 8 packs a thread (bench tuning, _tune_rows).
      auto launch = [&](auto packs) {
        launch_forward_row<scalar_t, decltype(packs)::value, kMul>(
            lp, x_vec_ok, y_vec_ok, x_ptr, rows.row_stride, y_ptr, rstd.mutable_data_ptr<acc_t>(), w_ref, b_ref, mul,
            grouping, rows.M, rows.H, eps, stream);
      };
      if constexpr (!kMul && sizeof(scalar_t) == 2) {
        if (lp.packs == 4) return launch(std::integral_constant<int, 4>{});
      }
      TORCH_INTERNAL_ASSERT(lp.packs == kPacks);
      return launch(std::integral_constant<int, kPacks>{});
    }
    const dim3 block(lp.tiled.G, lp.tiled.rows);
    const int64_t grid = (rows.M + block.y - 1) / block.y;
    poly_norm_fwd_tiled_kernel<scalar_t, kMul><<<static_cast<unsigned>(grid), block, 0, stream>>>(
        x_ptr, rows.row_stride, x_vec_ok, y_ptr, y_vec_ok, rstd.mutable_data_ptr<acc_t>(), w_ref, b_ref, mul,
        grouping, rows.M, rows.H, eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// One launch of the backward (kMul = false: polynorm::backward, g_rows = grad_y; true:
// mul_backward, g_rows = grad_out, and grad_mul is written). Fills grad_x, grad_weight and
// grad_bias (opmath sums); argument checks are the caller's. Grouped (grouped_backward, with
// `groups`): fills grad_x and groups->row_terms, and writes grad_weight and grad_bias only when
// M = 0 (zeros); grouped_param_sums then sums the row terms per expert.
template <bool kMul>
void launch_backward(const Rows& g_rows, const Rows& x_rows, const Rows* mul_rows, const at::Tensor& weight,
                     const at::Tensor* bias, const at::Tensor& rstd, at::Tensor& grad_x, at::Tensor* grad_mul,
                     at::Tensor& grad_weight, at::Tensor& grad_bias, const GroupTensors* groups = nullptr) {
  if (x_rows.M == 0) {
    grad_weight.zero_();
    grad_bias.zero_();
    return;
  }
  const at::Tensor rstd_c = rstd.contiguous();  // [M, 3]: at most a tiny copy
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad_x.scalar_type(), "polynorm.backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    constexpr int kVec = PackOf<scalar_t>::kVec;
    constexpr int kPacks = kMul ? kRowMulBwdPacks : kRowBwdPacks;  // = lp.packs
    const scalar_t* g_ptr = g_rows.tensor.const_data_ptr<scalar_t>();
    const scalar_t* x_ptr = x_rows.tensor.const_data_ptr<scalar_t>();
    scalar_t* dx_ptr = grad_x.mutable_data_ptr<scalar_t>();
    const bool dx_vec_ok = aligned16(dx_ptr) && x_rows.H % kVec == 0;
    const bool g_vec_ok = aligned16(g_ptr) && g_rows.row_stride % kVec == 0;
    const bool x_vec_ok = aligned16(x_ptr) && x_rows.row_stride % kVec == 0;
    MulArgs<scalar_t> mul{};
    if constexpr (kMul) {
      mul.mul = mul_rows->tensor.const_data_ptr<scalar_t>();
      mul.row_stride = mul_rows->row_stride;
      mul.vec_ok = aligned16(mul.mul) && mul.row_stride % kVec == 0;
      mul.grad_mul = grad_mul->mutable_data_ptr<scalar_t>();
      mul.grad_vec_ok = aligned16(mul.grad_mul) && x_rows.H % kVec == 0;
      mul.bias = param_ref(*bias);
    }
    const GroupArgs<acc_t> grouping = group_args<acc_t>(groups, weight, nullptr);
    const ParamRef w_ref = weight_ref(weight, groups);
    const LaunchPlan lp = plan_for(true, kMul, x_rows.H, sizeof(scalar_t), !dx_vec_ok);
    const at::Tensor& acc_like = grad_weight;  // opmath, on x's device
    at::Tensor partials;  // O(M) at most: one [4] entry per block
    int64_t blocks = 0;
    // Grouped: no partials, no last block's sum, nothing written to grad_weight or grad_bias.
    unsigned int* arrivals = groups == nullptr ? arrival_counter(stream) : nullptr;
    acc_t* dw_ptr = groups == nullptr ? grad_weight.mutable_data_ptr<acc_t>() : nullptr;
    acc_t* db_ptr = groups == nullptr ? grad_bias.mutable_data_ptr<acc_t>() : nullptr;
    const auto param_grads = [&] {  // allocates the `blocks` partials (a grouped launch has none)
      if (groups == nullptr) partials = at::empty({blocks, 4}, acc_like.options());
      return ParamGrads<acc_t>{groups == nullptr ? partials.mutable_data_ptr<acc_t>() : nullptr, arrivals, dw_ptr,
                               db_ptr};
    };
    if (lp.kind == KernelKind::kRow) {
      auto launch = [&](auto packs) {
        launch_backward_row<scalar_t, decltype(packs)::value, kMul>(
            lp, g_vec_ok, x_vec_ok, dx_vec_ok, g_ptr, g_rows.row_stride, x_ptr, x_rows.row_stride,
            rstd_c.const_data_ptr<acc_t>(), w_ref, dx_ptr, ParamGrads<acc_t>{nullptr, arrivals, dw_ptr, db_ptr},
            partials, acc_like, mul, grouping, x_rows.M, x_rows.H, stream);
      };
      if constexpr (!kMul && sizeof(scalar_t) == 2) {
        if (lp.packs == 2) return launch(std::integral_constant<int, 2>{});  // bench tuning
      }
      TORCH_INTERNAL_ASSERT(lp.packs == kPacks);
      launch(std::integral_constant<int, kPacks>{});
    } else {
      const dim3 block(lp.tiled.G, lp.tiled.rows);
      blocks = (x_rows.M + block.y - 1) / block.y;
      poly_norm_bwd_tiled_kernel<scalar_t, kMul><<<static_cast<unsigned>(blocks), block, 0, stream>>>(
          g_ptr, g_rows.row_stride, g_vec_ok, x_ptr, x_rows.row_stride, x_vec_ok, rstd_c.const_data_ptr<acc_t>(),
          w_ref, dx_ptr, dx_vec_ok, param_grads(), mul, grouping, x_rows.M, x_rows.H);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}

}  // namespace
}  // namespace polynorm
