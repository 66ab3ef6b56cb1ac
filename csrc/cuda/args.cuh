// What the CUDA kernels take beside the rows and parameters: the fused multiply's tensors
// (MulArgs), the grouped ops' per-row expert (GroupArgs, load_param_at, expert_params), and
// the row kernels' occupancy bound (row_min_blocks). Used by forward.cuh and backward.cuh,
// filled in by launch.cuh.
#pragma once

#include "expert_offsets.cuh"
#include "launch_plan.h"
#include "packs.cuh"

namespace polynorm {
namespace {

// The fused multiply (kMul = true: mul_forward, mul_backward), docs/MATH.md:
//   forward:  out = y * mul, with y in opmath, never rounded by itself;
//   backward: g = grad_out * mul (opmath) drives PolyNorm's backward, and
//             grad_mul = grad_out * y, y recomputed from x and rstd (Horner form, as forward).
// Unused (and compiled out) when kMul = false.
template <typename scalar_t>
struct MulArgs {
  const scalar_t* mul;   // [M, H], rows row_stride apart
  int64_t row_stride;
  bool vec_ok;           // mul's rows are 16-byte aligned (else the realigning row build realigns them;
                         // the tiled kernels load them element-wise)
  scalar_t* grad_mul;    // backward: [M, H] contiguous
  bool grad_vec_ok;      // grad_mul's rows are 16-byte aligned and H % VEC == 0
  ParamRef bias;         // backward: (1,) any float dtype, for y
};

// Grouped PolyNorm (grouped_forward, grouped_backward; docs/MATH.md, "Grouped PolyNorm"): the
// same kernels with a per-row expert, a runtime switch (offsets.ptr == nullptr: not grouped;
// the fused op's builds, kMul = true, compile it out). The kernel's weight and bias are then
// the [E, 3] and [E] (or [E, 1]) tensors: weight.stride steps between an expert's w0, w1, w2,
// and the expert strides below between experts. Per row:
// - the row's expert e is the first with offsets[e] > row (expert_of_warp, a warp vote, for
//   aligned rows of a warp or more; expert_of, a binary search, for the others), found before
//   the row's loads are issued (it runs while few registers are live); its w0, w1, w2 and b
//   are read for the row (L1-cached) instead of the kernel-wide values;
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

// Blocks of the narrow <= 256-thread builds (PolyNorm's forward of 2-byte odd-H rows) that must
// fit an SM at once: 3 caps them at 80
// registers a thread. Set with -DPOLYNORM_ROW_MIN_BLOCKS=1 (no cap) for measurements.
#ifndef POLYNORM_ROW_MIN_BLOCKS
#define POLYNORM_ROW_MIN_BLOCKS 3
#endif

// The wide realigning builds' blocks (below): 2 (128 registers, where ptxas spills 0-88 bytes
// by dtype and op, fp64 the most, since the row's end is masked once, bench/NOTES.md v9, the
// same-phase stage, v13, and the backward's class sums, v17) unless set otherwise for
// measurements. Measured in v8 (call 6), when they spilled 100-470 bytes: at 1 (up to 255
// registers, no spills) views ran slower. The backward's persistent
// grid is sized by the aligned build whatever the layout (launch_backward_row), so the bits of dW
// and dB do not depend on it.
#ifndef POLYNORM_WIDE_REALIGN_MIN_BLOCKS
#define POLYNORM_WIDE_REALIGN_MIN_BLOCKS 2
#endif

// Blocks of a <= 256-thread build that must fit an SM at once, by the packs a thread holds
// (packs_held, launch_plan.h: kPacks times the tensors held): 2 (128 registers a thread) for
// the wide builds (12 or more: 16 packs of PolyNorm's forward, 8 each of x and grad_y
// backward, ...); POLYNORM_ROW_MIN_BLOCKS (80 registers) for the narrow forward (8 or 7).
constexpr int row_min_blocks(int max_threads, int packs_held, bool realign) {
  return max_threads != 256              ? 1
         : packs_held >= kRowWidePacks ? (realign ? POLYNORM_WIDE_REALIGN_MIN_BLOCKS : 2)
                                       : POLYNORM_ROW_MIN_BLOCKS;
}

// A bench's A/B (_tune_rows(forward_regs); launch_plan.h, RowTuning): PolyNorm's aligned forward of the wide build
// (16 packs a thread) capped at `regs` registers a thread rather than row_min_blocks' 128 (127 for fp32), so that
// more CTAs of 128 fit an SM (65536 registers: 4 at 128, 5 at 96, 6 at 80; 3 CTAs of 256 at 80). The cap is given
// to ptxas as launch bounds of 2 blocks of row_cap_threads(regs) threads: 65536 registers over their warps, in
// units of 256 a warp, is 96 a thread for 320 threads and 80 for 384 (not every cap comes out exactly: 104 would
// give 112, hence the asserts). Blocks of up to 256 threads launch it.
constexpr int row_cap_threads(int regs) { return 65536 / (2 * regs) / 32 * 32; }
constexpr int row_cap_regs(int threads) { return 65536 / (2 * threads / 32) / 256 * 256 / 32; }
static_assert(row_cap_regs(row_cap_threads(96)) == 96 && row_cap_regs(row_cap_threads(80)) == 80,
              "the launch bounds of the capped builds give ptxas exactly their cap");

}  // namespace
}  // namespace polynorm
