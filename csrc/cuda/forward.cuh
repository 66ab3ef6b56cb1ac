// The forward kernels of PolyNorm, of the fused PolyNorm x mul (kMul) and of the grouped op
// (GroupArgs): the row kernel here (the row in registers, on one CTA or a thread-block cluster),
// the tiled kernel in forward_tiled.cuh. Which serves which row: launch_plan.h; launched by
// launch_forward.cuh; the backward kernels: backward.cuh.
#pragma once

#include "args.cuh"
#include "forward_tiled.cuh"
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

// The row kernel: blockDim.x = R * G; a row of C > 1 CTAs when launched as clusters of C (R = 1).
// One pass sums x^2, x^4, x^6 (MATH.md (1)), one row reduction, then rstd (MATH.md (2)) and y
// (MATH.md (3); the fused op's y * mul, MATH.md (8)) from the registers.
// kGrouped: the grouped builds (GroupArgs read); the others carry no code or registers for it.
template <typename scalar_t, int kPacks, int kLayout, int kMaxThreads, bool kMul, bool kGrouped, bool kWholeWarps>
__global__ void __launch_bounds__(kMaxThreads, row_min_blocks(kMaxThreads, (kMul ? 2 : 1) * kPacks, kLayout != kAligned))
    poly_norm_fwd_row_kernel(
    const scalar_t* __restrict__ x,                // [M, H], rows x_row_stride apart
    int64_t x_row_stride,
    bool x_realign_arg,                            // some x rows are not 16-byte aligned
    scalar_t* __restrict__ y,                      // [M, H] contiguous
    bool y_realign_arg,                            // y rows are not all aligned, or H % VEC != 0
    at::opmath_type<scalar_t>* __restrict__ rstd,  // [M, 3] opmath: rstd of x^3, x^2, x
    ParamRef weight,                               // (3,) any float dtype: [w0, w1, w2]
    ParamRef bias,                                 // (1,) any float dtype
    MulArgs<scalar_t> mul,                         // kMul: y is multiplied by mul
    GroupArgs<at::opmath_type<scalar_t>> grouping, // grouped: a per-row expert (weight [E, 3], bias [E])
    int64_t M,
    int64_t H,
    double eps,
    int G,
    int C,                                         // CTAs a row (a cluster of C, R = 1), or 1
    RowStagger stagger) {                          // the start in quarters (reduce.cuh; grouped: unused)
  using acc_t = at::opmath_type<scalar_t>;
  using P = PackOf<scalar_t>;
  __shared__ acc_t red[2][kRowMaxThreads / 32][3];
  // Dynamic: the same-phase and realigned builds' stage areas (a warp's: stage_words), then, C > 1, the
  // cluster slots ([2][C G / 32][3]); launch_forward_row's smem_of sizes them.
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  // kLayout (RowLayout): kAligned, every row aligned and H a multiple of the pack width
  // (no realignment code, no registers for it); kSamePhase, rows that start alike in every
  // tensor (stage_row); kRealigned, rows that do not: one phase a row, x's rows' or, where
  // x_realign_arg says that x's rows are not in it, y's (launch_forward.cuh, launch_forward_row: y's for
  // PolyNorm), x (and mul) realigned into it as they arrive (issue_row_at) where not in it, y out
  // of it as it is stored (store_row_from) where not in it, the sums through the stage as the
  // same-phase build's; kPackRealigned,
  // rows realigned to whole packs on load and back on store (misaligned x or mul beside a y of
  // whole aligned packs, and the fallback where the stage does not fit).
  constexpr bool kRealign = kLayout != kAligned;
  constexpr bool kOnePhase = kLayout == kRealigned;
  constexpr bool kStaged = kLayout == kSamePhase || kOnePhase;  // the sums read the stage
  constexpr bool kFlags = kOnePhase || kLayout == kPackRealigned;  // the realign flags are read
  const bool x_realign = kFlags && x_realign_arg;
  const bool y_realign = kFlags && y_realign_arg;
  const bool m_realign = kMul && kFlags && !mul.vec_ok;  // kMul: mul's rows realigned too
  constexpr bool same_phase = kLayout == kSamePhase;

  constexpr bool kShortRows = short_rows(kLayout, kWholeWarps, kGrouped);  // row_lanes.cuh
  const RowLane rl = row_lane<kPacks, kWholeWarps>(G, C);
  const RowBlock blk = row_block(G, C);
  const int R = blk.R;
  const int group = blk.group;
  const bool last_segment = (rl.lane >> rl.wlog) + 1 == (rl.G >> rl.wlog);
  const int64_t cluster_id = blockIdx.x >> blk.clog;  // the block's rows: R from cluster_id R
  const int64_t clusters = gridDim.x >> blk.clog;

  const acc_t w0 = load_param<acc_t>(weight, 0), w1 = load_param<acc_t>(weight, 1);
  const acc_t w2 = load_param<acc_t>(weight, 2), b = load_param<acc_t>(bias, 0);
  const acc_t inv_h = acc_t(1) / static_cast<acc_t>(H);
  const acc_t e = static_cast<acc_t>(eps);
  // Grouped (GroupArgs): a row's expert, E for a row of no expert or past M. Searched before
  // the row's loads are issued, so that a row of no expert is not read (a load of length 0,
  // all zeros); it then computes with zero parameters and rstd: y = 0. The expert's
  // parameters are read late (during the row's reduction), so that only the expert's index
  // is live while the row is in registers.
  const bool grouped = kGrouped && !kMul && grouping.offsets.ptr != nullptr;
  const int E = static_cast<int>(grouping.offsets.E);  // < 2^31: the launchers check it
  const auto expert_of_row = [&](int64_t row) {
    if (row >= M) return E;
    // A row of 32 threads or more: every lane of the warp has it, so the warp votes (aligned
    // builds; the realigning ones keep the binary search: the vote's registers spill there).
    if (kLayout == kAligned && rl.G >= 32) return static_cast<int>(expert_of_warp(grouping.offsets, row));
    return static_cast<int>(expert_of(grouping.offsets, row));
  };

  uint32_t* stage = reinterpret_cast<uint32_t*>(dyn_smem) + (threadIdx.x >> 5) * stage_words(kPacks);
  unsigned char* cluster_slots = dyn_smem + (kStaged ? (blockDim.x >> 5) * stage_words(kPacks) * 4 : 0);
  const int64_t step = clusters * R;
  Pack ext;
  int parity = 0;
  __shared__ __align__(8) uint64_t cluster_bars[2];  // C > 1: cluster_row_reduce's mbarriers
  if constexpr (!kGrouped) stagger_start(cluster_id, stagger);
  ClusterStart started(C, cluster_bars);  // C > 1: arrived; waited on before the first store into a peer
  for (int64_t first = cluster_id * R; first < M; first += step, parity ^= 1) {
    const int64_t row = first + group;
    const bool active = row < M;  // inactive groups read row 0 and join the barriers
    const scalar_t* x_row = x + (active ? row : 0) * x_row_stride;
    const int expert = grouped ? expert_of_row(row) : 0;
    const bool owned = !grouped || expert < E;
    Pack buf[kPacks];
    // One phase (kRealigned): x's rows', or y's where x's are not in it; each input's start
    // (issue_row_at) and its chunk after ext.
    int phase = 0, x_start = 0, m_start = 0;
    Pack ext2, m_ext2;
    if constexpr (kOnePhase) {
      const scalar_t* phase_row = x_realign ? y + (active ? row : 0) * H : x_row;
      phase = static_cast<int>(reinterpret_cast<uintptr_t>(phase_row) & 15);
      x_start = issue_row_at<scalar_t, kPacks, kGrouped>(buf, ext, ext2, x_row, owned ? H : 0, rl, phase, x_realign);
    } else {
      issue_row<scalar_t, kPacks, kGrouped>(buf, ext, x_row, owned ? H : 0, rl, x_realign || same_phase);
    }
    // kMul: mul's packs (zero past the row), loaded with x's so that they are in flight
    // during the reduction. Same phase: mul's chunks as loaded, like x's; realigned build: mul's
    // chunks in the row's phase (m_realign: realigned into it); pack-realigned build: mul's rows
    // realigned to packs as x's are (m_realign).
    Pack mb[kMul ? kPacks : 1] = {};
    Pack m_ext = make_uint4(0u, 0u, 0u, 0u);
    const scalar_t* m_row = kMul ? mul.mul + (active ? row : 0) * mul.row_stride : x_row;
    if constexpr (kMul && same_phase) {
      issue_row<scalar_t, kPacks>(mb, m_ext, m_row, H, rl, true);
    } else if constexpr (kMul && kOnePhase) {
      m_start = issue_row_at<scalar_t, kPacks>(mb, m_ext, m_ext2, m_row, H, rl, phase, m_realign);
    } else if constexpr (kMul && kLayout == kPackRealigned) {
      issue_row<scalar_t, kPacks>(mb, m_ext, m_row, H, rl, m_realign);
    } else if constexpr (kMul) {
      const int packs = static_cast<int>((H + P::kVec - 1) / P::kVec);
      // mul aligned and whole (the aligned build's only case at run time: a misaligned mul takes
      // the realigning build): 16-byte packs under one branch, issued back to back, not load_pack's
      // per-pack branch to an element-wise path, which spread the 8 loads over ~1300 instructions
      // (the same bits). The element-wise path stays, written first (the `if` branch), so that
      // ptxas keeps the packs' loads inline after x's (tests/test_sass_load_order.py).
      if (!mul.vec_ok || H % P::kVec != 0) {
#pragma unroll
        for (int i = 0; i < kPacks; ++i) {
          const int p = rl.base + i * rl.W;
          mb[i] = p < packs ? load_pack(m_row, p, H, mul.vec_ok) : make_uint4(0u, 0u, 0u, 0u);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kPacks; ++i) {
          const int p = rl.base + i * rl.W;
          mb[i] = p < packs ? reinterpret_cast<const Pack*>(m_row)[p] : make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
    // A row one element past its slots: its last lane holds x[H - 1] (and mul's) apart.
    const int packs = static_cast<int>((H + P::kVec - 1) / P::kVec);
    const bool extra = kRealign && row_has_extra<kPacks>(rl, packs);
    const bool holds_extra = extra && rl.lane == rl.G - 1 && owned;
    const auto x_last = load_extra(x_row, H, holds_extra);
    const auto m_last = kMul ? load_extra(m_row, H, holds_extra) : x_last;
    // The chunks' phase: x's rows' (same phase), the row's (one phase).
    const int shift = kOnePhase ? phase : static_cast<int>(reinterpret_cast<uintptr_t>(x_row) & 15);
    if constexpr (same_phase) {
      // The chunks as loaded, zero past the row's end (mul's too, though only x reaches the sums here;
      // bytes past the end are never stored).
      const int end = shift + static_cast<int>(H) * int(sizeof(scalar_t));
      mask_row_end(buf, ext, end, rl, true);
      if constexpr (kMul) mask_row_end(mb, m_ext, end, rl, true);
      stage_row(stage, buf, ext, rl);  // x's chunks, for the sums' realigned packs
    } else if constexpr (kOnePhase) {  // every input's chunks in the row's phase, zero past its end
      finish_row_at<scalar_t, kPacks>(buf, ext, ext2, x_start, owned ? H : 0, rl, phase, x_realign);
      if constexpr (kMul) finish_row_at<scalar_t, kPacks>(mb, m_ext, m_ext2, m_start, H, rl, phase, m_realign);
      stage_row(stage, buf, ext, rl);
    } else {
      finish_row<scalar_t, kPacks>(buf, ext, x_row, H, rl, x_realign, kRealign);
      if constexpr (kMul && kLayout == kPackRealigned) finish_row<scalar_t, kPacks>(mb, m_ext, m_row, H, rl, m_realign, true);
    }

    acc_t s[3] = {acc_t(0), acc_t(0), acc_t(0)};  // past the row, the packs hold zeros
    const auto add = [&](acc_t v) { add_row_sums(s, v); };
    const StageWindow sw = kStaged ? stage_window(shift, rl) : StageWindow{};
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      if (kLayout == kAligned && warp_idle(rl, i, packs)) continue;
      const Pack in = kStaged ? staged_pack<scalar_t>(stage, sw, i) : buf[i];
#pragma unroll
      for (int k = 0; k < P::kVec; ++k) add(P::value(in, k));
    }
    if (extra) add(Elem<scalar_t>::to_acc(x_last));  // zero but on the row's last lane
    // The row's parameters: the kernel's, or its expert's (zeros for a row of no expert).
    acc_t rw0 = w0, rw1 = w1, rw2 = w2, rb = b;
    if (grouped) expert_params(grouping, weight, &bias, expert, rw0, rw1, rw2, rb);
    if (!kShortRows && C > 1) {
      cluster_row_reduce<3>(s, reinterpret_cast<acc_t*>(cluster_slots), parity, rl, C, started);
    } else {
      row_reduce<3, false, kShortRows>(s, red[parity], rl);
    }

    acc_t r1 = rstd_of(s[0], inv_h, e);
    acc_t r2 = rstd_of(s[1], inv_h, e);
    acc_t r3 = rstd_of(s[2], inv_h, e);
    if (!owned) r1 = r2 = r3 = acc_t(0);  // grouped, a row of no expert: rstd = 0
    if (active && rl.lane == 0) {
      rstd[row * 3 + 0] = r3;
      rstd[row * 3 + 1] = r2;
      rstd[row * 3 + 2] = r1;
    }
    const HornerCoeffs<acc_t> a = forward_coeffs(rw0, rw1, rw2, r3, r2, r1);
    const auto output_of = [&](acc_t v, acc_t m) {
      const acc_t yv = poly_value(v, a, rb);
      if constexpr (kMul) return yv * m;  // MATH.md (8)
      return yv;
    };
    const auto output = [&](const Pack& in, const Pack& m) {
      return P::make([&](int k) { return output_of(P::value(in, k), kMul ? P::value(m, k) : acc_t(0)); });
    };
    scalar_t* y_row = y + (active ? row : 0) * H;
    if (kOnePhase && y_realign) {
      // y realigned out of the row's phase (store_row_from); the last segment's last lane also
      // computes the chunk after its slots (y_ext).
      Pack y_ext = make_uint4(0u, 0u, 0u, 0u);
      if (last_segment && rl.j == rl.W - 1) y_ext = output(ext, m_ext);
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        keep_raw(buf[i]);
        buf[i] = output(buf[i], mb[kMul ? i : 0]);
      }
      store_row_from<scalar_t, kPacks>(y_row, buf, y_ext, H, rl, shift, last_segment, active);
    } else if constexpr (kStaged) {
      // Chunk p of y from chunk p of x (and mul), y's rows in the chunks' phase; the chunk after
      // the last segment, held in ext by its last lane only, when the row reaches into it.
      Pack* dst = reinterpret_cast<Pack*>(reinterpret_cast<char*>(y_row) - shift);
      const int end = shift + static_cast<int>(H) * int(sizeof(scalar_t));
      const int chunks = (end + 15) / 16;
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        keep_raw(buf[i]);
        const int p = rl.base + i * rl.W;
        if (active && p < chunks) store_own_chunk<scalar_t>(dst, p, output(buf[i], mb[kMul ? i : 0]), shift, end);
      }
      if (active && last_segment && rl.j == rl.W - 1 && rl.seg_end < chunks) {
        store_own_chunk<scalar_t>(dst, rl.seg_end, output(ext, m_ext), shift, end);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        keep_raw(buf[i]);
        if (kLayout != kAligned || !warp_idle(rl, i, packs)) buf[i] = output(buf[i], mb[kMul ? i : 0]);  // idle: never stored
      }
      store_row<scalar_t, kPacks>(y_row, buf, H, rl, y_realign, active);
      if (extra && active && rl.lane == rl.G - 1) {
        store_extra(y_row, H, output_of(Elem<scalar_t>::to_acc(x_last), Elem<scalar_t>::to_acc(m_last)));
      }
    }
  }
  started.wait();  // a cluster that had no row: its arrival is waited on before it exits
}

}  // namespace
}  // namespace polynorm
