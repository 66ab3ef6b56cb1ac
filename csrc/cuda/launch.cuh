// CUDA kernels for polynorm::forward and backward, for the fused PolyNorm x mul
// (mul_forward, mul_backward) and for the grouped PolyNorm of mixture-of-experts layers
// (grouped_forward, grouped_backward). This file is the host side (the launch plan of each
// call, grids, launchers, launch_forward and launch_backward), included by polynorm_cuda.cu
// (PolyNorm, grouped) and polynorm_mul_cuda.cu (the fused op), which compile in parallel. The
// fused op is the same kernels with kMul = true (see MulArgs); the grouped ops are the row and
// tiled kernels with a per-row expert, a build flag of the row kernels (see GroupArgs).
//
// Where the rest lives (csrc/cuda/, each header includes what it uses):
// - launch_plan.h (csrc/): the table of which kernel serves which (op, H, dtype), and why;
// - forward.cuh, backward.cuh: the kernels, tiled then row;
// - packs.cuh: 16-byte packs, loads and stores, the row kernels' lane layout and realignment;
// - reduce.cuh: the reductions (tiled group, row, cluster) and the dW/dB partials' sums;
// - args.cuh: the fused op's and the grouped ops' kernel arguments (MulArgs, GroupArgs).
//
// Two kernel families, chosen by H, the dtype and whether the device launches clusters alone
// (so a row's bits never depend on its batch or on M):
// - Row kernels (poly_norm_{fwd,bwd}_row_kernel): a row held in registers by G threads, read
//   from device memory once; see "Row kernels (v5, v8)" in packs.cuh. A row longer than one
//   CTA takes (the table in launch_plan.h: past 256 threads for the wide builds; past 512
//   for the narrow forward; and backward rows of 192 or 256 threads) is split over a
//   thread-block cluster of up to 16 CTAs (of 128 threads where that holds no more threads) that
//   add their sums through distributed shared memory and mbarriers (sm_90 and later; bf16:
//   H <= 524288 forward, 262144 backward). Almost every model runs here.
// - Tiled kernels (poly_norm_{fwd,bwd}_tiled_kernel): any longer row (on devices without
//   clusters, any row past one CTA: 256 threads wide, 1024 narrow; on a device that cannot
//   place a row's cluster of more than 8 CTAs, that row: clusters_fit), walked twice when it
//   exceeds the registers of a 1024-thread group.
// Common to both:
// - Every warp access is 512 contiguous bytes (row kernels: a warp segment's lanes; tiled:
//   lane t of G owns packs t, t + G, ...); each per-thread sum runs over its packs in order
//   and the reduction has a fixed shape, set by the launch plan: results are bitwise the same
//   whatever the batch, the alignment of the row, or the run.
// - All accumulation is in at::opmath_type (fp32, or fp64 for fp64 inputs); offsets are
//   64-bit; dW and dB come from per-block partials that the backward's last block sums in a
//   fixed order set by the grid and block sizes (finish_param_grads): one launch, and the
//   same bits on every run; or, on large row launches, a one-block kernel of their own after
//   the row kernel does (param_sum_kernel; launch_plan.h, row_sum_apart)
//   (grouped: per-row terms, summed per expert by a second kernel, grouped_param_sums).
// bench/NOTES.md records each version's prediction and measured outcome.
#pragma once

#include "backward.cuh"
#include "forward.cuh"
#include "launch_plan.h"
#include "polynorm.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

namespace polynorm {
namespace {

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
// as many blocks as fit at once (their register use caps it: 64-128 a thread), each walking
// rows gridDim apart. Only H and the dtype choose G, the
// tree of the reduction; M only sets the grid, which no row's bits depend on.
// The builds of each row kernel (launch_plan.h, row_packs, says which rows take which):
// - wide (every row but those of the narrow builds): aligned rows; realigned ones (rows of odd
//   H in tensors whose rows start unlike: one phase a row); pack-realigned ones (a view of whole
//   packs that starts off a 16-byte boundary beside aligned outputs; the forward's fallback where
//   the stage does not fit); same-phase rows (odd H in contiguous tensors). Blocks of up to 256
//   threads, up to 128 registers a thread. Builds of one pack fewer for half-idle odd rows
//   (row_packs): the backward's 7 packs, the fused forward's 7, the 4- and 8-byte forward's 15.
// - narrow (PolyNorm's forward of 2-byte rows not of whole packs; the fused forward's 4-pack
//   rows): realigned, pack-realigned or same-phase rows, in blocks of up to 256 threads (80
//   registers) or, kLarge (PolyNorm's 8 packs), 1024 (64 registers); the 7-pack build holds rows
//   of at most 256 threads (row_packs), so it has no 1024-thread build, nor has the fused 4-pack
//   build. Rows of whole packs on a narrow build (the fused 4-pack rows) take its pack-realigned
//   build, realigning nothing where they are aligned.
// The realigning and same-phase builds of up to 256 threads come twice (not the grouped ones, one
// build each): for rows of 32 lanes or more (kWholeWarps, packs.cuh row_lane: W = 32 at compile
// time) and for shorter rows (packs.cuh short_rows: no cross-warp sum, no cluster); a
// 1024-thread block's rows are always of whole warps. The aligned builds keep one build for every
// row: with W fixed, ptxas moved some of the aligned backward's row loads past the first wait
// (bench/sass_load_order.py), and it ran up to 1.3 of an add (bench/NOTES.md v25).
template <template <int, int, bool> class Build, bool kWide, bool kLarge = !kWide>
auto row_kernel(const RowPlan& plan, int layout) {
  const bool small = plan.threads <= 256;
  const bool warps = int64_t(plan.G) * plan.cluster >= 32;
  // A row of fewer than 32 lanes is one CTA (launch_plan.h, row_plan): the short-row build has no
  // cluster code, and a 1024-thread block holds rows of more than 256 lanes.
  TORCH_INTERNAL_ASSERT(warps || (plan.cluster == 1 && small), "polynorm: a row of ", num(plan.G),
                        " threads in clusters of ", num(plan.cluster), " and blocks of ", num(plan.threads));
  const auto misaligned = [&](auto layout_c) {
    constexpr int kLayout = decltype(layout_c)::value;
    if constexpr (!kWide && kLarge) {
      if (!small) return Build<kLayout, kRowMaxThreads, true>::get();
    }
    return warps ? Build<kLayout, 256, true>::get() : Build<kLayout, 256, false>::get();
  };
  using SamePhase = std::integral_constant<int, kSamePhase>;
  using Realigned = std::integral_constant<int, kRealigned>;
  using PackRealigned = std::integral_constant<int, kPackRealigned>;
  if constexpr (kWide || !kLarge) {
    TORCH_INTERNAL_ASSERT(small, "polynorm: a row build of at most 256 threads launched with ", num(plan.threads),
                          " threads");
    if constexpr (kWide) {
      if (layout == kAligned) return Build<kAligned, 256, false>::get();
    }
  }
  // The narrow builds have no aligned build: their aligned rows (the fused forward's 4-pack rows of
  // whole packs) take the pack-realigned build, which realigns nothing there (no stage).
  if (layout == kPackRealigned || layout == kAligned) return misaligned(PackRealigned{});
  return layout == kSamePhase ? misaligned(SamePhase{}) : misaligned(Realigned{});
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
// 16-byte chunks, row for row: the row kernels' same-phase path (the forward's stage, packs.cuh
// stage_row; the backward's class sums, backward.cuh class_sums).
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

// A forward row launch's dynamic shared memory: the same-phase and realigned builds' stage areas
// (packs.cuh, stage_row: one a warp and staged tensor), then the cluster slots. (The backward's: its
// launcher, the class areas of backward.cuh's class_sums.)
size_t row_smem_bytes(const RowPlan& plan, int layout, int staged, int packs, int sums, size_t acc_size) {
  const size_t stage = layout == kSamePhase || layout == kRealigned ? size_t(plan.threads / 32) * staged * stage_words(packs) * 4 : 0;
  return stage + cluster_slot_bytes(plan, sums, acc_size);
}

// Whether a block of `kernel` with `smem` bytes of dynamic shared memory fits the device's
// shared memory a block (its static shared memory included; cached per device and kernel). The
// same-phase stage does not always: sm_86 / sm_89 allow 99 KB a block, and the narrow 2-byte
// forward of 704 threads or more stages more (H = 43011 and up); such rows take the realigning
// build instead, whose bits are the same.
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

// Lets a kernel take `smem` bytes of dynamic shared memory, once a device, kernel and size:
// past 48 KB with its static shared memory a launch fails without it (the fused backward's
// same-phase build at H = 5125 took 46 KB of stage areas beside its static shared memory, before
// its class sums; the narrow forward's stage still passes 48 KB from 448 threads).
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
// longest rows, and tunings), once a device and kernel. A device that refuses leaves the kernel
// without it; resident_clusters then finds no room, and clusters_fit sends the row to the tiled
// kernels.
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
// geometry); clusters of more than kRowPortableCluster CTAs (not portable) are allowed for the
// kernel first. Zero when the device cannot place one such cluster: clusters_fit's fallback to
// the tiled kernels, or fitting_clusters' error.
template <typename Kernel>
int64_t resident_clusters(Kernel kernel, const RowPlan& plan, size_t smem) {
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  using Key = std::tuple<int, const void*, int, int, size_t, int>;
  static std::mutex mutex;
  static std::map<Key, int64_t> cache;
  const Key key{device, reinterpret_cast<const void*>(kernel), plan.threads, plan.cluster, smem,
                row_cluster_policy(plan.cluster)};
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

// Whether the device places a cluster of the plan's row for every build a row of the op may take
// (`build(layout)`, with `smem_of(layout)` bytes: aligned, pack-realigned, and same-phase and
// realigned where their stage or class areas fit a block, smem_fits; else such rows take the
// pack-realigned build): portable clusters (up
// to kRowPortableCluster CTAs) always; larger ones where cudaOccupancyMaxActiveClusters finds
// room for each (an H200 does for 16). Otherwise the launcher takes the tiled kernels, for every
// layout of the row alike, so that a misaligned view keeps the aligned rows' kernel family, and
// so their bits.
template <typename Build, typename SmemOf>
bool clusters_fit(const RowPlan& plan, const Build& build, const SmemOf& smem_of) {
  if (plan.cluster <= kRowPortableCluster) return true;
  for (const int layout : {kAligned, kRealigned, kSamePhase, kPackRealigned}) {
    const auto kernel = build(layout);
    const size_t smem = smem_of(layout);
    if ((layout == kSamePhase || layout == kRealigned) && !smem_fits(kernel, smem)) continue;
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
              num(plan.threads), " threads (rows of ", num(plan.cluster * plan.G),
              " threads); _tune_rows sets smaller clusters");
  return resident;
}

// The most blocks a grid's x dimension holds.
constexpr int64_t kMaxGridBlocks = 2147483647;

// A row plan's row groups for M rows: its blocks of R = threads / G rows (one a cluster).
inline int64_t row_groups(const RowPlan& plan, int64_t M) {
  const int64_t R = plan.threads / plan.G;
  return (M + R - 1) / R;
}

// `waves`: at most this many blocks (clusters) per resident slot (1: a persistent grid); 0:
// a block per R rows (a cluster per row), scheduled by the hardware. Blocks, a multiple of
// plan.cluster.
template <typename Kernel>
int64_t row_grid(Kernel kernel, const RowPlan& plan, int64_t M, size_t smem, int waves = 1) {
  const int64_t row_blocks = row_groups(plan, M);
  if (plan.cluster > 1) {
    const int64_t resident = fitting_clusters(kernel, plan, smem);
    const int64_t clusters = waves == 0 ? row_blocks : std::min<int64_t>(row_blocks, waves * resident);
    return std::max<int64_t>(1, clusters) * plan.cluster;
  }
  if (waves == 0) return std::max<int64_t>(1, row_blocks);
  return std::max<int64_t>(1, std::min<int64_t>(row_blocks, waves * resident_blocks(kernel, plan.threads, smem)));
}

// The row kernels hold a row's slot packs and nothing more (a row's one element past them is
// its last lane's `extra`; the tail builds' 2 to kVec - 1, `tail`, launch_plan.h row_tail_plan): a
// launch whose lanes hold fewer would drop part of the row.
void check_slots(const RowPlan& row, int packs, int64_t H, size_t elem_size, int tail = 0) {
  const int64_t held = int64_t(row.G) * row.cluster * packs;
  const bool ok = tail > 0 ? H - held * int64_t(16 / elem_size) == tail && tail < int64_t(16 / elem_size)
                           : held >= slot_packs(H, static_cast<int>(elem_size));
  TORCH_INTERNAL_ASSERT(ok, "polynorm: a row launch of ", num(row.G), " x ", num(row.cluster), " threads, ", num(packs),
                        " packs each, for a row of ", num(H), " elements (tail ", num(int64_t{tail}), ")");
}

// The staggered start of a row grid of `grid` blocks for M rows (stagger_start, reduce.cuh): a
// persistent grid (waves > 0) staggers all its clusters, by the rounds of rows they take
// (launch_plan.h, row_stagger_cycles); a grid of a block per R rows (waves 0) its first wave, the
// clusters resident at its start, by the waves it holds and, for the forward, its blocks' threads
// (row_wave_stagger_cycles). `kernel` and `smem`: the build that sizes the grid. _tune_rows(stagger=)
// sets the cycles of either (the grouped builds take the argument and ignore it).
template <typename Kernel>
RowStagger row_stagger(Kernel kernel, const RowPlan& plan, int64_t M, int64_t grid, size_t smem, int waves,
                       bool backward) {
  const int64_t clusters = std::max<int64_t>(1, grid / plan.cluster);
  const int64_t wave = waves > 0 ? clusters
                       : std::min<int64_t>(clusters, plan.cluster > 1 ? resident_clusters(kernel, plan, smem)
                                                                      : resident_blocks(kernel, plan.threads, smem));
  const int tuned = row_tuning().stagger;
  const int cycles = tuned >= 0 ? tuned
                     : waves > 0 ? row_stagger_cycles((row_groups(plan, M) + clusters - 1) / clusters)
                                 : row_wave_stagger_cycles(clusters, wave, plan.threads, backward);
  return RowStagger{cycles, static_cast<int>(std::min<int64_t>(wave, INT32_MAX))};
}

// Launches a row kernel: plainly, or as clusters (cudaLaunchKernelEx) with its slots.
template <typename... Params, typename... Args>
void launch_row_kernel(void (*kernel)(Params...), const RowPlan& plan, int64_t grid, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  // The kernel's dynamic shared-memory limit: raised by the caller (allow_smem), before it sizes the grid.
  if (plan.cluster == 1) {
    kernel<<<static_cast<unsigned>(grid), plan.threads, smem, stream>>>(std::forward<Args>(args)...);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  allow_cluster(kernel, plan);  // the grid may have been sized by another build (launch_backward_row)
  const RowLaunch launch(plan, grid, smem, stream);
  C10_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, std::forward<Args>(args)...));
}

// The row kernel's forward launch for kPacks packs a thread. The grid: below; `_tune_rows`
// overrides it.
template <typename scalar_t, int kPacks, bool kMul>
struct FwdRowBuild {
  template <int kLayout, int kMaxThreads, bool kWholeWarps>
  struct Of {
    static auto get() { return &poly_norm_fwd_row_kernel<scalar_t, kPacks, kLayout, kMaxThreads, kMul, false, kWholeWarps>; }
  };
  template <int kLayout, int kMaxThreads, bool kWholeWarps>  // one build for every row (kWholeWarps false)
  struct Grouped {
    static auto get() { return &poly_norm_fwd_row_kernel<scalar_t, kPacks, kLayout, kMaxThreads, false, true, false>; }
  };
};

// False, launching nothing, where the device cannot place the row's cluster (clusters_fit).
template <typename scalar_t, int kPacks, bool kMul>
bool launch_forward_row(const LaunchPlan& lp, bool x_vec_ok, bool y_vec_ok, const scalar_t* x_ptr, int64_t x_stride,
                        scalar_t* y_ptr, at::opmath_type<scalar_t>* rstd, ParamRef weight, ParamRef bias,
                        const MulArgs<scalar_t>& mul, const GroupArgs<at::opmath_type<scalar_t>>& grouping, int64_t M,
                        int64_t H, double eps, cudaStream_t stream) {
  const RowTuning tuning = row_tuning();
  const RowPlan& row = lp.row;
  check_slots(row, kPacks, H, sizeof(scalar_t));
  // A misaligned mul takes a realigning build too (no element-wise loads).
  const bool realign = !x_vec_ok || !y_vec_ok || (kMul && !mul.vec_ok);
  bool same_phase = realign && tuning.same_phase && same_phase_rows(x_ptr, x_stride, y_ptr, H);
  if constexpr (kMul) same_phase = same_phase && same_phase_rows(x_ptr, x_stride, mul.mul, mul.row_stride);
  // Misaligned x (or mul) beside a y of whole aligned packs (y is a new tensor: every such row)
  // takes the pack-realigned build: the inputs realigned to packs, summed and stored as the
  // aligned build does. Other misaligned rows: same-phase, else one phase a row (realigned).
  int layout = !realign ? kAligned : same_phase ? kSamePhase : y_vec_ok ? kPackRealigned : kRealigned;
  const bool grouped = !kMul && grouping.offsets.ptr != nullptr;  // the grouped builds (kGrouped)
  constexpr bool kWide = wide_build(false, kMul, kPacks);
  constexpr bool kLarge = !kWide && kPacks == kRowFwdPacks / 2;  // the 8-pack narrow build: CTAs of up to 1024
  const auto build = [&](int l) {
    auto k = row_kernel<FwdRowBuild<scalar_t, kPacks, kMul>::template Of, kWide, kLarge>(row, l);
    if constexpr (!kMul) {
      if (grouped) k = row_kernel<FwdRowBuild<scalar_t, kPacks, kMul>::template Grouped, kWide, kLarge>(row, l);
    }
    return k;
  };
  const auto smem_of = [&](int l) { return row_smem_bytes(row, l, 1, kPacks, 3, sizeof(at::opmath_type<scalar_t>)); };
  if (!clusters_fit(row, build, smem_of)) return false;
  // The stage (the same-phase and realigned builds) does not always fit (row_smem_bytes): the
  // pack-realigned build serves those rows, with the same bits.
  if ((layout == kSamePhase || layout == kRealigned) && !smem_fits(build(layout), smem_of(layout))) {
    layout = kPackRealigned;
  }
  auto kernel = build(layout);
  // The realigned build's phase (forward.cuh): x's rows' or y's (launch_plan.h, realign_phase);
  // the flags say which tensors are realigned into or out of it (mul's: `margs.vec_ok`). The
  // kernel takes x's phase unless x's flag is set, so the host's choice and the kernel's agree:
  // same_phase_rows is an equivalence relation (the rows' offsets into their chunks and their
  // strides mod 16, compared), so a tensor unflagged against the reference shares every row's
  // phase with it.
  bool x_flag = !x_vec_ok, y_flag = !y_vec_ok;
  MulArgs<scalar_t> margs = mul;
  if (layout == kRealigned) {
    const auto off = [&](const scalar_t* a, int64_t a_stride, const scalar_t* b, int64_t b_stride) {
      return !same_phase_rows(a, a_stride, b, b_stride);
    };
    const int classes[3] = {0, off(y_ptr, H, x_ptr, x_stride) ? 1 : 0,
                            !kMul                                                ? 0
                            : !off(mul.mul, mul.row_stride, x_ptr, x_stride)     ? 0
                            : !off(mul.mul, mul.row_stride, y_ptr, H)            ? 1
                                                                                  : 2};
    const bool y_ref = realign_phase(false, kMul, classes) == 1;
    const scalar_t* ref = y_ref ? y_ptr : x_ptr;
    const int64_t ref_stride = y_ref ? H : x_stride;
    x_flag = off(x_ptr, x_stride, ref, ref_stride);
    y_flag = off(y_ptr, H, ref, ref_stride);
    if constexpr (kMul) margs.vec_ok = !off(mul.mul, mul.row_stride, ref, ref_stride);
  }
  // The grid: a block per R rows for rows of one CTA (wide builds, tune_rows: 1.05-1.07 of a
  // copy at H = 2048-16384 against 1.11-1.15 persistent, bench/NOTES.md v8, and 1.12-1.19
  // persistent however staggered, v19; narrow ones: 6-9% faster, v5), persistent for rows of
  // clusters (131072 bf16: 1.29 against 1.37; the fused op at 32768-131072: 10-15%, v6) and for
  // the fused op's rows of one CTA past 128 threads (v19, h200-2026-12-02f/call2, bf16 at M·H =
  // 2^26, over its floor: 12288 / 16384 1.206 / 1.115 -> 1.127 / 1.089; at 8192, 128 threads,
  // 1.058 on a block per row against 1.077).
  const bool persistent = row.cluster > 1 || (kMul && row.G > kRowMinThreads);
  const int waves = tuning.grid_waves >= 0 ? tuning.grid_waves : (persistent ? 1 : 0);
  const size_t smem = smem_of(layout);
  allow_smem(kernel, smem);
  const int64_t grid = row_grid(kernel, row, M, smem, waves);
  launch_row_kernel(kernel, row, grid, smem, stream, x_ptr, x_stride, x_flag, y_ptr, y_flag, rstd,
                    weight, bias, margs, grouping, M, H, eps, row.G, row.cluster,
                    row_stagger(kernel, row, M, grid, smem, waves, false));
  return true;
}

// The row backward's partials summed apart (ParamGrads::apart; reduce.cuh, param_sum_kernel):
// one block, launched after the row kernel on its stream; on sm_90 as a programmatic dependent
// launch, placed once the row kernel's blocks have left their rows (allow_param_sum) and waiting
// there for the row kernel to complete: its launch overlaps the row kernel's last blocks. Only
// where the kernel's code has that wait: a build without sm_90 code (PTX of an older arch, JIT
// compiled on an H200) compiles griddepcontrol out, and then stream order alone orders the two.
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
  config.numAttrs = device_launches_clusters() && param_sum_waits<acc_t>() ? 1 : 0;  // sm_90 code on sm_90
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, &param_sum_kernel<acc_t>, pg, blocks));
}

// The row kernel's backward launch for kPacks packs a thread; allocates the partials (not
// for a grouped launch, whose rows write their terms to grouping.row_terms instead).
template <typename scalar_t, int kPacks, bool kMul>
struct BwdRowBuild {
  template <int kLayout, int kMaxThreads, bool kWholeWarps>
  struct Of {
    static auto get() { return &poly_norm_bwd_row_kernel<scalar_t, kPacks, kLayout, kMaxThreads, kMul, false, kWholeWarps>; }
  };
  template <int kLayout, int kMaxThreads, bool kWholeWarps>  // one build for every row (kWholeWarps false)
  struct Grouped {
    static auto get() { return &poly_norm_bwd_row_kernel<scalar_t, kPacks, kLayout, kMaxThreads, false, true, false>; }
  };
};

// False, launching nothing, where the device cannot place the row's cluster (clusters_fit).
template <typename scalar_t, int kPacks, bool kMul>
bool launch_backward_row(const LaunchPlan& lp, bool g_vec_ok, bool x_vec_ok, bool dx_vec_ok, const scalar_t* g_ptr,
                         int64_t g_stride, const scalar_t* x_ptr, int64_t x_stride,
                         const at::opmath_type<scalar_t>* rstd, ParamRef weight, scalar_t* dx_ptr,
                         ParamGrads<at::opmath_type<scalar_t>> pg, at::Tensor& partials, const at::Tensor& acc_like,
                         const MulArgs<scalar_t>& mul, const GroupArgs<at::opmath_type<scalar_t>>& grouping,
                         int64_t M, int64_t H, cudaStream_t stream) {
  const RowPlan& row = lp.row;
  check_slots(row, kPacks, H, sizeof(scalar_t), lp.tail);
  const bool realign = !x_vec_ok || !g_vec_ok || !dx_vec_ok || (kMul && (!mul.vec_ok || !mul.grad_vec_ok));
  bool same_phase = realign && row_tuning().same_phase && same_phase_rows(x_ptr, x_stride, g_ptr, g_stride) &&
                    same_phase_rows(x_ptr, x_stride, dx_ptr, H);
  if constexpr (kMul) {
    same_phase = same_phase && same_phase_rows(x_ptr, x_stride, mul.mul, mul.row_stride) &&
                 same_phase_rows(x_ptr, x_stride, mul.grad_mul, H);
  }
  // Misaligned rows of whole packs beside aligned outputs (grad_x and grad_mul are new tensors, so
  // every such row) take the pack-realigned build: the inputs realigned to packs, summed as the
  // aligned build sums them (packs.cuh, RowLayout). Other misaligned rows: same-phase or realigned.
  const bool to_packs = dx_vec_ok && (!kMul || mul.grad_vec_ok);
  int layout = !realign ? kAligned : same_phase ? kSamePhase : to_packs ? kPackRealigned : kRealigned;
  const bool grouped = !kMul && grouping.offsets.ptr != nullptr;  // the grouped builds (kGrouped)
  constexpr bool kWide = wide_build(true, kMul, kPacks);
  const auto build = [&](int l) {
    auto k = row_kernel<BwdRowBuild<scalar_t, kPacks, kMul>::template Of, kWide>(row, l);
    if constexpr (!kMul) {
      if (grouped) k = row_kernel<BwdRowBuild<scalar_t, kPacks, kMul>::template Grouped, kWide>(row, l);
    }
    return k;
  };
  // The same-phase and realigned builds' class areas (backward.cuh, class_sums), the cluster slots:
  // at most 32 KB (a CTA of 256 threads of a 2-byte dtype; fp32 and fp64 16) and 8 KB, which every
  // device gives a block.
  const auto smem_of = [&](int l) {
    return (l == kSamePhase || l == kRealigned ? size_t(row.threads / 32) * bwd_class_area_bytes<scalar_t>() : 0) +
           cluster_slot_bytes(row, 4, sizeof(at::opmath_type<scalar_t>));
  };
  auto kernel = build(layout);
  TORCH_INTERNAL_ASSERT(smem_fits(kernel, smem_of(layout)), "polynorm: a backward row block's ", num(smem_of(layout)),
                        " bytes of shared memory do not fit");
  // The fused op's aligned rows of clusters staged a row ahead (launch_plan.h, row_staged; backward.cuh,
  // kAlignedStaged): the same packs and sums, so the same bits; a misaligned view of such rows takes its
  // realigning build as before.
  size_t stage_bytes = 0;
  if constexpr (kMul && kPacks == kRowMulBwdPacks && sizeof(scalar_t) <= 4) {
    if (lp.staged && layout == kAligned) {
      TORCH_INTERNAL_ASSERT(row.cluster > 1 && row.threads == kStageThreads &&
                                int64_t(row.G) * row.cluster * kPacks == slot_packs(H, sizeof(scalar_t)),
                            "polynorm: a staged row of ", num(row.cluster), " x ", num(row.threads), " threads for H = ",
                            num(H));
      kernel = &poly_norm_bwd_row_kernel<scalar_t, kPacks, kAlignedStaged, kStageThreads, kMul, false, false>;
      stage_bytes = size_t(3) * kPacks * kStageThreads * sizeof(Pack);
    }
  }
  // The fused op's odd rows on fewer lanes with a wide tail (launch_plan.h, row_tail_plan; packs.cuh, row_tail): the
  // tail builds of the same-phase and realigned layouts (odd rows take no other), whole warps on CTAs of <= 256.
  TORCH_INTERNAL_ASSERT(lp.tail == 0 || (kMul && kPacks == kRowMulBwdPacks && sizeof(scalar_t) <= 4),
                        "polynorm: a tail row for a build without one");
  if constexpr (kMul && kPacks == kRowMulBwdPacks && sizeof(scalar_t) <= 4) {
    if (lp.tail > 0) {
      TORCH_INTERNAL_ASSERT((layout == kSamePhase || layout == kRealigned) && row.threads <= 256 &&
                                int64_t(row.G) * row.cluster >= 32,
                            "polynorm: a tail row of ", num(row.cluster), " x ", num(row.threads), " threads for H = ",
                            num(H));
      kernel = layout == kSamePhase ? &poly_norm_bwd_row_kernel<scalar_t, kPacks, kSamePhaseTail, 256, kMul, false, true>
                                    : &poly_norm_bwd_row_kernel<scalar_t, kPacks, kRealignedTail, 256, kMul, false, true>;
      TORCH_INTERNAL_ASSERT(smem_fits(kernel, smem_of(layout)), "polynorm: a backward tail row block's ",
                            num(smem_of(layout)), " bytes of shared memory do not fit");
    }
  }
  // The realigned build's phase (backward.cuh): that of x's, grad_y's or grad_x's rows, the one of
  // least realignment cost (launch_plan.h, realign_phase); the flags say which tensors are
  // realigned into or out of it (kMul: mul's and grad_mul's in `margs`' vec_ok and grad_vec_ok).
  // The kernel takes the first unflagged of x, grad_y and grad_x; it agrees with this choice
  // because same_phase_rows is an equivalence relation (rows' offsets into their chunks and their
  // strides mod 16, compared): a tensor unflagged against `ref` shares every row's phase with it.
  bool x_flag = !x_vec_ok, g_flag = !g_vec_ok, dx_flag = !dx_vec_ok;
  MulArgs<scalar_t> margs = mul;
  if (layout == kRealigned) {
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
  const size_t smem = cluster_slot_bytes(row, 4, sizeof(at::opmath_type<scalar_t>));
  // Persistent, or a block per R rows where the partials are summed apart (below; with the last
  // block's sum a block per row ran 1.5-1.7 of an add, bench/NOTES.md v8); the tuning may say otherwise.
  // The grid, and so the order in which dW and dB are summed, is sized by one build for every
  // layout of a row (the aligned build, queried for its occupancy only, never launched here),
  // so that a view's dW and dB are the aligned rows' bits whatever each build's occupancy. (Today
  // every wide build takes 126-128 registers, so on an H200 the grids would match anyway; were
  // the same-phase and realigned builds' class areas (2-4 KB a warp) ever to fit fewer blocks an SM than the
  // aligned build: a partial second wave, the same bits.)
  // A grouped launch sums no partials (its rows write their terms), but is sized by its own
  // aligned build all the same. The launched build must fit a cluster too (checked by name).
  static_assert(kWide, "the backward's row builds are all wide (launch_plan.h, row_packs)");
  auto sizing = row_kernel<BwdRowBuild<scalar_t, kPacks, kMul>::template Of, kWide>(row, kAligned);
  if constexpr (!kMul) {
    if (grouped) sizing = row_kernel<BwdRowBuild<scalar_t, kPacks, kMul>::template Grouped, kWide>(row, kAligned);
  }
  if (!clusters_fit(row, build, smem_of)) return false;
  // The launched build's smem adds the same-phase and realigned builds' class areas (the sizing build has none).
  const size_t launch_smem = smem_of(layout) + stage_bytes;
  allow_smem(kernel, launch_smem);
  if (row.cluster > 1 && kernel != sizing) fitting_clusters(kernel, row, launch_smem);
  // Who sums the dW / dB partials (launch_plan.h, row_sum_apart: by the rounds of rows of the
  // persistent grid), and the grid: persistent, but a block per R rows for PolyNorm's one-CTA
  // rows of whole packs that fill every lane's slots, whose partials are summed apart (a grid
  // that fits gridDim.x). By H and the dtype, not by the layout: a view's dW and dB are its
  // aligned rows' bits (a misaligned view of such rows then runs its realigned build on a block
  // per R rows: bf16 4096, 1.04 of its add against 0.98 persistent, bench/NOTES.md v19 call 4).
  const RowTuning tuning = row_tuning();
  const int64_t persistent = row_grid(sizing, row, M, smem, 1);
  const int64_t groups = row_groups(row, M);
  const int64_t rounds = (groups + persistent / row.cluster - 1) / (persistent / row.cluster);
  const bool apart = !grouped && (tuning.sum_apart >= 0 ? tuning.sum_apart > 0 : row_sum_apart(rounds));
  const bool full_lanes = whole_packs(H, sizeof(scalar_t)) &&
                          int64_t(row.G) * kPacks == slot_packs(H, static_cast<int>(sizeof(scalar_t)));
  const bool row_blocks = apart && !kMul && row.cluster == 1 && full_lanes && groups <= kMaxGridBlocks;
  const int waves = tuning.grid_waves >= 0 ? tuning.grid_waves : row_blocks ? 0 : 1;
  const int64_t blocks = waves == 1 ? persistent : row_grid(sizing, row, M, smem, waves);
  if (!grouped) {
    partials = at::empty({blocks, 4}, acc_like.options());
    pg.partials = partials.mutable_data_ptr<at::opmath_type<scalar_t>>();
    pg.apart = apart;
  }
  launch_row_kernel(kernel, row, blocks, launch_smem, stream, g_ptr, g_stride, g_flag, x_ptr, x_stride, x_flag, rstd,
                    weight, dx_ptr, dx_flag, pg, margs, grouping, M, H, row.G, row.cluster,
                    row_stagger(sizing, row, M, blocks, smem, waves, true));
  if (apart) launch_param_sum(pg, blocks, stream);
  return true;
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
      // The wide build (kPacks), or the narrow one (half, or one fewer) for 2-byte rows not of
      // whole packs (row_packs). False: the device cannot place the row's cluster (tiled below).
      auto launch = [&](auto packs) {
        return launch_forward_row<scalar_t, decltype(packs)::value, kMul>(
            lp, x_vec_ok, y_vec_ok, x_ptr, rows.row_stride, y_ptr, rstd.mutable_data_ptr<acc_t>(), w_ref, b_ref, mul,
            grouping, rows.M, rows.H, eps, stream);
      };
      const bool launched = [&] {
        // The narrow build (half the packs, or one fewer): PolyNorm's forward of 2-byte rows not
        // of whole packs.
        if constexpr (!kMul && sizeof(scalar_t) == 2) {
          if (lp.packs == kPacks / 2) return launch(std::integral_constant<int, kPacks / 2>{});
          if (lp.packs == kPacks / 2 - 1) return launch(std::integral_constant<int, kPacks / 2 - 1>{});
        } else {
          // One pack fewer on the wide build: every other op's and dtype's half-idle odd rows.
          if (lp.packs == kPacks - 1) return launch(std::integral_constant<int, kPacks - 1>{});
          // Half (narrow): the fused forward's rows of whole packs with a quarter of their slots
          // idle at the wide count (row_packs).
          if constexpr (kMul) {
            if (lp.packs == kPacks / 2) return launch(std::integral_constant<int, kPacks / 2>{});
          }
        }
        TORCH_INTERNAL_ASSERT(lp.packs == kPacks, "polynorm: no forward build of ", num(lp.packs), " packs");
        return launch(std::integral_constant<int, kPacks>{});
      }();
      if (launched) return;
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
      // False: the device cannot place the row's cluster (tiled below).
      auto launch = [&](auto packs) {
        return launch_backward_row<scalar_t, decltype(packs)::value, kMul>(
            lp, g_vec_ok, x_vec_ok, dx_vec_ok, g_ptr, g_rows.row_stride, x_ptr, x_rows.row_stride,
            rstd_c.const_data_ptr<acc_t>(), w_ref, dx_ptr, ParamGrads<acc_t>{nullptr, arrivals, dw_ptr, db_ptr},
            partials, acc_like, mul, grouping, x_rows.M, x_rows.H, stream);
      };
      const bool launched = [&] {
        // One pack fewer: half-idle odd rows (row_packs).
        if constexpr (!kMul) {
          if (lp.packs == kPacks - 1) return launch(std::integral_constant<int, kPacks - 1>{});
        }
        TORCH_INTERNAL_ASSERT(lp.packs == kPacks, "polynorm: no backward build of ", num(lp.packs), " packs");
        return launch(std::integral_constant<int, kPacks>{});
      }();
      if (launched) return;
    }
    const dim3 block(lp.tiled.G, lp.tiled.rows);
    blocks = (x_rows.M + block.y - 1) / block.y;
    poly_norm_bwd_tiled_kernel<scalar_t, kMul><<<static_cast<unsigned>(blocks), block, 0, stream>>>(
        g_ptr, g_rows.row_stride, g_vec_ok, x_ptr, x_rows.row_stride, x_vec_ok, rstd_c.const_data_ptr<acc_t>(),
        w_ref, dx_ptr, dx_vec_ok, param_grads(), mul, grouping, x_rows.M, x_rows.H);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace
}  // namespace polynorm
