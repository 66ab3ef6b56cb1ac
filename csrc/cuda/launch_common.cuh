// Host code shared by the forward and backward launchers (launch_forward.cuh,
// launch_backward.cuh): the plan of a launch on this device, the row kernels compiled and the
// one a launch takes, grids (resident blocks and clusters), shared memory, clusters' placement,
// the staggered start, and the grouped ops' arguments.
//
// Where the rest lives:
// - csrc/launch_plan.h: which kernel serves which (op, H, dtype, layout), and why;
// - forward.cuh, backward.cuh: the row kernels; forward_tiled.cuh, backward_tiled.cuh: the tiled;
// - packs.cuh: 16-byte packs; row_lanes.cuh: the row kernels' lane layout, loads and builds;
//   row_phase.cuh: same-phase and realigned rows;
// - reduce.cuh: the reductions (tiled group, row, cluster) and the dW / dB partials' sums;
// - args.cuh: the fused op's and the grouped ops' kernel arguments (MulArgs, GroupArgs).
//
// Every warp access is 512 contiguous bytes, each per-thread sum runs over its packs in order
// and the reductions have a fixed shape, set by the plan: a row's bits do not depend on its batch,
// its alignment or the run. Accumulation is in at::opmath_type (fp32, fp64 for fp64 inputs).
#pragma once

#include "args.cuh"
#include "expert_offsets.cuh"
#include "launch_plan.h"
#include "packs.cuh"
#include "polynorm.h"
#include "reduce.cuh"

#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

namespace polynorm {
namespace {

// The plan's names of the builds are the kernels' RowLayout values.
static_assert(int(RowBuild::kAligned) == kAligned && int(RowBuild::kRealigned) == kRealigned &&
                  int(RowBuild::kSamePhase) == kSamePhase && int(RowBuild::kPackRealigned) == kPackRealigned &&
                  int(RowBuild::kAlignedStaged) == kAlignedStaged && int(RowBuild::kSamePhaseTail) == kSamePhaseTail &&
                  int(RowBuild::kRealignedTail) == kRealignedTail,
              "launch_plan.h's RowBuild and row_lanes.cuh's RowLayout");

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

ParamRef param_ref(const at::Tensor& t) {
  // numel is 1 or 3; a flat view's stride steps between elements (the tensor may be a view).
  const at::Tensor flat = t.reshape({t.numel()});
  return {t.const_data_ptr(), flat.stride(0), t.scalar_type()};
}

// An empty kernel of this translation unit: its attributes say for which virtual architecture the
// code that runs on the current device was compiled (ptxVersion: __CUDA_ARCH__ / 10), as CUB's
// PtxVersion reads it.
__global__ void arch_probe_kernel() {}

// Whether the current device launches thread-block clusters (sm_90 and later) and the code that
// runs there has them, cached per device. The cluster reductions and griddepcontrol are compiled
// only for __CUDA_ARCH__ >= 900 (reduce.cuh): a build of older code (compute_80 PTX, JIT compiled
// on an H100) runs every row on one CTA, as on an A100.
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
  cudaFuncAttributes probe{};
  C10_CUDA_CHECK(cudaFuncGetAttributes(&probe, &arch_probe_kernel));
  const bool clusters = value != 0 && probe.ptxVersion >= 90;
  cache.emplace(device, clusters);
  return clusters;
}

// launch_plan.h's plan of this launch, on this device (clusters where it launches them and the
// configuration allows them). `op` names the operator in the error of a "row" configuration
// that the row kernels cannot serve.
LaunchPlan plan_for(const char* op, bool backward, bool mul, int64_t H, int elem_size, const LaunchConfig& config) {
  const bool clusters = config.clusters && device_launches_clusters();
  const LaunchPlan plan = plan_launch(backward, mul, H, elem_size, clusters, config.family);
  TORCH_CHECK(config.family != Family::kRow || plan.family == Family::kRow, op, ": the row kernels do not serve rows of ",
              num(H), " elements of ", num(int64_t{elem_size}), " bytes", clusters ? "" : " without clusters");
  return plan;
}

// ---- The row kernels compiled ------------------------------------------------------------------

// A row kernel's template arguments as a type (launch_plan.h, RowKernel).
template <int kPacks, int kBuild, int kMaxThreads, bool kMul, bool kGrouped, bool kWholeWarps>
struct RowKernelOf {
  static constexpr int packs = kPacks, build = kBuild, max_threads = kMaxThreads;
  static constexpr bool mul = kMul, grouped = kGrouped, whole_warps = kWholeWarps;
  static constexpr RowKernel value{kPacks, static_cast<RowBuild>(kBuild), kMaxThreads, kMul, kGrouped, kWholeWarps};
};

template <typename F, int... kValues>
void for_each_int(std::integer_sequence<int, kValues...>, F&& f) {
  (f(std::integral_constant<int, kValues>{}), ...);
}

// Calls f(RowKernelOf<...>{}) for every row kernel of the direction, scalar type and kMul that
// launch_plan.h's row_kernel_compiled names: the only ones instantiated, so every compiled kernel
// is one a plan launches (bench/instantiations.py checks the binary).
template <bool kBackward, typename scalar_t, bool kMul, typename F>
void for_each_row_kernel(F&& f) {
  for_each_int(std::integer_sequence<int, 4, 7, 8, 15, 16>{}, [&](auto packs) {
    for_each_int(std::make_integer_sequence<int, kRowBuilds>{}, [&](auto build) {
      for_each_int(std::integer_sequence<int, kRowWideThreads, kRowMaxThreads>{}, [&](auto threads) {
        for_each_int(std::integer_sequence<int, 0, 1, 2, 3>{}, [&](auto bits) {  // grouped, whole warps
          using K = RowKernelOf<decltype(packs)::value, decltype(build)::value, decltype(threads)::value, kMul,
                                (decltype(bits)::value & 2) != 0, (decltype(bits)::value & 1) != 0>;
          if constexpr (row_kernel_compiled(kBackward, sizeof(scalar_t), K::value)) f(K{});
        });
      });
    });
  });
}

// The compiled row kernel `want`, found among them at run time (a few comparisons).
template <bool kBackward, typename scalar_t, bool kMul, typename Kernel, typename Of>
Kernel find_row_kernel(const RowKernel& want, const Of& of) {
  Kernel found = nullptr;
  for_each_row_kernel<kBackward, scalar_t, kMul>([&](auto k) {
    if (decltype(k)::value == want) found = of(k);
  });
  TORCH_INTERNAL_ASSERT(found != nullptr, "polynorm: no ", kBackward ? "backward" : "forward", " row kernel of ",
                        num(want.packs), " packs, build ", num(static_cast<int>(want.build)), ", ",
                        num(want.max_threads), " threads, mul ", num(want.mul), ", grouped ", num(want.grouped),
                        ", whole warps ", num(want.whole_warps));
  return found;
}

// The layouts rows of H elements may take (launch_plan.h, RowBuild): rows of whole packs aligned
// or pack-realigned; odd ones same-phase or realigned, and pack-realigned where the forward's
// stage may not fit (`fallback`: launch_plan.h, row_stage_may_not_fit).
struct RowLayouts {
  RowBuild layouts[3];
  int count;
  const RowBuild* begin() const { return layouts; }
  const RowBuild* end() const { return layouts + count; }
};
RowLayouts row_layouts(int64_t H, int elem_size, bool fallback) {
  if (whole_packs(H, elem_size)) return {{RowBuild::kAligned, RowBuild::kPackRealigned}, 2};
  return {{RowBuild::kRealigned, RowBuild::kSamePhase, RowBuild::kPackRealigned}, fallback ? 3 : 2};
}

// ---- Grids, shared memory, clusters ------------------------------------------------------------

// The SM count and a kernel's resident blocks a SM, cached per device: querying them takes
// microseconds, as long as a small kernel runs.
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

// Whether rows of a and b (row strides in elements) start at the same offset into their 16-byte
// chunks, row for row: the row kernels' same-phase path (the forward's stage, row_phase.cuh stage_row;
// the backward's class sums, backward.cuh class_sums). An equivalence relation.
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

// Whether a block of `kernel` with `smem` bytes of dynamic shared memory fits the device's shared
// memory a block (its static shared memory included; cached per device and kernel).
template <typename Kernel>
bool smem_fits(Kernel kernel, size_t smem) {
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*>, size_t> room;  // the most dynamic bytes a block
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, reinterpret_cast<const void*>(kernel));
  auto it = room.find(key);
  if (it == room.end()) {
    cudaFuncAttributes attr{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    int optin = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    const size_t total = static_cast<size_t>(optin), used = attr.sharedSizeBytes;
    it = room.emplace(key, total > used ? total - used : 0).first;
  }
  return smem <= it->second;
}

// Lets a kernel take `smem` bytes of dynamic shared memory, once a device, kernel and size: past
// 48 KB with its static shared memory a launch fails without it (the narrow forward's stage passes
// 48 KB from 448 threads).
template <typename Kernel>
void allow_smem(Kernel kernel, size_t smem) {
  if (smem == 0) return;
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*>, size_t> done;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, reinterpret_cast<const void*>(kernel));
  const auto it = done.find(key);
  if (it != done.end() && it->second >= smem) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  done[key] = smem;
}

// The launch configuration of a row kernel's grid: clusters of plan.cluster CTAs when > 1.
// config.attrs points into the object itself, so it is built in place and never copied.
struct RowLaunch {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attrs[2]{};  // the cluster's shape, and its scheduling policy where one is set

  RowLaunch(const RowPlan& plan, int64_t grid, size_t smem, cudaStream_t stream) {
    config.gridDim = dim3(static_cast<unsigned>(grid));
    config.blockDim = dim3(static_cast<unsigned>(plan.threads));
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = static_cast<unsigned>(plan.cluster);
    attrs[0].val.clusterDim.y = 1;
    attrs[0].val.clusterDim.z = 1;
    config.attrs = attrs;
    config.numAttrs = 1;
    const int policy = row_cluster_policy(plan.cluster);
    if (policy > 0) {
      attrs[1].id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
      attrs[1].val.clusterSchedulingPolicyPreference = static_cast<cudaClusterSchedulingPolicy>(policy);
      config.numAttrs = 2;
    }
  }
  RowLaunch(const RowLaunch&) = delete;
  RowLaunch& operator=(const RowLaunch&) = delete;
};

// Lets a kernel launch clusters of more than kRowPortableCluster CTAs (not portable: the table's
// longest rows), once a device and kernel. A device that refuses leaves the kernel without it;
// resident_clusters then finds no room, and clusters_fit sends the row to the tiled kernels.
template <typename Kernel>
void allow_cluster(Kernel kernel, const RowPlan& plan) {
  if (plan.cluster <= kRowPortableCluster) return;
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, bool> done;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, reinterpret_cast<const void*>(kernel));
  if (done.count(key) != 0) return;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    (void)cudaGetLastError();  // not this device: asked again next time, and refused again
    return;
  }
  done.emplace(key, true);
}

// Clusters of a row kernel resident on the device at once (cached per device, kernel and
// geometry). Zero when the device cannot place one such cluster: clusters_fit's fallback to the
// tiled kernels, or fitting_clusters' error.
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
  allow_cluster(kernel, plan);
  const RowLaunch launch(plan, plan.cluster, smem, nullptr);
  int clusters = 0;
  const cudaError_t status = cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config);
  if (status != cudaSuccess && plan.cluster > kRowPortableCluster) {
    (void)cudaGetLastError();  // a cluster size this device does not launch: none fits
    clusters = 0;
  } else {
    C10_CUDA_CHECK(status);
  }
  cache.emplace(key, clusters);
  return clusters;
}

// Whether the device places a cluster of the plan's row for every build a row of its H may take
// (`build(layout)` for each of `layouts`, with `smem_of(layout)` bytes; same-phase and realigned
// where their stage or class areas fit a block, smem_fits): portable clusters (up to kRowPortableCluster CTAs) always;
// larger ones where cudaOccupancyMaxActiveClusters finds room for each (an H200 does for 16).
// Otherwise the launcher takes the tiled kernels, for every layout of the row alike, so that a
// misaligned view keeps the aligned rows' kernel family, and so their bits.
template <typename Build, typename SmemOf>
bool clusters_fit(const RowPlan& plan, const RowLayouts& layouts, const Build& build, const SmemOf& smem_of) {
  if (plan.cluster <= kRowPortableCluster) return true;
  for (const RowBuild layout : layouts) {
    const size_t smem = smem_of(layout);
    const auto kernel = build(layout);
    if ((layout == RowBuild::kSamePhase || layout == RowBuild::kRealigned) && !smem_fits(kernel, smem)) continue;
    allow_smem(kernel, smem);
    if (resident_clusters(kernel, plan, smem) == 0) return false;
  }
  return true;
}

// resident_clusters, with an error naming the geometry when the device cannot place one cluster.
template <typename Kernel>
int64_t fitting_clusters(Kernel kernel, const RowPlan& plan, size_t smem) {
  const int64_t resident = resident_clusters(kernel, plan, smem);
  TORCH_CHECK(resident > 0, "polynorm: this device cannot run a cluster of ", num(plan.cluster), " blocks of ",
              num(plan.threads), " threads (rows of ", num(plan.cluster * plan.G), " threads)");
  return resident;
}

// The most blocks a grid's x dimension holds.
constexpr int64_t kMaxGridBlocks = 2147483647;

// A row plan's row groups for M rows: its blocks of R = threads / G rows (one a cluster).
inline int64_t row_groups(const RowPlan& plan, int64_t M) {
  const int64_t R = plan.threads / plan.G;
  return (M + R - 1) / R;
}

// `waves`: 1, a persistent grid (as many blocks, or clusters, as are resident at once, each
// walking rows gridDim apart); 0, a block per R rows (a cluster per row), scheduled by the
// hardware. Blocks, a multiple of plan.cluster. M sets the grid, never a row's reduction.
template <typename Kernel>
int64_t row_grid(Kernel kernel, const RowPlan& plan, int64_t M, size_t smem, int waves) {
  const int64_t row_blocks = row_groups(plan, M);
  if (plan.cluster > 1) {
    const int64_t resident = fitting_clusters(kernel, plan, smem);
    const int64_t clusters = waves == 0 ? row_blocks : std::min<int64_t>(row_blocks, waves * resident);
    return std::max<int64_t>(1, clusters) * plan.cluster;
  }
  if (waves == 0) return std::max<int64_t>(1, row_blocks);
  return std::max<int64_t>(1, std::min<int64_t>(row_blocks, waves * resident_blocks(kernel, plan.threads, smem)));
}

// The row kernels hold a row's slot packs and nothing more (a row's one element past them is its
// last lane's `extra`; the tail builds' 2 to kVec - 1, launch_plan.h row_tail_plan): a launch whose
// lanes hold fewer would drop part of the row.
void check_slots(const RowPlan& row, int packs, int64_t H, size_t elem_size, int tail = 0) {
  const int64_t held = int64_t(row.G) * row.cluster * packs;
  const bool ok = tail > 0 ? H - held * int64_t(16 / elem_size) == tail && tail < int64_t(16 / elem_size)
                           : held >= slot_packs(H, static_cast<int>(elem_size));
  TORCH_INTERNAL_ASSERT(ok, "polynorm: a row launch of ", num(row.G), " x ", num(row.cluster), " threads, ", num(packs),
                        " packs each, for a row of ", num(H), " elements (tail ", num(int64_t{tail}), ")");
}

// The staggered start of a row grid of `grid` blocks for M rows (stagger_start, reduce.cuh): a
// persistent grid (waves 1) staggers all its clusters, by the rounds of rows they take
// (launch_plan.h, row_stagger_cycles); a grid of a block per R rows (waves 0) its first wave, the
// clusters resident at its start, by the waves it holds and, for the forward, its blocks' threads
// (row_wave_stagger_cycles). `kernel` and `smem`: the build that sizes the grid.
template <typename Kernel>
RowStagger row_stagger(Kernel kernel, const RowPlan& plan, int64_t M, int64_t grid, size_t smem, int waves,
                       bool backward) {
  const int64_t clusters = std::max<int64_t>(1, grid / plan.cluster);
  const int64_t wave = waves > 0 ? clusters
                       : std::min<int64_t>(clusters, plan.cluster > 1 ? resident_clusters(kernel, plan, smem)
                                                                      : resident_blocks(kernel, plan.threads, smem));
  const int cycles = waves > 0 ? row_stagger_cycles((row_groups(plan, M) + clusters - 1) / clusters)
                               : row_wave_stagger_cycles(clusters, wave, plan.threads, backward);
  return RowStagger{cycles, static_cast<int>(std::min<int64_t>(wave, INT32_MAX))};
}

// Launches a row kernel: plainly, or as clusters (cudaLaunchKernelEx). The kernel's dynamic
// shared-memory limit is raised by the caller (allow_smem), before it sizes the grid.
template <typename... Params, typename... Args>
void launch_row_kernel(void (*kernel)(Params...), const RowPlan& plan, int64_t grid, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  if (plan.cluster == 1) {
    kernel<<<static_cast<unsigned>(grid), plan.threads, smem, stream>>>(std::forward<Args>(args)...);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  allow_cluster(kernel, plan);  // the grid may have been sized by another build (launch_backward_row)
  const RowLaunch launch(plan, grid, smem, stream);
  C10_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, std::forward<Args>(args)...));
}

// ---- The grouped ops' arguments ----------------------------------------------------------------

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

// The kernel's weight and bias: (3,) and (1,), or, grouped, [E, 3] and [E] / [E, 1], whose ParamRef
// steps between w0, w1, w2 (GroupArgs steps between experts).
ParamRef weight_ref(const at::Tensor& weight, const GroupTensors* groups) {
  return groups != nullptr ? ParamRef{weight.const_data_ptr(), weight.stride(1), weight.scalar_type()}
                           : param_ref(weight);
}
ParamRef bias_ref(const at::Tensor& bias, const GroupTensors* groups) {
  return groups != nullptr ? ParamRef{bias.const_data_ptr(), 0, bias.scalar_type()} : param_ref(bias);
}

// The kernels keep a row's expert in 32 bits (one register): E < 2^31, far beyond any model.
void check_experts_fit(const char* op, const at::Tensor& weight) {
  TORCH_CHECK(weight.size(0) <= std::numeric_limits<int32_t>::max(), op, ": expected at most ",
              num(std::numeric_limits<int32_t>::max()), " experts, got ", num(weight.size(0)));
}

}  // namespace
}  // namespace polynorm
