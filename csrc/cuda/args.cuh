// What the CUDA kernels take beside the rows and parameters: the fused multiply's tensors
// (MulArgs), the grouped ops' per-row expert (GroupArgs, load_param_at, expert_params), and
// the row kernels' occupancy bound (row_min_blocks). Used by forward.cuh and backward.cuh,
// filled in by launch_forward.cuh and launch_backward.cuh.
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
//   partial or finish_param_grads runs; grouped_param_sums (cuda/backward.cu) then
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

// Blocks of a <= 256-thread build that must fit an SM at once, by the packs a thread holds
// (launch_plan.h, packs_held): 2 (128 registers a thread) for the wide builds, whose realigning
// builds then spill 0-88 bytes by dtype and op (at 1 block, up to 255 registers and no spill,
// the views run slower); 3 (80 registers) for the narrow ones (PolyNorm's 2-byte
// odd rows, the fused forward's 4-pack rows). Blocks of 1024 threads: 1 (64 registers).
constexpr int row_min_blocks(int max_threads, int packs_held, [[maybe_unused]] bool realign) {
  return max_threads != 256 ? 1 : packs_held >= kRowWidePacks ? 2 : 3;
}

}  // namespace
}  // namespace polynorm
