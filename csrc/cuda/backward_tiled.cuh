// The tiled backward kernel of PolyNorm, of the fused PolyNorm x mul (kMul) and of the grouped op
// (GroupArgs): any row, on a block of kMaxGroup threads that walks it tile by tile, writing dx and
// the row's dW/dB partial (grouped: its row terms). It serves the rows past the row kernels' reach
// (bf16: H > 262144; on a device without clusters, past 16384, the fused op's past 8192) and
// those of a cluster of 16 CTAs that the device cannot place (launch_plan.h). Every such row needs
// more than 256 threads of row kernels, so the launcher gives the tiled kernels one row a block of
// kMaxGroup threads (launch_backward.cuh), whatever H. Included by backward.cuh.
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

// One pass accumulates S_1, S_2, S_3 (S_p = sum g x^p) and G = sum g (MATH.md (4)); one block
// reduction combines all four; then dx is written (MATH.md (5)-(6)). Each block also writes its
// row's share of [dw0, dw1, dw2, db], [r_3 S_3, r_2 S_2, r_1 S_1, G] (MATH.md (7)), as its partial.
// Launched with a block of kMaxGroup threads a row and a block a row (gridDim.x = M: every block
// takes part in the last block's sum, finish_param_grads).
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
    ParamGrads<at::opmath_type<scalar_t>> param_grads,   // dW, dB: partials, then the last block's sum (or apart)
    MulArgs<scalar_t> mul,                               // kMul: grad_y = grad_out * mul; writes grad_mul
    GroupArgs<at::opmath_type<scalar_t>> grouping,       // grouped: a per-row expert; row terms, not param_grads
    [[maybe_unused]] int64_t M,                          // rows: gridDim.x, a block a row
    int64_t H) {
  using acc_t = at::opmath_type<scalar_t>;
  using P = PackOf<scalar_t>;
  constexpr int G = kMaxGroup;
  __shared__ acc_t smem[G / 32][4];

  const int64_t row = blockIdx.x;
  const scalar_t* g_row = grad_y + row * g_row_stride;
  const scalar_t* x_row = x + row * x_row_stride;
  scalar_t* dx_row = grad_x + row * H;
  const scalar_t* m_row = kMul ? mul.mul + row * mul.row_stride : nullptr;
  scalar_t* dm_row = kMul ? mul.grad_mul + row * H : nullptr;

  // Grouped (GroupArgs): the row's expert (E: none); a row of no expert is not read.
  const bool grouped = !kMul && grouping.offsets.ptr != nullptr;
  const int64_t expert = grouped ? expert_of(grouping.offsets, row) : grouping.offsets.E;
  const bool owned = !grouped || expert < grouping.offsets.E;

  const int64_t packs = owned ? (H + P::kVec - 1) / P::kVec : 0;
  // As in forward: rows of up to G * kBwdPacks packs keep x and grad_y in registers. Only the
  // fused op's rows on a device without clusters are that short here (bf16 8194-16384):
  // PolyNorm's rows reach the tiled kernel only past 2048 packs, so its builds leave it out.
  const bool resident = kMul && packs <= int64_t(G) * kBwdPacks;

  Pack xb[kBwdPacks];
  Pack gb[kBwdPacks];
  Pack mb[kMul ? kBwdPacks : 1];  // kMul: mul's packs; gb holds grad_out's
  // g: the gradient reaching PolyNorm's y (grad_out * mul when kMul, MATH.md (9)), in opmath.
  auto grad_of = [&](const Pack& gp, const Pack& mp, int e) {
    if constexpr (kMul) return P::value(gp, e) * P::value(mp, e);
    return P::value(gp, e);
  };
  acc_t s[4] = {acc_t(0), acc_t(0), acc_t(0), acc_t(0)};
  auto accumulate = [&](const Pack& xp, const Pack& gp, const Pack& mp) {
#pragma unroll
    for (int e = 0; e < P::kVec; ++e) add_row_grad_sums(s, P::value(xp, e), grad_of(gp, mp, e));
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
  tile_reduce<G, 4>(s, smem);

  acc_t r3 = acc_t(0), r2 = acc_t(0), r1 = acc_t(0);
  if (owned) {
    r3 = rstd[row * 3 + 0];
    r2 = rstd[row * 3 + 1];
    r1 = rstd[row * 3 + 2];
  }
  // The row's share of [dw0, dw1, dw2, db] (0 for a row of no expert): its expert's row terms
  // (grouped), or the block's partial, summed by the last block.
  acc_t* terms = grouped ? grouping.row_terms + row * 4 : param_grads.partials + int64_t(blockIdx.x) * 4;
  if (threadIdx.x == 0) {
    terms[0] = r3 * s[2];
    terms[1] = r2 * s[1];
    terms[2] = r1 * s[0];
    terms[3] = s[3];
  }
  if (!grouped) finish_param_grads(param_grads, int(threadIdx.x), G);
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
  const GradCoeffs<acc_t> cd = backward_coeffs(w0, w1, w2, r3, r2, r1, s[0], s[1], s[2], inv_h);

  // kMul: y's Horner coefficients, as forward computes them (MATH.md (10)).
  const HornerCoeffs<acc_t> a = kMul ? forward_coeffs(w0, w1, w2, r3, r2, r1) : HornerCoeffs<acc_t>{};
  const acc_t b = kMul ? load_param<acc_t>(mul.bias, 0) : acc_t(0);
  // Writes pack p of dx (and, kMul, of grad_mul).
  auto output = [&](const Pack& xp, const Pack& gp, const Pack& mp, int64_t p) {
    Pack out;
#pragma unroll
    for (int e = 0; e < P::kVec; ++e) {
      P::set(out, e, Elem<scalar_t>::from_acc(grad_x_value(P::value(xp, e), grad_of(gp, mp, e), cd)));
    }
    store_pack(dx_row, p, H, dx_vec_ok, out);
    if constexpr (kMul) {
#pragma unroll
      for (int e = 0; e < P::kVec; ++e) {
        P::set(out, e, Elem<scalar_t>::from_acc(P::value(gp, e) * poly_value(P::value(xp, e), a, b)));
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

}  // namespace
}  // namespace polynorm
