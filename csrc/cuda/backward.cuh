// The backward kernels of PolyNorm, of the fused PolyNorm x mul (kMul) and of the grouped op
// (GroupArgs): the row kernel here (x and grad_y in registers, on one CTA or a thread-block
// cluster), the tiled kernel in backward_tiled.cuh; each writes dx and its block's dW/dB partial
// (grouped: per-row terms). Which serves which row: launch_plan.h; launched by
// launch_backward.cuh; the forward kernels: forward.cuh.
#pragma once

#include "args.cuh"
#include "backward_tiled.cuh"
#include "launch_plan.h"
#include "packs.cuh"
#include "polynorm_math.h"
#include "reduce.cuh"
#include "row_lanes.cuh"
#include "row_phase.cuh"

#include <ATen/OpMathType.h>

#include <cstdint>

namespace polynorm {
namespace {

// The staged build's stage (kAlignedStaged: the fused backward's aligned rows of clusters, their packs
// copied a row ahead; launch_plan.h, row_staged). A thread's stage (CTAs of kStageThreads threads
// (launch_plan.h's kRowStageThreads), rows of whole warps, so a lane's packs are base + 32 i): slot i of tensor t at stage[(t kPacks + i) kStageThreads + threadIdx.x], so that a warp's 16-byte
// reads and writes are consecutive and every slot's address a constant offset from the thread's first.
// stage_copies issues one cp.async a slot of a row into tensor t's slots (zero-filled past the row's packs:
// the table stages only rows whose every slot is in the row, launch_plan.h row_staged, so that is defensive);
// `after`, a zero computed from the registers last read from the stage, orders the copies after those reads.
// Each thread reads back only what it copied itself (cp.async.wait_group makes a thread's own copies visible
// to it): no barrier.
constexpr int kStageThreads = 256;  // = kRowStageThreads (launch_plan.h; static_assert in the row kernel)
template <typename scalar_t, int kPacks>
__device__ __forceinline__ void stage_copies(Pack* stage, int t, const scalar_t* row, int packs, const RowLane& rl,
                                             uint32_t after) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint64_t src = static_cast<uint64_t>(__cvta_generic_to_global(reinterpret_cast<const Pack*>(row) + rl.base));
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(stage + t * kPacks * kStageThreads + int(threadIdx.x))) + after;
  const int left = packs - rl.base;  // slot i is in the row: 32 i < left
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    // Past the row: no byte is read (src-size 0), the slot zero-filled.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst + uint32_t(i * kStageThreads * 16)),
                 "l"(src + uint64_t(i * 32 * 16)), "r"(32 * i < left ? 16 : 0)
                 : "memory");
  }
#endif
}
__device__ __forceinline__ void stage_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Tensor t's slots of this thread, once its copies have landed (stage_wait).
template <int kPacks>
__device__ __forceinline__ void stage_read(Pack (&buf)[kPacks], const Pack* stage, int t) {
#pragma unroll
  for (int i = 0; i < kPacks; ++i) buf[i] = stage[(t * kPacks + i) * kStageThreads + int(threadIdx.x)];
}
__device__ __forceinline__ void stage_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

// The row kernels' sums of a lane, in the class order: class k is element k of each of the lane's
// packs (slots 0, 1, ...), summed in slot order from zero; the lane's sums are classes 0, 1, ...
// added in turn. The aligned and pack-realigned builds sum their packs so. The same-phase and
// realigned builds hold chunks (in the row's phase: x's for the same-phase build): a row's chunks
// start p = shift / element size elements before its packs: element k of a lane's chunk is
// element k - p of its pack (k >= p), or, k < p, element k - p + kVec of the previous pack, the
// previous lane's (slot by slot; for a segment's first lane, the last lane's slot before, and
// its ext after the last slot). So a lane sums element k of its chunks, slot by slot, for every
// k (the same products, in the same slot order), writes the classes to its warp's area, and then
// reads, in its packs' class order, classes p .. kVec - 1 back from its own and classes 0 .. p - 1
// from the next lane's: the aligned row's bits, with no realignment of any pack (the stage that
// the forward keeps, row_phase.cuh). A segment's first lane leaves out slot 0's elements k < p
// (before the row, or the previous segment's, which that segment has in its ext) and adds its
// segment's ext (its last lane's, by a shuffle) after its last slot: elements k < p only.
// Zeros in place of a term leave a class sum as it was, but for its sign of zero (a class sum
// can be -0: t[2]'s fused multiply-add of a tiny negative product onto +0; a +0 term after it
// makes it +0). The lane's sums start at +0 and add the classes with plain adds, so they are
// never -0 and take the same bits either way: the aligned build's. (The fused op's zeroed terms
// select g = grad_out * mul after the product, the ext's too; nvcc 13 forms that product alike
// in every build, as a plain multiply. A compiler that fused `t[3] += grad_out * mul` in the
// aligned loop would break the ext term's dB bits: selecting the raw values before the product
// would be robust to that, with other compiled code.)
template <typename acc_t>
struct alignas(4 * sizeof(acc_t)) ClassSums {
  acc_t v[4];
};

// A warp's class area: [kVec classes][32 lanes] of four sums.
template <typename scalar_t>
__host__ __device__ constexpr int bwd_class_area_bytes() {
  return PackOf<scalar_t>::kVec * 32 * static_cast<int>(sizeof(ClassSums<at::opmath_type<scalar_t>>));
}

template <typename scalar_t, int kPacks, bool kMul, typename AddTo>
__device__ __forceinline__ void class_sums(at::opmath_type<scalar_t> (&s)[4], ClassSums<at::opmath_type<scalar_t>>* area,
                                           const Pack (&xb)[kPacks], const Pack (&gb)[kPacks],
                                           const Pack (&mb)[kMul ? kPacks : 1], const Pack& x_ext, const Pack& g_ext,
                                           const Pack& m_ext, int shift, const RowLane& rl, const AddTo& add_to) {
  using acc_t = at::opmath_type<scalar_t>;
  using P = PackOf<scalar_t>;
  constexpr int kVec = P::kVec;
  const int p = shift / static_cast<int>(sizeof(scalar_t));
  const bool first = rl.j == 0;
  // The segment's ext, from its last lane (every lane takes part).
  const Pack xe = shfl_pack(x_ext, rl.W - 1, rl.W);
  const Pack ge = shfl_pack(g_ext, rl.W - 1, rl.W);
  Pack me = xe;
  if constexpr (kMul) me = shfl_pack(m_ext, rl.W - 1, rl.W);
  const auto grad = [&](const Pack& gp, const Pack& mp, int k) {
    if constexpr (kMul) return P::value(gp, k) * P::value(mp, k);
    return P::value(gp, k);
  };
  const int lane = static_cast<int>(threadIdx.x) & 31;
  __syncwarp();  // every lane has read the warp's previous row from the area
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const bool before = first && k < p;  // slot 0's element k is not this lane's; ext's is
    acc_t c[4] = {acc_t(0), acc_t(0), acc_t(0), acc_t(0)};
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      acc_t v = P::value(xb[i], k), g = grad(gb[i], mb[kMul ? i : 0], k);
      if (i == 0 && before) v = g = acc_t(0);
      add_to(c, v, g);
    }
    add_to(c, before ? P::value(xe, k) : acc_t(0), before ? grad(ge, me, k) : acc_t(0));
    area[k * 32 + lane] = ClassSums<acc_t>{{c[0], c[1], c[2], c[3]}};
  }
  __syncwarp();  // every lane has written its classes
  const int next = lane - rl.j + ((rl.j + 1) & (rl.W - 1));
  // Shared addresses of class p + e of this lane and class p + e - kVec of the next: e * 32 entries on.
  const uint32_t own = static_cast<uint32_t>(__cvta_generic_to_shared(area + lane)) + p * 32 * sizeof(ClassSums<acc_t>);
  const uint32_t nxt = static_cast<uint32_t>(__cvta_generic_to_shared(area + next)) + (p - kVec) * 32 * sizeof(ClassSums<acc_t>);
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    ClassSums<acc_t> t;
    if constexpr (sizeof(acc_t) == 4) {
      const uint32_t addr = (p < kVec - e ? own : nxt) + e * 32 * sizeof(ClassSums<acc_t>);
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(t.v[0]), "=f"(t.v[1]), "=f"(t.v[2]), "=f"(t.v[3])
                   : "r"(addr)
                   : "memory");
    } else {
      const int k = e + p;
      t = area[k < kVec ? k * 32 + lane : (k - kVec) * 32 + next];
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) s[q] += t.v[q];
  }
}

// The row kernel: x and grad_y in registers; S_1, S_2, S_3 and G (MATH.md (4)) in one reduction,
// then dx (MATH.md (5)-(6); the fused op's g = grad_out * mul and grad_mul, MATH.md (9)-(10)); the
// block's share of [dw0, dw1, dw2, db] (MATH.md (7)) goes to partials.
template <typename scalar_t, int kPacks, int kBuild, int kMaxThreads, bool kMul, bool kGrouped, bool kWholeWarps>
__global__ void __launch_bounds__(kMaxThreads, row_min_blocks(kMaxThreads, (kMul ? 3 : 2) * kPacks,
                                                              kBuild != kAligned && kBuild != kAlignedStaged))
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
    ParamGrads<at::opmath_type<scalar_t>> param_grads,   // dW, dB: partials, then the last block's sum (or apart)
    MulArgs<scalar_t> mul,                               // kMul: grad_y = grad_out * mul; writes grad_mul
    GroupArgs<at::opmath_type<scalar_t>> grouping,       // grouped: a per-row expert; row terms, not param_grads
    int64_t M,
    int64_t H,
    int G,
    int C,                                               // CTAs a row (a cluster of C, R = 1), or 1
    RowStagger stagger) {                                // the start in quarters (reduce.cuh; grouped: unused)
  using acc_t = at::opmath_type<scalar_t>;
  using P = PackOf<scalar_t>;
  __shared__ __align__(16) acc_t red[2][kRowMaxThreads / 32][4];
  __shared__ acc_t group_part[kRowMinThreads][4];  // R <= kRowMinThreads
  // Dynamic: the same-phase and realigned builds' class areas (a warp's: bwd_class_area_bytes, class_sums),
  // then, C > 1, the cluster slots ([2][C G / 32][4]), then the staged build's stages.
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  // kAlignedStaged: the aligned build, its rows' packs through the threads' stages a row ahead (stage_copies;
  // launch_plan.h, row_staged): rows of clusters (R = 1, whole warps) on CTAs of kStageThreads.
  constexpr bool kStaged = kBuild == kAlignedStaged;
  static_assert(!kStaged || (kMaxThreads == kStageThreads && kStageThreads == kRowStageThreads && !kGrouped),
                "the staged build: CTAs of kRowStageThreads, not grouped");
  constexpr int kLayout = build_layout(kBuild);
  // The tail builds (row_lanes.cuh, row_tail): the row's 2 to kVec - 1 elements past its slots on its last lane.
  constexpr bool kWideTail = wide_tail_build(kBuild);
  constexpr bool kRealign = kLayout != kAligned;  // as in forward
  // The rows as chunks, summed in the class order through the class areas (class_sums): the
  // same-phase and realigned builds; the aligned and pack-realigned ones hold packs.
  constexpr bool kChunks = kLayout == kRealigned || kLayout == kSamePhase;
  constexpr bool kToPacks = kLayout == kPackRealigned;  // misaligned inputs realigned to packs (finish_row)
  // The realigned build works in one phase a row (row_phase.cuh, issue_row_at): x's rows', else
  // grad_y's, else grad_x's, the first whose flag is false (the host's choice: the flags are set
  // against it, and same_phase_rows is an equivalence, so the first unflagged tensor is in it); a
  // flag says that the tensor's rows are not in that phase, so that it is realigned into it (inputs) or out of it (outputs). kMul:
  // mul.vec_ok false, mul's rows realigned; mul.grad_vec_ok false, as grad_x's, grad_mul's
  // (launch_backward.cuh, launch_backward_row). The pack-realigned build: a flag says that the tensor's
  // rows are not 16-byte aligned (grad_x's and grad_mul's always are: no flag is read for them).
  const bool x_realign = (kLayout == kRealigned || kToPacks) && x_realign_arg;
  const bool g_realign = (kLayout == kRealigned || kToPacks) && g_realign_arg;
  const bool dx_realign = kLayout == kRealigned && dx_realign_arg;
  const bool m_realign = kMul && (kLayout == kRealigned || kToPacks) && !mul.vec_ok;
  constexpr bool same_phase = kLayout == kSamePhase;

  constexpr bool kShortRows = short_rows(kLayout, kWholeWarps, kGrouped);  // row_lanes.cuh
  const RowLane rl = row_lane<kPacks, kWholeWarps>(G, C);
  const RowBlock blk = row_block(G, C);
  const int R = blk.R;
  const int group = blk.group;
  const bool last_segment = (rl.lane >> rl.wlog) + 1 == (rl.G >> rl.wlog);
  const int64_t cluster_id = blockIdx.x >> blk.clog;  // as in forward
  const int64_t clusters = gridDim.x >> blk.clog;
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
  ClassSums<acc_t>* class_area =
      reinterpret_cast<ClassSums<acc_t>*>(dyn_smem + (threadIdx.x >> 5) * bwd_class_area_bytes<scalar_t>());
  unsigned char* cluster_slots = dyn_smem + (kChunks ? (blockDim.x >> 5) * bwd_class_area_bytes<scalar_t>() : 0);
  const int64_t step = clusters * R;
  Pack x_ext, g_ext;
  int parity = 0;
  __shared__ __align__(8) uint64_t cluster_bars[2];  // C > 1: cluster_row_reduce's mbarriers
  if constexpr (!kGrouped) stagger_start(cluster_id, stagger);
  ClusterStart started(C, cluster_bars);  // C > 1: arrived; waited on before the first store into a peer
  // kStaged (rows of clusters, R = 1): the stages after the cluster slots, [kMul ? 3 : 2][kPacks][kStageThreads] packs.
  Pack* stage = reinterpret_cast<Pack*>(cluster_slots + 2 * (rl.G / 32) * 4 * sizeof(acc_t));
  const int staged_packs = static_cast<int>((H + P::kVec - 1) / P::kVec);
  const auto stage_row = [&](int64_t at, uint32_t after) {
    stage_copies<scalar_t, kPacks>(stage, 0, x + at * x_row_stride, staged_packs, rl, after);
    stage_copies<scalar_t, kPacks>(stage, 1, grad_y + at * g_row_stride, staged_packs, rl, after);
    if constexpr (kMul) stage_copies<scalar_t, kPacks>(stage, 2, mul.mul + at * mul.row_stride, staged_packs, rl, after);
    stage_commit();
  };
  if constexpr (kStaged) {
    if (cluster_id * R < M) stage_row(cluster_id * R, 0u);
  }
  for (int64_t first = cluster_id * R; first < M; first += step, parity ^= 1) {
    const int64_t row = first + group;
    const bool active = row < M;
    const int64_t r = active ? row : 0;
    int expert = 0;  // E: none
    if (grouped) {
      // A row of 32 threads or more: every lane of the warp has it, so the warp votes (aligned
      // builds; the realigning ones keep the binary search: the vote's registers spill there).
      expert = !active                                ? E
               : kLayout == kAligned && rl.G >= 32 ? static_cast<int>(expert_of_warp(grouping.offsets, row))
                                                      : static_cast<int>(expert_of(grouping.offsets, row));
    }
    const bool owned = !grouped || expert < E;
    acc_t r3 = acc_t(0), r2 = acc_t(0), r1 = acc_t(0);
    const scalar_t* x_row = x + r * x_row_stride;
    const scalar_t* g_row = grad_y + r * g_row_stride;
    Pack xb[kPacks];
    Pack gb[kPacks];
    if (active && owned) {  // issued before the row's loads complete
      r3 = rstd[row * 3 + 0];
      r2 = rstd[row * 3 + 1];
      r1 = rstd[row * 3 + 2];
    }
    Pack mb_staged[kMul && kStaged ? kPacks : 1];  // kStaged: mul's packs, from the stage
    // Realigned build: the row's phase, each input's start (issue_row_at) and its chunk after ext.
    int phase = 0, x_start = 0, g_start = 0, m_start = 0;
    Pack x_ext2, g_ext2, m_ext2;
    if constexpr (kStaged) {
      // This row's packs from the stage, then the next row's copies into it, ordered after these reads by
      // a zero that ptxas cannot see through: (every word read) & (H >> 62).
      stage_wait();
      stage_read(xb, stage, 0);
      stage_read(gb, stage, 1);
      uint32_t bits = 0u;
#pragma unroll
      for (int i = 0; i < kPacks; ++i) bits |= xb[i].x | xb[i].y | xb[i].z | xb[i].w | gb[i].x | gb[i].y | gb[i].z | gb[i].w;
      if constexpr (kMul) {
        stage_read(mb_staged, stage, 2);
#pragma unroll
        for (int i = 0; i < kPacks; ++i) bits |= mb_staged[i].x | mb_staged[i].y | mb_staged[i].z | mb_staged[i].w;
      }
      if (first + step < M) stage_row(first + step, bits & static_cast<uint32_t>(H >> 62));
    } else if constexpr (same_phase && !kMul) {  // x's and grad_y's rows start alike (same_phase_rows): one shift, one test a slot
      issue_rows<scalar_t, kPacks, kGrouped>(xb, x_ext, x_row, gb, g_ext, g_row, owned ? H : 0, rl);
    } else if constexpr (kLayout == kRealigned) {
      const scalar_t* phase_row = !x_realign ? x_row : !g_realign ? g_row : grad_x + r * H;
      phase = static_cast<int>(reinterpret_cast<uintptr_t>(phase_row) & 15);
      x_start = issue_row_at<scalar_t, kPacks, kGrouped>(xb, x_ext, x_ext2, x_row, owned ? H : 0, rl, phase, x_realign);
      g_start = issue_row_at<scalar_t, kPacks, kGrouped>(gb, g_ext, g_ext2, g_row, owned ? H : 0, rl, phase, g_realign);
    } else if constexpr (!same_phase) {
      issue_row<scalar_t, kPacks, kGrouped>(xb, x_ext, x_row, owned ? H : 0, rl, x_realign);
      issue_row<scalar_t, kPacks, kGrouped>(gb, g_ext, g_row, owned ? H : 0, rl, g_realign);
    }
    // kMul: gb holds grad_out, mb mul (zero past the row), and g = grad_out * mul in opmath is
    // PolyNorm's grad_y. Same phase: mul's chunks as loaded, with x's and grad_out's; realigned
    // build: mul's chunks in the row's phase (m_realign: realigned into it); aligned build: packs.
    Pack mb[kMul ? kPacks : 1] = {};
    Pack m_ext = make_uint4(0u, 0u, 0u, 0u);
    const scalar_t* m_row = kMul ? mul.mul + r * mul.row_stride : x_row;
    if constexpr (kMul && same_phase) {
      issue_rows<scalar_t, kPacks>({RowRegs<kPacks>{xb, x_ext}, RowRegs<kPacks>{gb, g_ext}, RowRegs<kPacks>{mb, m_ext}},
                                   {x_row, g_row, m_row}, H, rl);
    } else if constexpr (kMul && kLayout == kRealigned) {
      m_start = issue_row_at<scalar_t, kPacks>(mb, m_ext, m_ext2, m_row, H, rl, phase, m_realign);
    } else if constexpr (kMul && kToPacks) {
      issue_row<scalar_t, kPacks>(mb, m_ext, m_row, H, rl, m_realign);
    } else if constexpr (kMul && kStaged) {
#pragma unroll
      for (int i = 0; i < kPacks; ++i) mb[i] = mb_staged[i];
    } else if constexpr (kMul) {
      const int packs = static_cast<int>((H + P::kVec - 1) / P::kVec);
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        const int p = rl.base + i * rl.W;
        mb[i] = p < packs ? load_pack(m_row, p, H, mul.vec_ok) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
    auto grad_of = [&](const Pack& gp, const Pack& mp, int k) {
      if constexpr (kMul) return P::value(gp, k) * P::value(mp, k);
      return P::value(gp, k);
    };
    // A row one element past its slots: its last lane holds x[H - 1] and grad_y's (mul's) apart.
    const int packs = static_cast<int>((H + P::kVec - 1) / P::kVec);
    const bool extra = !kWideTail && kRealign && row_has_extra<kPacks>(rl, packs);
    const bool holds_extra = extra && rl.lane == rl.G - 1 && owned;
    // The tail builds: the row's tail, its last lane's (n = 0 elsewhere).
    const int tail = kWideTail ? row_tail<scalar_t, kPacks>(rl, H) : 0;
    Pack x_tail = make_uint4(0u, 0u, 0u, 0u), g_tail = x_tail, m_tail = x_tail;
    if constexpr (kWideTail) {
      if (tail > 0) {  // one branch that every warp but the row's last skips (not predicated loads on every lane)
        x_tail = load_tail(x_row, H, tail, owned);
        g_tail = load_tail(g_row, H, tail, owned);
        if constexpr (kMul) m_tail = load_tail(m_row, H, tail, true);
      }
    }
    const auto x_last = load_extra(x_row, H, holds_extra);
    const auto g_last = load_extra(g_row, H, holds_extra);
    const auto m_last = kMul ? load_extra(m_row, H, holds_extra) : x_last;
    const int shift = static_cast<int>(reinterpret_cast<uintptr_t>(x_row) & 15);
    const int chunk_phase = kLayout == kRealigned ? phase : shift;  // the chunks' phase (same-phase: x's)
    if constexpr (same_phase) {  // the chunks as loaded, zero past the row's end (as in forward)
      const int end = shift + static_cast<int>(H) * int(sizeof(scalar_t));
      if constexpr (kMul) {
        mask_row_ends<kPacks, 3>({RowRegs<kPacks>{xb, x_ext}, RowRegs<kPacks>{gb, g_ext}, RowRegs<kPacks>{mb, m_ext}}, end, rl, true);
      } else {
        mask_row_ends(xb, x_ext, gb, g_ext, end, rl, true);
      }
    } else if constexpr (kLayout == kRealigned) {  // every input's chunks in the row's phase, zero past its end
      finish_row_at<scalar_t, kPacks>(xb, x_ext, x_ext2, x_start, owned ? H : 0, rl, phase, x_realign);
      finish_row_at<scalar_t, kPacks>(gb, g_ext, g_ext2, g_start, owned ? H : 0, rl, phase, g_realign);
      if constexpr (kMul) finish_row_at<scalar_t, kPacks>(mb, m_ext, m_ext2, m_start, H, rl, phase, m_realign);
    } else {  // aligned: nothing to do; pack-realigned: every misaligned input realigned to packs
      finish_row<scalar_t, kPacks>(xb, x_ext, x_row, H, rl, x_realign, kRealign);
      finish_row<scalar_t, kPacks>(gb, g_ext, g_row, H, rl, g_realign, kRealign);
      if constexpr (kMul && kToPacks) finish_row<scalar_t, kPacks>(mb, m_ext, m_row, H, rl, m_realign, true);
    }

    // The sums, in the class order (class_sums): the aligned build sums element k of the lane's
    // packs, slot by slot, for each k in turn, then adds the classes in order; the same-phase and
    // realigned builds sum their chunks (as loaded; in the row's phase) and take the classes that
    // belong to its packs from its own and its next lane's sums. Past the row, the packs hold zeros.
    acc_t s[4] = {acc_t(0), acc_t(0), acc_t(0), acc_t(0)};
    const auto add_to = [](acc_t (&t)[4], acc_t v, acc_t g) { add_row_grad_sums(t, v, g); };  // MATH.md (4)
    const auto add = [&](acc_t v, acc_t g) { add_to(s, v, g); };
    if constexpr (kChunks) {
      class_sums<scalar_t, kPacks, kMul>(s, class_area, xb, gb, mb, x_ext, g_ext, m_ext, chunk_phase, rl, add_to);
    } else {
#pragma unroll
      for (int k = 0; k < P::kVec; ++k) {
        acc_t c[4] = {acc_t(0), acc_t(0), acc_t(0), acc_t(0)};
#pragma unroll
        for (int i = 0; i < kPacks; ++i) add_to(c, P::value(xb[i], k), grad_of(gb[i], mb[kMul ? i : 0], k));
#pragma unroll
        for (int q = 0; q < 4; ++q) s[q] += c[q];
      }
    }
    // The row's last element, past its slots: zero but on the row's last lane.
    const acc_t x_e = Elem<scalar_t>::to_acc(x_last);
    const acc_t g_e = kMul ? Elem<scalar_t>::to_acc(g_last) * Elem<scalar_t>::to_acc(m_last)
                           : Elem<scalar_t>::to_acc(g_last);
    if (extra) add(x_e, g_e);
    if constexpr (kWideTail) {
      if (tail > 0) {  // as the loads: the row's last lane only
#pragma unroll
        for (int k = 0; k + 1 < P::kVec; ++k) {
          if (k < tail) add(P::value(x_tail, k), grad_of(g_tail, m_tail, k));
        }
      }
    }
    // The row's weights: the kernel's, or its expert's (zeros for a row of no expert).
    acc_t rw0 = w0, rw1 = w1, rw2 = w2, no_bias;
    if (grouped) expert_params(grouping, weight, nullptr, expert, rw0, rw1, rw2, no_bias);
    if (!kShortRows && C > 1) {
      cluster_row_reduce<4>(s, reinterpret_cast<acc_t*>(cluster_slots), parity, rl, C, started);
    } else {
      row_reduce<4, kChunks, kShortRows>(s, red[parity], rl);
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
    const GradCoeffs<acc_t> cd = backward_coeffs(rw0, rw1, rw2, r3, r2, r1, s[0], s[1], s[2], inv_h);  // MATH.md (5)
    // kMul: y's Horner coefficients, as forward computes them; grad_mul = grad_out * y (MATH.md (10))
    // goes to gb (grad_out's registers), x's become dx.
    const HornerCoeffs<acc_t> a = forward_coeffs(rw0, rw1, rw2, r3, r2, r1);
    const auto dx_at = [&](acc_t v, acc_t g) { return grad_x_value(v, g, cd); };  // MATH.md (6)
    // `a` by value: taken by reference, ptxas scheduled the fused tail builds' loads otherwise.
    const auto grad_mul_at = [a, mb_bias](acc_t v, acc_t grad_out) { return grad_out * poly_value(v, a, mb_bias); };
    const auto dx_of = [&](const Pack& xp, const Pack& gp, const Pack& mp) {
      return P::make([&](int k) { return dx_at(P::value(xp, k), grad_of(gp, mp, k)); });
    };
    const auto grad_mul_of = [&](const Pack& xp, const Pack& gp) {
      return P::make([&](int k) { return grad_mul_at(P::value(xp, k), P::value(gp, k)); });
    };
    if (kLayout == kRealigned && dx_realign) {
      // The outputs realigned out of the row's phase (store_row_from); the last segment's last
      // lane also computes the chunk after its slots (v_ext). kMul: grad_mul's rows start as grad_x's.
      Pack dx_ext = make_uint4(0u, 0u, 0u, 0u), gm_ext = make_uint4(0u, 0u, 0u, 0u);
      if (last_segment && rl.j == rl.W - 1) {
        dx_ext = dx_of(x_ext, g_ext, m_ext);
        if constexpr (kMul) gm_ext = grad_mul_of(x_ext, g_ext);
      }
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        keep_raw(xb[i]);
        keep_raw(gb[i]);
        const Pack xp = xb[i], gp = gb[i], mp = mb[kMul ? i : 0];
        xb[i] = dx_of(xp, gp, mp);
        if constexpr (kMul) gb[i] = grad_mul_of(xp, gp);
      }
      store_row_from<scalar_t, kPacks>(grad_x + r * H, xb, dx_ext, H, rl, chunk_phase, last_segment, active);
      if constexpr (kMul) {
        store_row_from<scalar_t, kPacks>(mul.grad_mul + r * H, gb, gm_ext, H, rl, chunk_phase, last_segment, active);
      }
    } else if constexpr (kChunks) {
      // Chunk p of every output from chunk p of every input, as in forward (the realigned build:
      // outputs in the row's phase).
      const int end = chunk_phase + static_cast<int>(H) * int(sizeof(scalar_t));
      const int chunks = (end + 15) / 16;
      Pack* dx_dst = reinterpret_cast<Pack*>(reinterpret_cast<char*>(grad_x + r * H) - chunk_phase);
      Pack* gm_dst = kMul ? reinterpret_cast<Pack*>(reinterpret_cast<char*>(mul.grad_mul + r * H) - chunk_phase) : nullptr;
      // Whole chunks: [first_whole, end / 16); the others (the row's two ends) narrowly.
      const int first_whole = chunk_phase != 0 ? 1 : 0;
      const int whole_hi = end >> 4;
      const unsigned n_whole = active && whole_hi > first_whole ? unsigned(whole_hi - first_whole) : 0u;
      const int chunks_a = active ? chunks : 0;
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        keep_raw(xb[i]);
        keep_raw(gb[i]);
        const int p = rl.base + i * rl.W;
        if (p < chunks_a) {
          const Pack v = dx_of(xb[i], gb[i], mb[kMul ? i : 0]);
          if (unsigned(p - first_whole) < n_whole) {
            dx_dst[p] = v;
          } else {
            store_chunk_part<scalar_t>(dx_dst + p, v, p == 0 ? chunk_phase : 0, min(16, end - 16 * p));
          }
          if constexpr (kMul) {
            const Pack u = grad_mul_of(xb[i], gb[i]);
            if (unsigned(p - first_whole) < n_whole) {  // grad_x's test: the same chunks
              gm_dst[p] = u;
            } else {
              store_chunk_part<scalar_t>(gm_dst + p, u, p == 0 ? chunk_phase : 0, min(16, end - 16 * p));
            }
          }
        }
      }
      if (active && last_segment && rl.j == rl.W - 1 && rl.seg_end < chunks) {
        store_own_chunk<scalar_t>(dx_dst, rl.seg_end, dx_of(x_ext, g_ext, m_ext), chunk_phase, end);
        if constexpr (kMul) store_own_chunk<scalar_t>(gm_dst, rl.seg_end, grad_mul_of(x_ext, g_ext), chunk_phase, end);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        keep_raw(xb[i]);
        keep_raw(gb[i]);
        if (kLayout == kAligned && warp_idle(rl, i, packs)) continue;  // never stored
        const Pack xp = xb[i], gp = gb[i], mp = mb[kMul ? i : 0];
        xb[i] = dx_of(xp, gp, mp);
        if constexpr (kMul) gb[i] = grad_mul_of(xp, gp);
      }
      store_row<scalar_t, kPacks>(grad_x + r * H, xb, H, rl, false, active);
      if constexpr (kMul) {
        store_row<scalar_t, kPacks>(mul.grad_mul + r * H, gb, H, rl, false, active);
      }
      if (extra && active && rl.lane == rl.G - 1) {
        store_extra(grad_x + r * H, H, dx_at(x_e, g_e));
        if constexpr (kMul) store_extra(mul.grad_mul + r * H, H, grad_mul_at(x_e, Elem<scalar_t>::to_acc(g_last)));
      }
    }
    // The tail's outputs, last: the chunks' stores may reach into the tail, the realigned build's with wrong values
    // (row_lanes.cuh, row_tail), which these overwrite from the same lane.
    if (kWideTail && active && tail > 0) {
      store_tail(grad_x + r * H, H, tail, [&](int k) { return dx_at(P::value(x_tail, k), grad_of(g_tail, m_tail, k)); });
      if constexpr (kMul) {
        store_tail(mul.grad_mul + r * H, H, tail,
                   [&](int k) { return grad_mul_at(P::value(x_tail, k), P::value(g_tail, k)); });
      }
    }
  }
  started.wait();  // a cluster that had no row: its arrival is waited on before it exits
  if (param_grads.apart) allow_param_sum();  // param_sum_kernel may be placed

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
  if (!param_grads.apart) finish_param_grads(param_grads, threadIdx.x, int(blockDim.x));  // else param_sum_kernel
}

}  // namespace
}  // namespace polynorm
