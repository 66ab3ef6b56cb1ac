// The row kernels' rows in registers: the lane layout (RowLane, RowBlock), the loads and stores
// of aligned rows and of rows realigned to whole packs (issue_row ... store_row), the builds by
// layout (RowLayout), and a row's elements past its lanes' slots (row_has_extra, row_tail). The
// same-phase and one-phase rows' chunks: row_phase.cuh.
//
// A row is held in registers by G threads, few threads a row and many bytes a thread (kPacks
// 16-byte packs; rows of whole packs: 256 bytes of x forward, 128 each of x and grad_y backward;
// 2-byte odd H forward half as many; a pack fewer where launch_plan.h's row_packs trims a
// half-idle warp), so that an SM keeps ~128 KB of loads in flight with no barrier but the
// reduction's: the layout of QuACK's norms (Tri Dao et al.). Every row that one CTA or a
// thread-block cluster holds runs so (launch_plan.h's table).
// - The row's packs are split into warp segments (RowLane): every warp access is 512
//   contiguous bytes, and the neighbour of a lane's pack is the next lane's.
// - Blocks of R = threads / G rows; a grid-stride loop, persistent or a block per R rows
//   (launch_forward_row says which).
// - Misaligned rows (odd H, views such as buf[1:]) read and write whole aligned 16-byte
//   chunks. Same-phase build (every tensor's rows start alike): the elementwise part works on
//   the chunks as loaded, and only the forward's sums see realigned packs (the stage); the
//   backward's take the aligned row's order class by class (backward.cuh class_sums). Realigned
//   build (rows that start unlike): the same, in one phase a row, the tensors not in it realigned
//   into it as they arrive or out of it as they are stored (issue_row_at, store_row_from, below).
//   Pack-realigned build (a view of whole packs beside aligned outputs): a lane's pack is
//   realigned from its chunk and the next one (a shuffle; past its segment, one more load), and
//   stores go the other way (store_row), narrowly only at the row's ends and where segments
//   meet. Every way the sums, and so the bits, are the aligned row's.
#pragma once

#include "packs.cuh"

#include <ATen/OpMathType.h>

#include <cstdint>

namespace polynorm {
namespace {

// Where the group's lanes stand: G threads a row, in warp segments of W = min(G, 32)
// lanes. Segment k owns the row's packs [k S, (k + 1) S), S = W * kPacks, and its lane j
// owns packs k S + j, k S + j + W, ..., so every warp access is 512 contiguous bytes and
// the neighbour of a lane's pack is the next lane's (the segment's last lane: lane 0's next
// pack, or, past its last, the next segment's first).
struct RowLane {
  int lane;  // 0..G-1
  int G;
  int W;
  int wlog;  // log2(W)
  int j;     // lane within its segment, 0..W-1
  int base;  // the lane's first pack: packs base + i * W, i < kPacks
  int seg_end;  // first pack past the segment: base of the next segment's lane 0
};

// The row kernels' block geometry without integer division (a run-time divisor costs ~20
// instructions, paid a row): G threads a row is a power of two whenever a
// block holds several rows (launch_plan.h, row_plan: R = 128 / G), and C, the CTAs of a cluster,
// always is.
struct RowBlock {
  int R;      // rows a block: blockDim.x / G
  int group;  // this thread's row of the block: threadIdx.x / G
  int clog;   // log2(C)
};
__device__ __forceinline__ RowBlock row_block(int G, int C) {
  const bool pow2 = (G & (G - 1)) == 0;
  const int glog = __ffs(G) - 1;
  const int R = pow2 ? static_cast<int>(blockDim.x) >> glog : 1;
  return RowBlock{R, R > 1 ? static_cast<int>(threadIdx.x) >> glog : 0, __ffs(C) - 1};
}

// A row of C > 1 CTAs (a thread-block cluster, C consecutive blocks): CTA `rank` holds lanes
// [rank G, (rank + 1) G) of the row's C G, so the lane layout, the packs a lane owns and the
// load/store code are those of one CTA of C G threads.
// kWholeWarps: the build serves rows of 32 lanes or more only (launch_plan.h, row_kernel_for), so
// W = 32 is known at compile time: every slot's index and test is a constant offset, fewer
// instructions than a W known at run time, and faster odd-H rows.
template <int kPacks, bool kWholeWarps = false>
__device__ __forceinline__ RowLane row_lane(int G, int C) {
  const int rank = C > 1 ? static_cast<int>(blockIdx.x) & (C - 1) : 0;
  const int t = static_cast<int>(threadIdx.x);
  const int lane = rank * G + ((G & (G - 1)) == 0 ? t & (G - 1) : t);  // G not a power of two: R = 1
  const int Gt = G * C;
  const int W = kWholeWarps || Gt >= 32 ? 32 : Gt;  // Gt < 32 only for a power of two (one CTA)
  const int wlog = __ffs(W) - 1;
  const int j = lane & (W - 1);
  const int seg = lane >> wlog;
  return RowLane{lane, Gt, W, wlog, j, seg * W * kPacks + j, (seg + 1) * W * kPacks};
}

// Whether pack slot i of every lane of this warp lies past the row's `packs` (the same for
// the whole warp: its lanes differ only in j). Such slots hold zeros or bytes past the row;
// their arithmetic is skipped in the aligned builds. The realigning builds do the arithmetic:
// there the skip cost more in spills than it saved (the backward's class loop spilled 156 bytes).
__device__ __forceinline__ bool warp_idle(const RowLane& rl, int i, int packs) {
  return rl.base - rl.j + i * rl.W >= packs;
}

// The 16 bytes that start `shift` bytes into chunk a (and run on into chunk b), for a
// shift that varies by row: selects, no branch (rows of one warp may differ).
__device__ __forceinline__ Pack realign_any(const Pack& a, const Pack& b, int shift) {
  const bool hi2 = (shift & 8) != 0, hi1 = (shift & 4) != 0;
  const uint32_t v0 = hi2 ? a.z : a.x, v1 = hi2 ? a.w : a.y, v2 = hi2 ? b.x : a.z;
  const uint32_t v3 = hi2 ? b.y : a.w, v4 = hi2 ? b.z : b.x, v5 = hi2 ? b.w : b.y;
  const uint32_t w0 = hi1 ? v1 : v0, w1 = hi1 ? v2 : v1, w2 = hi1 ? v3 : v2;
  const uint32_t w3 = hi1 ? v4 : v3, w4 = hi1 ? v5 : v4;
  const unsigned bits = (shift & 3) * 8;
  return make_uint4(__funnelshift_r(w0, w1, bits), __funnelshift_r(w1, w2, bits), __funnelshift_r(w2, w3, bits),
                    __funnelshift_r(w3, w4, bits));
}

__device__ __forceinline__ Pack shfl_pack(const Pack& v, int src, int width) {
  return make_uint4(__shfl_sync(0xffffffffu, v.x, src, width), __shfl_sync(0xffffffffu, v.y, src, width),
                    __shfl_sync(0xffffffffu, v.z, src, width), __shfl_sync(0xffffffffu, v.w, src, width));
}

// Loads a row's packs into registers in two steps, so that the loads of several rows
// (x and grad_y, and mul) are in flight together: issue_row starts them, finish_row realigns.
// Afterwards buf[i] = pack base + i * W (zero past the row; elements past H inside the
// last pack are garbage until finish_row masks them). `realign_rows`: some rows of the
// tensor are not 16-byte aligned; each lane then loads the aligned 16-byte chunk of its
// pack's index, and the segment's last lane also the chunk after its segment (`ext`).
// kMayBeEmpty (the grouped builds, kGrouped): H may be 0, which loads nothing (every pack
// zero): a grouped row of no expert.
template <typename scalar_t, int kPacks, bool kMayBeEmpty = false>
__device__ __forceinline__ void issue_row(Pack (&buf)[kPacks], Pack& ext, const scalar_t* row, int64_t H,
                                          const RowLane& rl, bool realign_rows) {
  constexpr int kVec = PackOf<scalar_t>::kVec;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(row);
  const int shift = realign_rows ? static_cast<int>(addr & 15) : 0;
  // Pointer arithmetic, not an integer's: the compiler keeps the global address space (LDG).
  const Pack* src = reinterpret_cast<const Pack*>(reinterpret_cast<const char*>(row) - shift);
  // Chunks covering the row: its packs, or one more when a misaligned row spills over.
  int chunks = realign_rows ? static_cast<int>((shift + H * int64_t(sizeof(scalar_t)) + 15) / 16)
                            : static_cast<int>((H + kVec - 1) / kVec);
  if (kMayBeEmpty && H == 0) chunks = 0;  // not even the chunk where a misaligned row starts
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const int p = rl.base + i * rl.W;
    buf[i] = p < chunks ? src[p] : make_uint4(0u, 0u, 0u, 0u);
  }
  if (realign_rows) {
    ext = (rl.j == rl.W - 1 && rl.seg_end < chunks) ? src[rl.seg_end] : make_uint4(0u, 0u, 0u, 0u);
  }
}

// One tensor's row in a lane's registers: its pack slots and the segment's extra chunk (issue_rows,
// mask_row_ends).
template <int kPacks>
struct RowRegs {
  Pack (&buf)[kPacks];
  Pack& ext;
};

// issue_row (realign_rows) of tensors whose rows start at the same offset into their chunks (the
// same-phase backward's x, grad_y and, kMul, mul): one shift, chunk count and test a slot for all.
// `rows`: each tensor's row start, in the order of `regs`.
template <typename scalar_t, int kPacks, bool kMayBeEmpty = false, int kN>
__device__ __forceinline__ void issue_rows(const RowRegs<kPacks> (&regs)[kN], const scalar_t* const (&rows)[kN],
                                           int64_t H, const RowLane& rl) {
  const int shift = static_cast<int>(reinterpret_cast<uintptr_t>(rows[0]) & 15);
  const Pack* src[kN];
#pragma unroll
  for (int t = 0; t < kN; ++t) src[t] = reinterpret_cast<const Pack*>(reinterpret_cast<const char*>(rows[t]) - shift);
  int chunks = static_cast<int>((shift + H * int64_t(sizeof(scalar_t)) + 15) / 16);
  if (kMayBeEmpty && H == 0) chunks = 0;  // as issue_row
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const int p = rl.base + i * rl.W;
    const bool in = p < chunks;
#pragma unroll
    for (int t = 0; t < kN; ++t) regs[t].buf[i] = in ? src[t][p] : make_uint4(0u, 0u, 0u, 0u);
  }
  const bool ext = rl.j == rl.W - 1 && rl.seg_end < chunks;
#pragma unroll
  for (int t = 0; t < kN; ++t) regs[t].ext = ext ? src[t][rl.seg_end] : make_uint4(0u, 0u, 0u, 0u);
}

// The same for two tensors (PolyNorm's same-phase backward: x and grad_y), written out rather than
// through the array form above: through it ptxas schedules that backward otherwise, and slower.
// So is mask_row_ends' two-tensor form.
template <typename scalar_t, int kPacks, bool kMayBeEmpty = false>
__device__ __forceinline__ void issue_rows(Pack (&a)[kPacks], Pack& a_ext, const scalar_t* a_row, Pack (&b)[kPacks],
                                            Pack& b_ext, const scalar_t* b_row, int64_t H, const RowLane& rl) {
  const int shift = static_cast<int>(reinterpret_cast<uintptr_t>(a_row) & 15);
  const Pack* as = reinterpret_cast<const Pack*>(reinterpret_cast<const char*>(a_row) - shift);
  const Pack* bs = reinterpret_cast<const Pack*>(reinterpret_cast<const char*>(b_row) - shift);
  int chunks = static_cast<int>((shift + H * int64_t(sizeof(scalar_t)) + 15) / 16);
  if (kMayBeEmpty && H == 0) chunks = 0;  // as issue_row
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const int p = rl.base + i * rl.W;
    const bool in = p < chunks;
    a[i] = in ? as[p] : make_uint4(0u, 0u, 0u, 0u);
    b[i] = in ? bs[p] : make_uint4(0u, 0u, 0u, 0u);
  }
  const bool ext = rl.j == rl.W - 1 && rl.seg_end < chunks;
  a_ext = ext ? as[rl.seg_end] : make_uint4(0u, 0u, 0u, 0u);
  b_ext = ext ? bs[rl.seg_end] : make_uint4(0u, 0u, 0u, 0u);
}

// The mask of a word's bytes to keep, its first n (none for n <= 0, all for n >= 4).
__device__ __forceinline__ uint32_t keep_mask(int n) {
  return n >= 4 ? 0xffffffffu : n <= 0 ? 0u : (1u << (8 * n)) - 1u;
}

// Zeroes what a row's chunks hold past its end, once a row: the bytes from `end` (the row's end,
// in bytes from its first chunk) of the chunk that holds its last byte. Chunks past that one
// were never loaded (zeros), so every pack realigned from the chunks reads zeros past the row
// and the sums need no per-pack test. Only the lane that holds that chunk (in a slot, or in
// `ext` when `has_ext`) does any work; the others skip it in one branch. at_row_end finds that
// lane and calls `apply(m, in_ext, slot)` there: m, the word masks of the bytes to keep; in_ext,
// whether `ext` holds the chunk, else pack slot `slot`. mask_row_end masks one tensor's packs,
// mask_row_ends several whose rows start alike (the same-phase backward's x and grad_y, and mul in
// the fused op's: the tests once).
template <int kPacks, typename Apply>
__device__ __forceinline__ void at_row_end(int end, const RowLane& rl, bool has_ext, Apply&& apply) {
  const int last = end > 0 ? (end - 1) / 16 : 0;  // the chunk of the row's last byte
  const int keep = end - 16 * last;               // its bytes that are the row's: 1..16 (0: no row)
  if (keep == 16) return;
  const int off = last - rl.base;
  const bool in_slot = off >= 0 && (off & (rl.W - 1)) == 0 && (off >> rl.wlog) < kPacks;
  const bool in_ext = has_ext && rl.j == rl.W - 1 && last == rl.seg_end;
  if (!in_slot && !in_ext) return;
  uint32_t m[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) m[k] = keep_mask(keep - 4 * k);
  apply(m, in_ext, off >> rl.wlog);
}

template <int kPacks>
__device__ __forceinline__ void mask_slot(Pack (&buf)[kPacks], Pack& ext, const uint32_t (&m)[4], bool in_ext,
                                          int slot) {
  const auto masked = [&](const Pack& v) { return make_uint4(v.x & m[0], v.y & m[1], v.z & m[2], v.w & m[3]); };
  if (in_ext) {
    ext = masked(ext);
    return;
  }
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    if (i == slot) buf[i] = masked(buf[i]);
  }
}

template <int kPacks>
__device__ __forceinline__ void mask_row_end(Pack (&buf)[kPacks], Pack& ext, int end, const RowLane& rl,
                                             bool has_ext) {
  at_row_end<kPacks>(end, rl, has_ext,
                     [&](const uint32_t(&m)[4], bool in_ext, int slot) { mask_slot(buf, ext, m, in_ext, slot); });
}

template <int kPacks, int kN>
__device__ __forceinline__ void mask_row_ends(const RowRegs<kPacks> (&regs)[kN], int end, const RowLane& rl,
                                              bool has_ext) {
  at_row_end<kPacks>(end, rl, has_ext, [&](const uint32_t(&m)[4], bool in_ext, int slot) {
#pragma unroll
    for (int t = 0; t < kN; ++t) mask_slot(regs[t].buf, regs[t].ext, m, in_ext, slot);
  });
}

template <int kPacks>
__device__ __forceinline__ void mask_row_ends(Pack (&a)[kPacks], Pack& a_ext, Pack (&b)[kPacks], Pack& b_ext, int end,
                                              const RowLane& rl, bool has_ext) {
  at_row_end<kPacks>(end, rl, has_ext, [&](const uint32_t(&m)[4], bool in_ext, int slot) {
    mask_slot(a, a_ext, m, in_ext, slot);
    mask_slot(b, b_ext, m, in_ext, slot);
  });
}

// Realigns a lane's slots: slot i becomes the 16 bytes from `shift` on of its chunk and the next
// one. The next chunk is the next lane's slot i; for the segment's last lane, lane 0's slot i + 1,
// or `ext` after its last slot. Every lane of the segment takes part (a shuffle a slot).
template <int kPacks>
__device__ __forceinline__ void realign_slots(Pack (&buf)[kPacks], const Pack& ext, const RowLane& rl, int shift) {
  const int from = rl.j + 1 == rl.W ? 0 : rl.j + 1;
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const Pack offer = (rl.j == 0 && i + 1 < kPacks) ? buf[i + 1 < kPacks ? i + 1 : i] : buf[i];
    Pack next = shfl_pack(offer, from, rl.W);  // every lane takes part
    if (rl.j == rl.W - 1 && i + 1 == kPacks) next = ext;
    buf[i] = realign_any(buf[i], next, shift);
  }
}

template <typename scalar_t, int kPacks>
__device__ __forceinline__ void finish_row(Pack (&buf)[kPacks], Pack& ext, const scalar_t* row, int64_t H,
                                           const RowLane& rl, bool realign_rows, bool mask_tail) {
  const int shift = realign_rows ? static_cast<int>(reinterpret_cast<uintptr_t>(row) & 15) : 0;
  // Zero what lies past the row (the tail of its last chunk) before realigning, so that the
  // packs past the end and the tail of a partial last pack read zeros: the sums need no
  // per-element test. Without mask_tail the row is whole packs.
  if (mask_tail) mask_row_end(buf, ext, shift + static_cast<int>(H) * int(sizeof(scalar_t)), rl, realign_rows);
  if (realign_rows) realign_slots(buf, ext, rl, shift);  // pack p: the chunks p and p + 1 from `shift` on
}

// Writes elements of `v` at byte offsets [lo, hi) of the 16-byte chunk `dst`.
template <typename scalar_t>
__device__ __forceinline__ void store_chunk_part(Pack* dst, const Pack& v, int lo, int hi) {
  using P = PackOf<scalar_t>;
  using raw_t = typename P::raw_t;
  raw_t* out = reinterpret_cast<raw_t*>(dst);
#pragma unroll
  for (int e = 0; e < P::kVec; ++e) {
    const int at = e * int(sizeof(raw_t));
    if (at >= lo && at < hi) out[e] = P::get(v, e);
  }
}

// Stores the packs of a row (the inverse of issue_row + finish_row). Without
// `realign_rows` every row is 16-byte aligned and H is a multiple of the pack width.
// Otherwise each lane writes the aligned chunk of its pack's index: the tail of the
// previous pack (the previous lane's; for lane 0, the segment's last lane's previous one)
// and the head of its own. Only the row's two ends and the chunk where two segments meet
// are written narrowly (each segment writes its own bytes of it).
template <typename scalar_t, int kPacks>
__device__ __forceinline__ void store_row(scalar_t* row, const Pack (&out)[kPacks], int64_t H, const RowLane& rl,
                                          bool realign_rows, bool active) {
  constexpr int kVec = PackOf<scalar_t>::kVec;
  const int P = static_cast<int>((H + kVec - 1) / kVec);
  if (!realign_rows) {
    if (!active) return;
    Pack* dst = reinterpret_cast<Pack*>(row);
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int p = rl.base + i * rl.W;
      if (p < P) dst[p] = out[i];
    }
    return;
  }
  const uintptr_t addr = reinterpret_cast<uintptr_t>(row);
  const int shift = static_cast<int>(addr & 15);
  Pack* dst = reinterpret_cast<Pack*>(reinterpret_cast<char*>(row) - shift);  // as issue_row's
  const int end = shift + static_cast<int>(H) * int(sizeof(scalar_t));  // row end, in bytes from dst
  const int chunks = (end + 15) / 16;
  const int from = rl.j == 0 ? rl.W - 1 : rl.j - 1;
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const Pack offer = (rl.j == rl.W - 1 && i > 0) ? out[i > 0 ? i - 1 : i] : out[i];
    const Pack prev = shfl_pack(offer, from, rl.W);  // every lane takes part
    const int p = rl.base + i * rl.W;
    if (!active || p >= P) continue;
    // Chunk p: the last `shift` bytes of pack p - 1, then the first 16 - shift of pack p.
    // The segment's first pack has no pack p - 1 here: its owner writes that tail.
    const bool first = rl.j == 0 && i == 0;
    const int lo = (shift != 0 && first) ? shift : 0;
    const int hi = min(16, end - 16 * p);
    const Pack chunk = shift == 0 ? out[i] : realign_any(prev, out[i], 16 - shift);
    if (lo == 0 && hi == 16) {
      dst[p] = chunk;
    } else {
      store_chunk_part<scalar_t>(dst + p, chunk, lo, hi);
    }
    const bool seg_last = rl.j == rl.W - 1 && i + 1 == kPacks;
    if (shift != 0 && (seg_last || p == P - 1) && p + 1 < chunks) {
      // This pack's tail: the first `shift` bytes of chunk p + 1.
      store_chunk_part<scalar_t>(dst + p + 1, realign_any(out[i], out[i], 16 - shift), 0,
                                 min(shift, end - 16 * (p + 1)));
    }
  }
}

// The row kernels' builds by layout (the kLayout template argument). kPackRealigned: misaligned
// rows of whole packs beside aligned outputs, realigned to packs (finish_row) and summed as the
// aligned build sums them (the backward at a view of x one element in, bf16 H = 4096: 0.97 of its
// add so, 1.06 in the one-phase realigned build, bench/results/h200-misaligned-rows/compare_mn.log:
// rows 4096x of the m and n builds); the forward's also serves where the stage does not fit a
// block, and the narrow builds' aligned rows.
// kAlignedStaged: the fused backward's aligned rows of clusters, each thread's packs copied into its own
// shared-memory stage (stage_copies) a row ahead (launch_plan.h, row_staged).
// kSamePhaseTail, kRealignedTail: the same-phase and realigned builds of rows whose tail is wider than one element
// (row_tail below; launch_plan.h, row_tail_plan: the fused backward's odd rows that take fewer lanes so).
enum RowLayout : int {
  kAligned = 0, kRealigned = 1, kSamePhase = 2, kPackRealigned = 3, kAlignedStaged = 4, kSamePhaseTail = 5,
  kRealignedTail = 6
};
// The layout a build works in (kAlignedStaged: kAligned; the tail builds: theirs), and whether it holds a wide tail.
constexpr int build_layout(int build) {
  return build == kAlignedStaged ? kAligned : build == kSamePhaseTail ? kSamePhase : build == kRealignedTail ? kRealigned : build;
}
constexpr bool wide_tail_build(int build) { return build == kSamePhaseTail || build == kRealignedTail; }

// Whether a row build serves rows of fewer than 32 lanes only (launch_plan.h, row_kernel_for): a
// realigning or same-phase build without kWholeWarps, but not a grouped one (one build for every
// row). Such rows are one warp segment of one CTA: no cross-warp sum, no cluster.
constexpr bool short_rows(int layout, bool whole_warps, bool grouped) {
  return layout != kAligned && layout != kAlignedStaged && !whole_warps && !grouped;
}

// A row one element past the packs its lanes hold (launch_plan.h, slot_packs; rows not of whole
// packs, so the realigning builds only): the row's last lane holds that element, at H - 1, as a
// raw scalar (`holds`), adds it to its sums after its packs, and writes its outputs (the builds
// that hold chunks, same-phase and realigned, write them with the chunk in `ext` instead). The other lanes hold zero, which adds
// nothing to a sum. The same in every layout, so the bits stay the aligned row's.
template <int kPacks>
__device__ __forceinline__ bool row_has_extra(const RowLane& rl, int packs) {
  return packs > rl.G * kPacks;
}

template <typename scalar_t>
__device__ __forceinline__ typename Elem<scalar_t>::raw_t load_extra(const scalar_t* row, int64_t H, bool holds) {
  using raw_t = typename Elem<scalar_t>::raw_t;
  return holds ? reinterpret_cast<const raw_t*>(row)[H - 1] : raw_t(0);
}

template <typename scalar_t>
__device__ __forceinline__ void store_extra(scalar_t* row, int64_t H, at::opmath_type<scalar_t> v) {
  reinterpret_cast<typename Elem<scalar_t>::raw_t*>(row)[H - 1] = Elem<scalar_t>::from_acc(v);
}

// A row's wide tail (the tail builds, kSamePhaseTail and kRealignedTail: launch_plan.h, row_tail_plan): the 2 to
// kVec - 1 elements past the whole packs its lanes hold, where holding them apart takes fewer lanes than a slot
// for their partial pack (the fused backward's bf16 5125: 640 packs on one CTA of 160 threads, 5 elements apart,
// not 641 on two CTAs of 96). The row's last lane (n > 0; the others n = 0) loads them as raw scalars into
// elements 0..n-1 of a pack (zeros past n; `holds` false: zeros), adds them to its sums after its packs, and
// writes their outputs after every other store of the row, from the same lane: the chunk builds' stores may
// reach into the tail, the same-phase build's `ext` chunk with the right values, the realigned build's chunk
// after the slots (store_row_from, realign_any(v_ext, v_ext, shift)) with wrong ones where the tail runs into the
// chunk after `ext`, which that store does not hold. Only the scalar stores coming last make every tail element
// right, and the scalar path's in every layout: keep them last. Every element before the tail comes from held
// chunks, in every phase. A build of its own: its three packs of registers would spill in the builds of
// one-element tails.
template <typename scalar_t, int kPacks>
__device__ __forceinline__ int row_tail(const RowLane& rl, int64_t H) {
  const int64_t n = H - int64_t(rl.G) * (kPacks * PackOf<scalar_t>::kVec);
  return rl.lane == rl.G - 1 && n > 0 ? static_cast<int>(n) : 0;
}

template <typename scalar_t>
__device__ __forceinline__ Pack load_tail(const scalar_t* row, int64_t H, int n, bool holds) {
  using P = PackOf<scalar_t>;
  const auto* raw = reinterpret_cast<const typename P::raw_t*>(row) + (H - n);
  Pack out = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int k = 0; k + 1 < P::kVec; ++k) {
    if (holds && k < n) P::set(out, k, raw[k]);
  }
  return out;
}

// Writes the tail's outputs, element k from f(k) (opmath), k < n.
template <typename scalar_t, typename F>
__device__ __forceinline__ void store_tail(scalar_t* row, int64_t H, int n, F f) {
  using P = PackOf<scalar_t>;
  auto* raw = reinterpret_cast<typename P::raw_t*>(row) + (H - n);
#pragma unroll
  for (int k = 0; k + 1 < P::kVec; ++k) {
    if (k < n) raw[k] = Elem<scalar_t>::from_acc(f(k));
  }
}

}  // namespace
}  // namespace polynorm
