// CUDA kernels of the sharded passes (tensor parallelism, docs/MATH.md (12)-(15)): x holds a
// shard of each row's columns (H_shard of them, possibly 0). A statistics pass writes each row's
// sums over the shard; the caller sums them over the shards; an apply pass finishes the shard's
// columns from the summed sums. Launchers: sharded.cu.
//
// A row is served by a group of G threads: one warp (G = 32, 8 rows a block) or a whole block
// (G = 64..1024, one row). Each thread walks the row in packs of kVec elements (a 16-byte load
// when kVec > 1: every row of every tensor 16-byte aligned and H_shard a multiple of kVec; one
// element at a time otherwise), accumulating in acc_t (fp32; fp64 for fp64). Each row's base
// pointer is formed from the row index with 64-bit offsets. The math is polynorm_math.h's.
#pragma once

#include "packs.cuh"
#include "polynorm_math.h"

#include <cstdint>

namespace polynorm {
namespace {

template <typename scalar_t, int kVec>
struct alignas(sizeof(scalar_t) * kVec) ShardPack {
  scalar_t v[kVec];
};

// Pack i (elements i kVec .. i kVec + kVec - 1) of a row, in acc_t.
template <int kVec, typename scalar_t, typename acc_t>
__device__ __forceinline__ void load_shard_pack(const scalar_t* row, int64_t i, acc_t (&out)[kVec]) {
  const ShardPack<scalar_t, kVec> p = reinterpret_cast<const ShardPack<scalar_t, kVec>*>(row)[i];
#pragma unroll
  for (int e = 0; e < kVec; ++e) out[e] = static_cast<acc_t>(p.v[e]);
}

template <int kVec, typename scalar_t, typename acc_t>
__device__ __forceinline__ void store_shard_pack(scalar_t* row, int64_t i, const acc_t (&in)[kVec]) {
  ShardPack<scalar_t, kVec> p;
#pragma unroll
  for (int e = 0; e < kVec; ++e) p.v[e] = static_cast<scalar_t>(in[e]);
  reinterpret_cast<ShardPack<scalar_t, kVec>*>(row)[i] = p;
}

// The group's row and the thread's lane in it.
struct ShardLane {
  int64_t row;
  int lane;
};

__device__ __forceinline__ ShardLane shard_lane(int G) {
  const int rows_per_block = blockDim.x / G;
  return {int64_t(blockIdx.x) * rows_per_block + threadIdx.x / G, int(threadIdx.x % G)};
}

// Sums N values over the G threads of a row; every thread gets the total. Inside a warp: xor
// shuffles; across the warps of a block-wide row (G > 32, one row a block): each warp's total to
// `red` ([G / 32][N] shared), one barrier, then the warp totals in warp order. The tree depends
// only on G, so on H_shard and the dtype.
template <int N, typename acc_t>
__device__ __forceinline__ void shard_reduce(acc_t (&v)[N], acc_t (*red)[N], int G) {
#pragma unroll
  for (int k = 0; k < N; ++k) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
  }
  if (G > 32) {
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) red[warp][k] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < N; ++k) {
      acc_t total = red[0][k];
      for (int w = 1; w < G / 32; ++w) total += red[w][k];
      v[k] = total;
    }
  }
}

// MATH.md (12): this shard's [sum x^2, sum x^4, sum x^6] of each row.
template <typename scalar_t, typename acc_t, int kVec>
__global__ void poly_norm_sharded_fwd_stats_kernel(const scalar_t* __restrict__ x,  // [M, H_shard], rows x_stride apart
                                                   int64_t x_stride,
                                                   acc_t* __restrict__ sums,  // [M, 3]
                                                   int64_t M, int64_t H, int G) {
  __shared__ acc_t red[32][3];
  const ShardLane sl = shard_lane(G);
  acc_t s[3] = {acc_t(0), acc_t(0), acc_t(0)};
  if (sl.row < M) {
    const scalar_t* x_row = x + sl.row * x_stride;
    for (int64_t i = sl.lane; i < H / kVec; i += G) {
      acc_t v[kVec];
      load_shard_pack<kVec>(x_row, i, v);
#pragma unroll
      for (int e = 0; e < kVec; ++e) add_row_sums(s, v[e]);
    }
  }
  shard_reduce<3>(s, red, G);
  if (sl.row < M && sl.lane == 0) {
#pragma unroll
    for (int k = 0; k < 3; ++k) sums[sl.row * 3 + k] = s[k];
  }
}

// MATH.md (1)-(3) from the summed sums and the unsharded H; (8) with kMul. rstd as the
// unsharded op's cache, [r_3, r_2, r_1].
template <typename scalar_t, typename acc_t, int kVec, bool kMul>
__global__ void poly_norm_sharded_fwd_apply_kernel(const scalar_t* __restrict__ x,  // [M, H_shard]
                                                   int64_t x_stride,
                                                   const scalar_t* __restrict__ mul,  // [M, H_shard] with kMul
                                                   int64_t mul_stride,
                                                   const acc_t* __restrict__ sums,  // [M, 3] over every shard
                                                   ParamRef weight,  // (3,) any float dtype: [w0, w1, w2]
                                                   ParamRef bias,  // (1,) any float dtype
                                                   scalar_t* __restrict__ out,  // [M, H_shard] contiguous
                                                   acc_t* __restrict__ rstd,  // [M, 3]
                                                   int64_t M, int64_t H, acc_t inv_h, acc_t eps, int G) {
  const ShardLane sl = shard_lane(G);
  if (sl.row >= M) return;
  const acc_t r1 = rstd_of(sums[sl.row * 3 + 0], inv_h, eps);
  const acc_t r2 = rstd_of(sums[sl.row * 3 + 1], inv_h, eps);
  const acc_t r3 = rstd_of(sums[sl.row * 3 + 2], inv_h, eps);
  if (sl.lane == 0) {
    rstd[sl.row * 3 + 0] = r3;
    rstd[sl.row * 3 + 1] = r2;
    rstd[sl.row * 3 + 2] = r1;
  }
  // The parameters, read on the device in their own dtype: no host synchronisation.
  const HornerCoeffs<acc_t> a = forward_coeffs(load_param<acc_t>(weight, 0), load_param<acc_t>(weight, 1),
                                               load_param<acc_t>(weight, 2), r3, r2, r1);
  const acc_t b = load_param<acc_t>(bias, 0);
  const scalar_t* x_row = x + sl.row * x_stride;
  const scalar_t* mul_row = kMul ? mul + sl.row * mul_stride : nullptr;
  scalar_t* out_row = out + sl.row * H;
  for (int64_t i = sl.lane; i < H / kVec; i += G) {
    acc_t v[kVec];
    load_shard_pack<kVec>(x_row, i, v);
    acc_t m[kVec];
    if constexpr (kMul) load_shard_pack<kVec>(mul_row, i, m);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      v[e] = poly_value(v[e], a, b);
      if constexpr (kMul) v[e] *= m[e];
    }
    store_shard_pack<kVec>(out_row, i, v);
  }
}

// MATH.md (13)-(14): this shard's [S_1, S_2, S_3] of each row, and its [r_3 S_3, r_2 S_2,
// r_1 S_1, G] (the row's share of dw, db). g = grad_out, or grad_out * mul with kMul (MATH.md (9)).
template <typename scalar_t, typename acc_t, int kVec, bool kMul>
__global__ void poly_norm_sharded_bwd_stats_kernel(const scalar_t* __restrict__ grad_out,  // [M, H_shard]
                                                   int64_t g_stride,
                                                   const scalar_t* __restrict__ x,  // [M, H_shard]
                                                   int64_t x_stride,
                                                   const scalar_t* __restrict__ mul,  // [M, H_shard] with kMul
                                                   int64_t mul_stride,
                                                   const acc_t* __restrict__ rstd,  // [M, 3]: r_3, r_2, r_1
                                                   acc_t* __restrict__ sums,  // [M, 3]
                                                   acc_t* __restrict__ terms,  // [M, 4]
                                                   int64_t M, int64_t H, int G) {
  __shared__ acc_t red[32][4];
  const ShardLane sl = shard_lane(G);
  acc_t s[4] = {acc_t(0), acc_t(0), acc_t(0), acc_t(0)};
  if (sl.row < M) {
    const scalar_t* g_row = grad_out + sl.row * g_stride;
    const scalar_t* x_row = x + sl.row * x_stride;
    const scalar_t* mul_row = kMul ? mul + sl.row * mul_stride : nullptr;
    for (int64_t i = sl.lane; i < H / kVec; i += G) {
      acc_t xv[kVec], gv[kVec], mv[kVec];
      load_shard_pack<kVec>(x_row, i, xv);
      load_shard_pack<kVec>(g_row, i, gv);
      if constexpr (kMul) load_shard_pack<kVec>(mul_row, i, mv);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if constexpr (kMul) gv[e] *= mv[e];
        add_row_grad_sums(s, xv[e], gv[e]);
      }
    }
  }
  shard_reduce<4>(s, red, G);
  if (sl.row < M && sl.lane == 0) {
    sums[sl.row * 3 + 0] = s[0];
    sums[sl.row * 3 + 1] = s[1];
    sums[sl.row * 3 + 2] = s[2];
    terms[sl.row * 4 + 0] = rstd[sl.row * 3 + 0] * s[2];
    terms[sl.row * 4 + 1] = rstd[sl.row * 3 + 1] * s[1];
    terms[sl.row * 4 + 2] = rstd[sl.row * 3 + 2] * s[0];
    terms[sl.row * 4 + 3] = s[3];
  }
}

// MATH.md (5)-(6) from the summed sums and the unsharded H; (10) with kMul.
template <typename scalar_t, typename acc_t, int kVec, bool kMul>
__global__ void poly_norm_sharded_bwd_apply_kernel(const scalar_t* __restrict__ grad_out,  // [M, H_shard]
                                                   int64_t g_stride,
                                                   const scalar_t* __restrict__ x,  // [M, H_shard]
                                                   int64_t x_stride,
                                                   const scalar_t* __restrict__ mul,  // [M, H_shard] with kMul
                                                   int64_t mul_stride,
                                                   const acc_t* __restrict__ rstd,  // [M, 3]
                                                   const acc_t* __restrict__ sums,  // [M, 3] over every shard
                                                   ParamRef weight,  // (3,) any float dtype: [w0, w1, w2]
                                                   ParamRef bias,  // (1,) any float dtype
                                                   scalar_t* __restrict__ grad_x,  // [M, H_shard] contiguous
                                                   scalar_t* __restrict__ grad_mul,  // [M, H_shard] with kMul
                                                   int64_t M, int64_t H, acc_t inv_h, int G) {
  const ShardLane sl = shard_lane(G);
  if (sl.row >= M) return;
  const acc_t r3 = rstd[sl.row * 3 + 0], r2 = rstd[sl.row * 3 + 1], r1 = rstd[sl.row * 3 + 2];
  const acc_t w0 = load_param<acc_t>(weight, 0), w1 = load_param<acc_t>(weight, 1), w2 = load_param<acc_t>(weight, 2);
  const acc_t b = kMul ? load_param<acc_t>(bias, 0) : acc_t(0);
  const GradCoeffs<acc_t> k = backward_coeffs(w0, w1, w2, r3, r2, r1, sums[sl.row * 3 + 0], sums[sl.row * 3 + 1],
                                              sums[sl.row * 3 + 2], inv_h);
  const HornerCoeffs<acc_t> a = forward_coeffs(w0, w1, w2, r3, r2, r1);
  const scalar_t* g_row = grad_out + sl.row * g_stride;
  const scalar_t* x_row = x + sl.row * x_stride;
  const scalar_t* mul_row = kMul ? mul + sl.row * mul_stride : nullptr;
  for (int64_t i = sl.lane; i < H / kVec; i += G) {
    acc_t xv[kVec], gv[kVec], mv[kVec], dx[kVec], dm[kVec];
    load_shard_pack<kVec>(x_row, i, xv);
    load_shard_pack<kVec>(g_row, i, gv);
    if constexpr (kMul) load_shard_pack<kVec>(mul_row, i, mv);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const acc_t g = kMul ? gv[e] * mv[e] : gv[e];
      dx[e] = grad_x_value(xv[e], g, k);
      if constexpr (kMul) dm[e] = gv[e] * poly_value(xv[e], a, b);
    }
    store_shard_pack<kVec>(grad_x + sl.row * H, i, dx);
    if constexpr (kMul) store_shard_pack<kVec>(grad_mul + sl.row * H, i, dm);
  }
}

}  // namespace
}  // namespace polynorm
