// The backward launchers (polynorm::backward, mul_backward, grouped_backward): a row of the plan
// (csrc/launch_plan.h) on the row kernel of its layout, or on the tiled kernel, and the dW / dB
// partials' sum (reduce.cuh: the last block's, or param_sum_kernel). Host code, with the backward
// kernels it launches (backward.cuh).
#pragma once

#include "backward.cuh"
#include "launch_common.cuh"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <map>
#include <mutex>

namespace polynorm {
namespace {

template <typename scalar_t>
using BwdRowKernel = decltype(&poly_norm_bwd_row_kernel<scalar_t, kRowBwdPacks, kAligned, 256, false, false, false>);

// The compiled backward row kernel `want` (launch_plan.h, row_kernel_for, row_sizing_kernel).
template <typename scalar_t, bool kMul>
BwdRowKernel<scalar_t> bwd_row_kernel(const RowKernel& want) {
  return find_row_kernel<true, scalar_t, kMul, BwdRowKernel<scalar_t>>(want, [](auto k) {
    using K = decltype(k);
    return &poly_norm_bwd_row_kernel<scalar_t, K::packs, K::build, K::max_threads, K::mul, K::grouped,
                                     K::whole_warps>;
  });
}

// Arrival counters for the backward's last-block reduction (finish_param_grads), in static
// device memory: zero when the module loads, never allocated (so a first use inside CUDA-graph
// capture is fine), and back at zero after every launch. Two launches must never run on one
// counter at the same time:
// - An eager launch takes its stream's counter. Launches on one stream run one after another.
//   Streams get counters in order of first use; past kStreamSlots streams on a device they share,
//   which matters only if two of those streams run a backward at once.
// - A launch captured into a CUDA graph takes a counter of its own, never used by another launch
//   (a graph may be replayed on any stream, concurrently with eager work, while one graph's replays
//   run one after another). Past kCaptureSlots captures on a device, the capture counters are
//   reused, oldest first.
// Each translation unit that includes this header has counters of its own (its ops' launches).
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

// The row backward's partials summed apart (ParamGrads::apart; reduce.cuh, param_sum_kernel): one
// block, launched after the row kernel on its stream; on sm_90 as a programmatic dependent launch,
// placed once the row kernel's blocks have left their rows and waiting there for the row kernel to
// complete: its launch overlaps the row kernel's last blocks. Only where the kernel's code has that
// wait: a build without sm_90 code (PTX of an older arch, JIT compiled on an H200) compiles
// griddepcontrol out, and then stream order alone orders the two.
template <typename acc_t>
bool param_sum_waits() {
  static const bool waits = [] {
    cudaFuncAttributes attributes{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, &param_sum_kernel<acc_t>));
    return attributes.ptxVersion >= 90;
  }();
  return waits;
}

template <typename acc_t>
void launch_param_sum(const ParamGrads<acc_t>& pg, int64_t blocks, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1);
  config.blockDim = dim3(kParamSumThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = device_launches_clusters() && param_sum_waits<acc_t>() ? 1 : 0;  // sm_90 code on sm_90 and later
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, &param_sum_kernel<acc_t>, pg, blocks));
}

// A row of the plan on its row kernel; allocates the partials (not for a grouped launch, whose
// rows write their terms to grouping.row_terms instead). False, launching nothing, where the
// device cannot place the row's cluster (clusters_fit): the caller takes the tiled kernel.
template <typename scalar_t, bool kMul>
bool launch_backward_row(const LaunchPlan& lp, bool g_vec_ok, bool x_vec_ok, bool dx_vec_ok, const scalar_t* g_ptr,
                         int64_t g_stride, const scalar_t* x_ptr, int64_t x_stride,
                         const at::opmath_type<scalar_t>* rstd, ParamRef weight, scalar_t* dx_ptr,
                         ParamGrads<at::opmath_type<scalar_t>> pg, at::Tensor& partials, const at::Tensor& acc_like,
                         const MulArgs<scalar_t>& mul, const GroupArgs<at::opmath_type<scalar_t>>& grouping,
                         int64_t M, int64_t H, cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int elem_size = sizeof(scalar_t);
  const RowPlan& row = lp.row;
  check_slots(row, lp.packs, H, elem_size, lp.tail);
  const bool realign = !x_vec_ok || !g_vec_ok || !dx_vec_ok || (kMul && (!mul.vec_ok || !mul.grad_vec_ok));
  bool same_phase = realign && same_phase_rows(x_ptr, x_stride, g_ptr, g_stride) &&
                    same_phase_rows(x_ptr, x_stride, dx_ptr, H);
  if constexpr (kMul) {
    same_phase = same_phase && same_phase_rows(x_ptr, x_stride, mul.mul, mul.row_stride) &&
                 same_phase_rows(x_ptr, x_stride, mul.grad_mul, H);
  }
  // Misaligned rows of whole packs beside aligned outputs (grad_x and grad_mul are new tensors, so
  // every such row) take the pack-realigned build: the inputs realigned to packs, summed as the
  // aligned build sums them (row_lanes.cuh, RowLayout). Other misaligned rows: same-phase or realigned.
  const bool to_packs = dx_vec_ok && (!kMul || mul.grad_vec_ok);
  const RowBuild layout = !realign    ? RowBuild::kAligned
                          : same_phase ? RowBuild::kSamePhase
                          : to_packs   ? RowBuild::kPackRealigned
                                       : RowBuild::kRealigned;
  const bool grouped = !kMul && grouping.offsets.ptr != nullptr;  // the grouped builds (kGrouped)
  // Where the device places clusters is asked of the plain builds (not staged, no tail), as it is
  // for the grid (below); the launched build's clusters are checked by name.
  LaunchPlan plain = lp;
  plain.staged = false;
  plain.tail = 0;
  const auto plain_kernel = [&](RowBuild l) {
    return bwd_row_kernel<scalar_t, kMul>(row_kernel_for(true, kMul, grouped, plain, l));
  };
  // The same-phase and realigned builds' class areas (backward.cuh, class_sums), the cluster slots:
  // at most 32 KB (a CTA of 256 threads of a 2-byte dtype; fp32 and fp64 16) and 8 KB, which every
  // device gives a block.
  const auto smem_of = [&](RowBuild l) {
    const bool classes = l == RowBuild::kSamePhase || l == RowBuild::kRealigned;
    return (classes ? size_t(row.threads / 32) * bwd_class_area_bytes<scalar_t>() : 0) +
           cluster_slot_bytes(row, 4, sizeof(acc_t));
  };
  const RowKernel launched = row_kernel_for(true, kMul, grouped, lp, layout);
  const auto kernel = bwd_row_kernel<scalar_t, kMul>(launched);
  TORCH_INTERNAL_ASSERT(smem_fits(kernel, smem_of(layout)), "polynorm: a backward row block's ",
                        num(int64_t(smem_of(layout))), " bytes of shared memory do not fit");
  // The fused op's staged rows (launch_plan.h, row_staged; backward.cuh, kAlignedStaged): their
  // stages, three tensors' packs a thread, after the cluster slots.
  const size_t stage_bytes =
      launched.build == RowBuild::kAlignedStaged ? size_t(3) * lp.packs * kRowStageThreads * sizeof(Pack) : 0;
  // The realigned build's phase (backward.cuh): that of x's, grad_y's or grad_x's rows, the one of
  // least realignment cost (launch_plan.h, realign_phase); the flags say which tensors are realigned
  // into or out of it (kMul: mul's and grad_mul's in `margs`' vec_ok and grad_vec_ok). The kernel
  // takes the first unflagged of x, grad_y and grad_x; it agrees with this choice because
  // same_phase_rows is an equivalence relation: a tensor unflagged against `ref` shares every row's
  // phase with it.
  bool x_flag = !x_vec_ok, g_flag = !g_vec_ok, dx_flag = !dx_vec_ok;
  MulArgs<scalar_t> margs = mul;
  if (layout == RowBuild::kRealigned) {
    struct Rows {
      const scalar_t* ptr;
      int64_t stride;
    };
    const Rows xr{x_ptr, x_stride}, gr{g_ptr, g_stride}, dxr{dx_ptr, H};
    const Rows mr{kMul ? mul.mul : x_ptr, kMul ? mul.row_stride : x_stride}, gmr{kMul ? mul.grad_mul : dx_ptr, H};
    const auto off = [](const Rows& a, const Rows& b) { return !same_phase_rows(a.ptr, a.stride, b.ptr, b.stride); };
    // Each tensor's phase class: the index of the first tensor (x, grad_y, grad_x, mul, grad_mul)
    // whose rows share its phase.
    const Rows all[5] = {xr, gr, dxr, mr, gmr};
    int classes[5];
    for (int t = 0; t < 5; ++t) {
      classes[t] = t;
      for (int u = 0; u < t; ++u) {
        if (!off(all[u], all[t])) {
          classes[t] = classes[u];
          break;
        }
      }
    }
    const Rows ref = all[realign_phase(true, kMul, classes)];
    x_flag = off(xr, ref), g_flag = off(gr, ref), dx_flag = off(dxr, ref);
    margs.vec_ok = !off(mr, ref);
    margs.grad_vec_ok = !off(gmr, ref);
    TORCH_INTERNAL_ASSERT(!kMul || margs.grad_vec_ok == !dx_flag, "polynorm: grad_mul's rows start unlike grad_x's");
  }
  const size_t smem = cluster_slot_bytes(row, 4, sizeof(acc_t));
  // The grid, and so the order in which dW and dB are summed, is sized by one build for every layout
  // of a row (launch_plan.h, row_sizing_kernel: the aligned build, queried for its occupancy only),
  // so that a view's dW and dB are the aligned rows' bits whatever each build's occupancy. A grouped
  // launch sums no partials (its rows write their terms), but is sized by its own aligned build.
  const auto sizing = bwd_row_kernel<scalar_t, kMul>(row_sizing_kernel(kMul, grouped, lp));
  if (!clusters_fit(row, row_layouts(H, elem_size, false), plain_kernel, smem_of)) return false;
  const size_t launch_smem = smem_of(layout) + stage_bytes;
  allow_smem(kernel, launch_smem);
  if (row.cluster > 1 && kernel != sizing) fitting_clusters(kernel, row, launch_smem);
  // Who sums the dW / dB partials (launch_plan.h, row_sum_apart: by the rounds of rows of the
  // persistent grid), and the grid: persistent, but a block per R rows for PolyNorm's one-CTA rows
  // of whole packs that fill every lane's slots, whose partials are summed apart (a grid that fits
  // gridDim.x; with the last block's sum a block per row ran 1.49-1.58 of an add at bf16 512-16384,
  // bench/results/h200-row-packs/tune_bf16.log: b8w0).
  // By H and the dtype, not by the layout: a view's dW and dB are its aligned rows' bits.
  const int64_t persistent = row_grid(sizing, row, M, smem, 1);
  const int64_t groups = row_groups(row, M);
  const int64_t rounds = (groups + persistent / row.cluster - 1) / (persistent / row.cluster);
  const bool apart = !grouped && row_sum_apart(rounds);
  const bool full_lanes = whole_packs(H, elem_size) && int64_t(row.G) * lp.packs == slot_packs(H, elem_size);
  const bool row_blocks = apart && !kMul && row.cluster == 1 && full_lanes && groups <= kMaxGridBlocks;
  const int waves = row_blocks ? 0 : 1;
  const int64_t blocks = waves == 1 ? persistent : row_grid(sizing, row, M, smem, waves);
  if (!grouped) {
    partials = at::empty({blocks, 4}, acc_like.options());
    pg.partials = partials.mutable_data_ptr<acc_t>();
    pg.apart = apart;
  }
  launch_row_kernel(kernel, row, blocks, launch_smem, stream, g_ptr, g_stride, g_flag, x_ptr, x_stride, x_flag, rstd,
                    weight, dx_ptr, dx_flag, pg, margs, grouping, M, H, row.G, row.cluster,
                    row_stagger(sizing, row, M, blocks, smem, waves, true));
  if (apart) launch_param_sum(pg, blocks, stream);
  return true;
}

// One launch of the backward (kMul false: polynorm::backward, g_rows = grad_y; true: mul_backward,
// g_rows = grad_out, and grad_mul is written). Fills grad_x, grad_weight and grad_bias (opmath
// sums); argument checks are the caller's. Grouped (grouped_backward, with `groups`): fills grad_x
// and groups->row_terms, and writes grad_weight and grad_bias only when M = 0 (zeros);
// grouped_param_sums then sums the row terms per expert. `op` names the operator in errors.
template <bool kMul>
void launch_backward(const char* op, const LaunchConfig& config, const Rows& g_rows, const Rows& x_rows,
                     const Rows* mul_rows, const at::Tensor& weight, const at::Tensor* bias, const at::Tensor& rstd,
                     at::Tensor& grad_x, at::Tensor* grad_mul, at::Tensor& grad_weight, at::Tensor& grad_bias,
                     const GroupTensors* groups = nullptr) {
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
    const LaunchPlan lp = plan_for(op, true, kMul, x_rows.H, sizeof(scalar_t), config);
    const at::Tensor& acc_like = grad_weight;  // opmath, on x's device
    at::Tensor partials;  // O(M) at most: one [4] entry a block
    // Grouped: no partials, no last block's sum, nothing written to grad_weight or grad_bias.
    unsigned int* arrivals = groups == nullptr ? arrival_counter(stream) : nullptr;
    acc_t* dw_ptr = groups == nullptr ? grad_weight.mutable_data_ptr<acc_t>() : nullptr;
    acc_t* db_ptr = groups == nullptr ? grad_bias.mutable_data_ptr<acc_t>() : nullptr;
    if (lp.family == Family::kRow) {
      if (launch_backward_row<scalar_t, kMul>(lp, g_vec_ok, x_vec_ok, dx_vec_ok, g_ptr, g_rows.row_stride, x_ptr,
                                              x_rows.row_stride, rstd_c.const_data_ptr<acc_t>(), w_ref, dx_ptr,
                                              ParamGrads<acc_t>{nullptr, arrivals, dw_ptr, db_ptr}, partials,
                                              acc_like, mul, grouping, x_rows.M, x_rows.H, stream)) {
        return;
      }
      TORCH_CHECK(config.family != Family::kRow, op, ": this device cannot place the clusters of ",
                  num(lp.row.cluster), " blocks of rows of ", num(x_rows.H), " elements");
    }
    // The tiled kernel: one row a block of kMaxGroup threads, a partial a block (a grouped launch:
    // none).
    const int64_t blocks = x_rows.M;
    if (groups == nullptr) partials = at::empty({blocks, 4}, acc_like.options());
    const ParamGrads<acc_t> pg{groups == nullptr ? partials.mutable_data_ptr<acc_t>() : nullptr, arrivals, dw_ptr,
                               db_ptr};
    poly_norm_bwd_tiled_kernel<scalar_t, kMul><<<static_cast<unsigned>(blocks), dim3(kMaxGroup, 1), 0, stream>>>(
        g_ptr, g_rows.row_stride, g_vec_ok, x_ptr, x_rows.row_stride, x_vec_ok, rstd_c.const_data_ptr<acc_t>(),
        w_ref, dx_ptr, dx_vec_ok, pg, mul, grouping, x_rows.M, x_rows.H);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace
}  // namespace polynorm
