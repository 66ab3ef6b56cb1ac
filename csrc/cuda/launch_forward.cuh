// The forward launchers (polynorm::forward, mul_forward, grouped_forward): a row of the plan
// (csrc/launch_plan.h) on the row kernel of its layout, or on the tiled kernel. Host code, with
// the forward kernels it launches (forward.cuh).
#pragma once

#include "forward.cuh"
#include "launch_common.cuh"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

namespace polynorm {
namespace {

template <typename scalar_t>
using FwdRowKernel = decltype(&poly_norm_fwd_row_kernel<scalar_t, kRowFwdPacks, kAligned, 256, false, false, false>);

// The compiled forward row kernel `want` (launch_plan.h, row_kernel_for).
template <typename scalar_t, bool kMul>
FwdRowKernel<scalar_t> fwd_row_kernel(const RowKernel& want) {
  return find_row_kernel<false, scalar_t, kMul, FwdRowKernel<scalar_t>>(want, [](auto k) {
    using K = decltype(k);
    return &poly_norm_fwd_row_kernel<scalar_t, K::packs, K::build, K::max_threads, K::mul, K::grouped,
                                     K::whole_warps>;
  });
}

// A row of the plan on its row kernel. False, launching nothing, where the device cannot place
// the row's cluster (clusters_fit): the caller takes the tiled kernel.
template <typename scalar_t, bool kMul>
bool launch_forward_row(const LaunchPlan& lp, bool x_vec_ok, bool y_vec_ok, const scalar_t* x_ptr, int64_t x_stride,
                        scalar_t* y_ptr, at::opmath_type<scalar_t>* rstd, ParamRef weight, ParamRef bias,
                        const MulArgs<scalar_t>& mul, const GroupArgs<at::opmath_type<scalar_t>>& grouping, int64_t M,
                        int64_t H, double eps, cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int elem_size = sizeof(scalar_t);
  const RowPlan& row = lp.row;
  check_slots(row, lp.packs, H, elem_size);
  // A misaligned mul takes a realigning build too (no element-wise loads).
  const bool realign = !x_vec_ok || !y_vec_ok || (kMul && !mul.vec_ok);
  bool same_phase = realign && same_phase_rows(x_ptr, x_stride, y_ptr, H);
  if constexpr (kMul) same_phase = same_phase && same_phase_rows(x_ptr, x_stride, mul.mul, mul.row_stride);
  // Misaligned x (or mul) beside a y of whole aligned packs (y is a new tensor: every such row)
  // takes the pack-realigned build: the inputs realigned to packs, summed and stored as the
  // aligned build does. Other misaligned rows: same-phase, else one phase a row (realigned).
  RowBuild layout = !realign    ? RowBuild::kAligned
                    : same_phase ? RowBuild::kSamePhase
                    : y_vec_ok   ? RowBuild::kPackRealigned
                                 : RowBuild::kRealigned;
  const bool grouped = !kMul && grouping.offsets.ptr != nullptr;  // the grouped builds (kGrouped)
  const auto kernel_of = [&](RowBuild l) {
    return fwd_row_kernel<scalar_t, kMul>(row_kernel_for(false, kMul, grouped, lp, l));
  };
  // Dynamic shared memory: the same-phase and realigned builds' stage areas (row_phase.cuh, stage_row:
  // one a warp), then the cluster slots.
  const auto smem_of = [&](RowBuild l) {
    const bool staged = l == RowBuild::kSamePhase || l == RowBuild::kRealigned;
    return (staged ? size_t(row.threads / 32) * stage_words(lp.packs) * 4 : 0) +
           cluster_slot_bytes(row, 3, sizeof(acc_t));
  };
  const bool fallback = row_stage_may_not_fit(row_kernel_for(false, kMul, grouped, lp, RowBuild::kSamePhase));
  if (!clusters_fit(row, row_layouts(H, elem_size, fallback), kernel_of, smem_of)) return false;
  // The stage does not fit every device's block (launch_plan.h, row_stage_may_not_fit): the
  // pack-realigned build serves those rows, with the same bits.
  if ((layout == RowBuild::kSamePhase || layout == RowBuild::kRealigned) && !smem_fits(kernel_of(layout), smem_of(layout))) {
    TORCH_INTERNAL_ASSERT(fallback, "polynorm: a forward row block's ", num(int64_t(smem_of(layout))),
                          " bytes of shared memory do not fit");
    layout = RowBuild::kPackRealigned;
  }
  const auto kernel = kernel_of(layout);
  // The realigned build's phase (forward.cuh): x's rows' or y's (launch_plan.h, realign_phase); the
  // flags say which tensors are realigned into or out of it (mul's: `margs.vec_ok`). The kernel
  // takes x's phase unless x's flag is set, so the host's choice and the kernel's agree:
  // same_phase_rows is an equivalence relation, so a tensor unflagged against the reference
  // shares every row's phase with it.
  bool x_flag = !x_vec_ok, y_flag = !y_vec_ok;
  MulArgs<scalar_t> margs = mul;
  if (layout == RowBuild::kRealigned) {
    const auto off = [&](const scalar_t* a, int64_t a_stride, const scalar_t* b, int64_t b_stride) {
      return !same_phase_rows(a, a_stride, b, b_stride);
    };
    const int classes[3] = {0, off(y_ptr, H, x_ptr, x_stride) ? 1 : 0,
                            !kMul                                            ? 0
                            : !off(mul.mul, mul.row_stride, x_ptr, x_stride) ? 0
                            : !off(mul.mul, mul.row_stride, y_ptr, H)        ? 1
                                                                              : 2};
    const bool y_ref = realign_phase(false, kMul, classes) == 1;
    const scalar_t* ref = y_ref ? y_ptr : x_ptr;
    const int64_t ref_stride = y_ref ? H : x_stride;
    x_flag = off(x_ptr, x_stride, ref, ref_stride);
    y_flag = off(y_ptr, H, ref, ref_stride);
    if constexpr (kMul) margs.vec_ok = !off(mul.mul, mul.row_stride, ref, ref_stride);
  }
  // The grid: a block per R rows for rows of one CTA (1.05-1.06 of a copy at H = 2048-16384
  // against 1.13-1.14 persistent); persistent for rows of clusters (bf16 131072: 1.30 against
  // 1.34; both bench/results/h200-row-packs/tune_bf16.log: f16w1, f16w0) and for the fused op's
  // rows of one CTA past 128 threads (bf16 12288: 1.127 of its floor against 1.206,
  // bench/results/h200-param-sums/tune.log: mfw1, mf).
  const int waves = row.cluster > 1 || (kMul && row.G > kRowMinThreads) ? 1 : 0;
  const size_t smem = smem_of(layout);
  allow_smem(kernel, smem);
  const int64_t grid = row_grid(kernel, row, M, smem, waves);
  launch_row_kernel(kernel, row, grid, smem, stream, x_ptr, x_stride, x_flag, y_ptr, y_flag, rstd, weight, bias, margs,
                    grouping, M, H, eps, row.G, row.cluster, row_stagger(kernel, row, M, grid, smem, waves, false));
  return true;
}

// One launch of the forward (kMul false: polynorm::forward, or grouped_forward with `groups`;
// true: mul_forward, with `mul` read like x). Fills out [M, H] and rstd [M, 3]; argument checks
// are the caller's. `op` names the operator in errors.
template <bool kMul>
void launch_forward(const char* op, const LaunchConfig& config, const Rows& rows, const Rows* mul_rows,
                    const at::Tensor& weight, const at::Tensor& bias, double eps, at::Tensor& out, at::Tensor& rstd,
                    const GroupTensors* groups = nullptr) {
  if (rows.M == 0) return;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "polynorm.forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    constexpr int kVec = PackOf<scalar_t>::kVec;
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
    const LaunchPlan lp = plan_for(op, false, kMul, rows.H, sizeof(scalar_t), config);
    if (lp.family == Family::kRow) {
      if (launch_forward_row<scalar_t, kMul>(lp, x_vec_ok, y_vec_ok, x_ptr, rows.row_stride, y_ptr,
                                             rstd.mutable_data_ptr<acc_t>(), w_ref, b_ref, mul, grouping, rows.M,
                                             rows.H, eps, stream)) {
        return;
      }
      TORCH_CHECK(config.family != Family::kRow, op, ": this device cannot place the clusters of ",
                  num(lp.row.cluster), " blocks of rows of ", num(rows.H), " elements");
    }
    // The tiled kernel: one row a block of kMaxGroup threads.
    poly_norm_fwd_tiled_kernel<scalar_t, kMul><<<static_cast<unsigned>(rows.M), dim3(kMaxGroup, 1), 0, stream>>>(
        x_ptr, rows.row_stride, x_vec_ok, y_ptr, y_vec_ok, rstd.mutable_data_ptr<acc_t>(), w_ref, b_ref, mul,
        grouping, rows.M, rows.H, eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace
}  // namespace polynorm
