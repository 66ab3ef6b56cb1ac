// The tiled forward kernel of PolyNorm, of the fused PolyNorm x mul (kMul) and of the grouped op
// (GroupArgs): any row, on a block of kMaxGroup threads that walks it tile by tile. It serves the
// rows past the row kernels' reach (bf16: H > 524288; on a device without clusters, past 32768,
// the fused op's past 16384) and those of a cluster of 16 CTAs that the device cannot place
// (launch_plan.h). Every such row needs more than 256 threads of row kernels, so the launcher gives
// the tiled kernels one row a block of kMaxGroup threads (launch_forward.cuh), whatever H. Included
// by forward.cuh.
#pragma once

#include "args.cuh"
#include "launch_plan.h"
#include "packs.cuh"
#include "polynorm_math.h"
#include "reduce.cuh"

#include <ATen/OpMathType.h>

#include <cstdint>

namespace polynorm {
namespace {

// One pass accumulates sum x^2, x^4, x^6 in opmath (MATH.md (1)); one block reduction combines
// all three; then rstd = [r_3, r_2, r_1] (MATH.md (2)) and y (MATH.md (3)) are written. Launched
// with a block of kMaxGroup threads a row and a block a row (gridDim.x = M).
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
    [[maybe_unused]] int64_t M,                    // rows: gridDim.x, a block a row
    int64_t H,
    double eps) {
  using acc_t = at::opmath_type<scalar_t>;
  using P = PackOf<scalar_t>;
  constexpr int G = kMaxGroup;
  __shared__ acc_t smem[G / 32][3];

  const int64_t row = blockIdx.x;
  const scalar_t* x_row = x + row * x_row_stride;
  scalar_t* y_row = y + row * H;

  // Grouped (GroupArgs): the row's expert (E: none); a row of no expert is not read.
  const bool grouped = !kMul && grouping.offsets.ptr != nullptr;
  const int64_t expert = grouped ? expert_of(grouping.offsets, row) : grouping.offsets.E;
  const bool owned = !grouped || expert < grouping.offsets.E;

  const int64_t packs = owned ? (H + P::kVec - 1) / P::kVec : 0;
  // Rows of up to G * kFwdPacks packs stay in registers (x read once); longer rows are walked
  // twice, tile by tile, the second walk mostly in L2. Only the fused op's rows on a device
  // without clusters are that short here (bf16 16386-32768): PolyNorm's rows reach the tiled
  // kernel only past 4096 packs (launch_plan.h), so its builds leave the resident path out.
  const bool resident = kMul && packs <= int64_t(G) * kFwdPacks;

  Pack buf[kFwdPacks];
  acc_t s[3] = {acc_t(0), acc_t(0), acc_t(0)};
  auto accumulate = [&](const Pack& pk) {
#pragma unroll
    for (int e = 0; e < P::kVec; ++e) add_row_sums(s, P::value(pk, e));
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
  tile_reduce<G, 3>(s, smem);

  const acc_t inv_h = acc_t(1) / static_cast<acc_t>(H);
  const acc_t e = static_cast<acc_t>(eps);
  const acc_t r1 = rstd_of(s[0], inv_h, e);
  const acc_t r2 = rstd_of(s[1], inv_h, e);
  const acc_t r3 = rstd_of(s[2], inv_h, e);
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
  const HornerCoeffs<acc_t> a = forward_coeffs(w0, w1, w2, r3, r2, r1);
  const scalar_t* m_row = kMul ? mul.mul + row * mul.row_stride : nullptr;
  auto output = [&](const Pack& pk, int64_t p) {
    Pack m;
    if constexpr (kMul) m = load_pack(m_row, p, H, mul.vec_ok);
    Pack out;
#pragma unroll
    for (int e = 0; e < P::kVec; ++e) {
      acc_t o = poly_value(P::value(pk, e), a, b);
      if constexpr (kMul) o *= P::value(m, e);  // MATH.md (8)
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

}  // namespace
}  // namespace polynorm
