// Rows as 16-byte packs, for every CUDA kernel: Pack, Elem and PackOf (raw elements and their
// conversion), ParamRef/load_param (parameters read on the device), load_pack/store_pack (the
// tiled kernels' access), then the row kernels' lane layout and the realignment of misaligned
// rows (RowLane ... store_own_chunk; the one-phase realignment: issue_row_at ... store_row_from).
// Reductions: reduce.cuh; kernel arguments: args.cuh;
// kernels: forward.cuh, backward.cuh; host side and overview: launch.cuh.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/core/ScalarType.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace polynorm {
namespace {

// A pack is 16 bytes of one row, kept as four raw 32-bit words. Elements are
// converted to opmath when used, not when loaded: the registers hold the row in its
// own (narrow) dtype, and keep_raw() stops the compiler from caching the converted
// values across the row reduction instead (twice the registers for fp16/bf16).
using Pack = uint4;

__device__ __forceinline__ uint32_t& word(Pack& p, int i) { return i == 0 ? p.x : i == 1 ? p.y : i == 2 ? p.z : p.w; }
__device__ __forceinline__ uint32_t word(const Pack& p, int i) {
  return i == 0 ? p.x : i == 1 ? p.y : i == 2 ? p.z : p.w;
}
__device__ __forceinline__ void keep_raw(Pack& p) {
  asm volatile("" : "+r"(p.x), "+r"(p.y), "+r"(p.z), "+r"(p.w));
}

// Element access and conversion by dtype. Raw bits travel as uint16/32/64.
template <typename scalar_t>
struct Elem;

template <>
struct Elem<float> {
  using raw_t = uint32_t;
  __device__ static float to_acc(raw_t r) { return __uint_as_float(r); }
  __device__ static raw_t from_acc(float v) { return __float_as_uint(v); }
};
template <>
struct Elem<double> {
  using raw_t = unsigned long long;
  __device__ static double to_acc(raw_t r) { return __longlong_as_double(static_cast<long long>(r)); }
  __device__ static raw_t from_acc(double v) { return static_cast<raw_t>(__double_as_longlong(v)); }
};
template <>
struct Elem<c10::Half> {
  using raw_t = unsigned short;
  __device__ static float to_acc(raw_t r) { return __half2float(__ushort_as_half(r)); }
  __device__ static raw_t from_acc(float v) { return __half_as_ushort(__float2half_rn(v)); }
};
template <>
struct Elem<c10::BFloat16> {
  using raw_t = unsigned short;
  __device__ static float to_acc(raw_t r) { return __uint_as_float(static_cast<uint32_t>(r) << 16); }
  __device__ static raw_t from_acc(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};

template <typename scalar_t>
struct PackOf {
  using raw_t = typename Elem<scalar_t>::raw_t;
  static constexpr int kVec = 16 / sizeof(scalar_t);

  __device__ static raw_t get(const Pack& p, int e) {
    if constexpr (sizeof(raw_t) == 2) {
      return static_cast<raw_t>(word(p, e / 2) >> (16 * (e % 2)));
    } else if constexpr (sizeof(raw_t) == 4) {
      return word(p, e);
    } else {
      return (static_cast<raw_t>(word(p, 2 * e + 1)) << 32) | word(p, 2 * e);
    }
  }
  __device__ static void set(Pack& p, int e, raw_t r) {
    if constexpr (sizeof(raw_t) == 2) {
      uint32_t& w = word(p, e / 2);
      w = e % 2 == 0 ? (w & 0xffff0000u) | r : (w & 0x0000ffffu) | (static_cast<uint32_t>(r) << 16);
    } else if constexpr (sizeof(raw_t) == 4) {
      word(p, e) = r;
    } else {
      word(p, 2 * e) = static_cast<uint32_t>(r);
      word(p, 2 * e + 1) = static_cast<uint32_t>(r >> 32);
    }
  }
  __device__ static at::opmath_type<scalar_t> value(const Pack& p, int e) { return Elem<scalar_t>::to_acc(get(p, e)); }
  // Rounds and stores element e of every pack from f(e): two 16-bit elements a word with
  // one paired conversion (cvt.rn.bf16x2.f32 / f16x2) instead of two and a merge.
  template <typename F>
  __device__ static Pack make(F f) {
    Pack out;
    if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(f(2 * w), f(2 * w + 1));
        word(out, w) = *reinterpret_cast<const uint32_t*>(&v);
      }
    } else if constexpr (std::is_same_v<scalar_t, c10::Half>) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const __half2 v = __floats2half2_rn(f(2 * w), f(2 * w + 1));
        word(out, w) = *reinterpret_cast<const uint32_t*>(&v);
      }
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) set(out, e, Elem<scalar_t>::from_acc(f(e)));
    }
    return out;
  }
};

// A weight or bias element of any float dtype, read on the device so that no host
// synchronisation (and no conversion kernel) is needed.
struct ParamRef {
  const void* ptr;
  int64_t stride;
  c10::ScalarType dtype;
};

template <typename acc_t>
__device__ __forceinline__ acc_t load_param(const ParamRef& p, int64_t i) {
  switch (p.dtype) {
    case c10::ScalarType::Double:
      return static_cast<acc_t>(static_cast<const double*>(p.ptr)[i * p.stride]);
    case c10::ScalarType::Half:
      return static_cast<acc_t>(static_cast<float>(static_cast<const c10::Half*>(p.ptr)[i * p.stride]));
    case c10::ScalarType::BFloat16:
      return static_cast<acc_t>(static_cast<float>(static_cast<const c10::BFloat16*>(p.ptr)[i * p.stride]));
    default:
      return static_cast<acc_t>(static_cast<const float*>(p.ptr)[i * p.stride]);
  }
}

// Loads pack `p` of a row (columns p*VEC .. p*VEC+VEC-1), zero past H. The
// element-wise path (misaligned rows, the tail of an odd H) gives the same values.
template <typename scalar_t>
__device__ __forceinline__ Pack load_pack(const scalar_t* row, int64_t p, int64_t H, bool vec_ok) {
  using P = PackOf<scalar_t>;
  const int64_t col = p * P::kVec;
  if (vec_ok && col + P::kVec <= H) return *reinterpret_cast<const Pack*>(row + col);
  const auto* raw = reinterpret_cast<const typename P::raw_t*>(row);
  Pack out = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int e = 0; e < P::kVec; ++e) {
    if (col + e < H) P::set(out, e, raw[col + e]);
  }
  return out;
}

template <typename scalar_t>
__device__ __forceinline__ void store_pack(scalar_t* row, int64_t p, int64_t H, bool vec_ok, const Pack& val) {
  using P = PackOf<scalar_t>;
  const int64_t col = p * P::kVec;
  if (vec_ok && col + P::kVec <= H) {
    *reinterpret_cast<Pack*>(row + col) = val;
    return;
  }
  auto* raw = reinterpret_cast<typename P::raw_t*>(row);
#pragma unroll
  for (int e = 0; e < P::kVec; ++e) {
    if (col + e < H) raw[col + e] = P::get(val, e);
  }
}

// ----------------------------------------------------------------------------------
// Row kernels (v5, v8): a row held in registers by G threads with few threads a row and
// many bytes a thread (kPacks 16-byte packs; rows of whole packs: 256 bytes of x forward,
// 128 each of x and grad_y backward; 2-byte odd H forward half as many; a pack fewer where
// launch_plan.h's row_packs trims a half-idle warp), so that an SM
// keeps ~128 KB of loads in flight with no barrier but the reduction's. This is the layout of QuACK's norms (Tri Dao et al.). Used for
// every row that one CTA or a thread-block cluster holds (launch_plan.h's table).
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
// ----------------------------------------------------------------------------------

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
// instructions, paid a row; bench/NOTES.md v10): G threads a row is a power of two whenever a
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
// kWholeWarps: the build serves rows of 32 lanes or more only (launch.cuh, row_kernel), so W = 32
// is known at compile time: every slot's index and test is a constant offset. Measured on the
// misaligned builds (bench/NOTES.md v25): with the same-phase backward's patches, the 5125
// backward 1.30 -> 1.14 of an add and 12% fewer instructions; the odd-H forwards 2-5% faster.
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
// their arithmetic is skipped in the aligned builds (measured: in the realigning builds the
// skip cost more in spills than it saved, bench/NOTES.md v5), but for the backward's sums,
// which add their zeros (the skip in its class loop spilled 156 bytes, NOTES v17).
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
// through the array form above: through it ptxas scheduled that backward otherwise, 1.5% slower in
// ncu at bf16 5125 / 16385 (bench/NOTES.md v26, call 1). So is mask_row_ends' two-tensor form.
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
// aligned build sums them (bench/NOTES.md v28: the backward at a view of x one element in, bf16
// H = 4096, 0.97 of its add so, 1.06 in the one-phase realigned build); the forward's also serves
// where the stage does not fit a block, and the narrow builds' aligned rows.
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

// Whether a row build serves rows of fewer than 32 lanes only (launch.cuh, row_kernel): a
// realigning or same-phase build without kWholeWarps, but not a grouped one (one build for every
// row). Such rows are one warp segment of one CTA: no cross-warp sum, no cluster.
constexpr bool short_rows(int layout, bool whole_warps, bool grouped) {
  return layout != kAligned && layout != kAlignedStaged && !whole_warps && !grouped;
}

// Same-phase rows (every tensor of a row starts at the same offset into its 16-byte chunk,
// as odd-H rows of contiguous tensors do): the elementwise part runs on the chunks as
// loaded, and only the forward's sums see realigned packs (the backward's take the aligned
// row's order class by class: backward.cuh, class_sums), so that the sums' order, and so the
// bits, are those of the aligned row. The stores then write whole aligned chunks, narrowly only at the
// row's two ends (store_own_chunk).
// The forward's sums read realigned packs through shared memory (bench/NOTES.md v13; before, a
// shuffle and selects a pack, ~27 instructions a pack and tensor, a third of them the selects
// of a run-time word offset, as realign_any). Each warp stages its row's chunks in its own
// area, [kPacks + 1 slots][4 words][32 lanes] (a warp access of one word is conflict-free):
// slot i, column l holds lane l's chunk i, and slot kPacks the segment's next chunk (ext,
// written by its last lane at its segment's first column). A lane's realigned pack i is then
// five words read at offsets fixed for the row (StageWindow: its chunk's, then the next
// chunk's: the next lane's, or for a segment's last lane, its first lane's in the next slot)
// and four funnel shifts for a shift that is not a multiple of 4: ~13 instructions a pack and
// tensor. The bytes are realign_any's of the chunk and the next one, as finish_row's. The
// forward's same-phase and realigned builds stage; the backward's sums go in the class order
// instead (backward.cuh class_sums, NOTES v17).
constexpr int stage_words(int packs) { return (packs + 1) * 4 * 32; }

// Stages the warp's chunks (after mask_row_end). The two __syncwarp: every lane has read the
// warp's previous row before any lane overwrites it, and has written this one before any reads.
template <int kPacks>
__device__ __forceinline__ void stage_row(uint32_t* area, const Pack (&buf)[kPacks], const Pack& ext,
                                          const RowLane& rl) {
  __syncwarp();
  const int lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
#pragma unroll
    for (int k = 0; k < 4; ++k) area[(i * 4 + k) * 32 + lane] = word(buf[i], k);
  }
  if (rl.j == rl.W - 1) {
#pragma unroll
    for (int k = 0; k < 4; ++k) area[(kPacks * 4 + k) * 32 + lane - (rl.W - 1)] = word(ext, k);
  }
  __syncwarp();
}

// Where a lane reads word k (0..4) of its realigned pack in slot 0 (slot i: + i * 128), and
// the funnel shift that drops the shift's bytes below a word (0 for 4- and 8-byte elements).
struct StageWindow {
  int off[5];
  unsigned bits;
};

__device__ __forceinline__ StageWindow stage_window(int shift, const RowLane& rl) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int w = shift >> 2;
  const bool seg_last = rl.j == rl.W - 1;
  StageWindow sw;
#pragma unroll
  for (int k = 0; k < 5; ++k) {
    const int m = w + k;  // word m of the lane's chunk and the next one
    sw.off[k] = m < 4 ? m * 32 + lane : seg_last ? 128 + (m - 4) * 32 + lane - (rl.W - 1) : (m - 4) * 32 + lane + 1;
  }
  sw.bits = static_cast<unsigned>(shift & 3) * 8;
  return sw;
}

template <typename scalar_t>
__device__ __forceinline__ Pack staged_pack(const uint32_t* area, const StageWindow& sw, int i) {
  const uint32_t* slot = area + i * 128;
  uint32_t v[5];
#pragma unroll
  for (int k = 0; k < 5; ++k) v[k] = slot[sw.off[k]];
  if constexpr (sizeof(scalar_t) >= 4) return make_uint4(v[0], v[1], v[2], v[3]);  // shifts of whole words
  return make_uint4(__funnelshift_r(v[0], v[1], sw.bits), __funnelshift_r(v[1], v[2], sw.bits),
                    __funnelshift_r(v[2], v[3], sw.bits), __funnelshift_r(v[3], v[4], sw.bits));
}

// Writes chunk p of a same-phase row: bytes [shift, 16) of the first chunk, [0, end - 16 p)
// of the last, the whole chunk in between. `dst`: the row's first chunk; `end`: the row's
// end in bytes from it.
template <typename scalar_t>
__device__ __forceinline__ void store_own_chunk(Pack* dst, int p, const Pack& v, int shift, int end) {
  const int lo = p == 0 ? shift : 0;
  const int hi = min(16, end - 16 * p);
  if (lo == 0 && hi == 16) {
    dst[p] = v;
  } else {
    store_chunk_part<scalar_t>(dst + p, v, lo, hi);
  }
}

// store_own_chunk with the chunk's bytes ending at `hi` (1..16) rather than at the row's end.
template <typename scalar_t>
__device__ __forceinline__ void store_own_chunk_part(Pack* dst, int p, const Pack& v, int shift, int hi) {
  const int lo = p == 0 ? shift : 0;
  if (lo == 0 && hi == 16) {
    dst[p] = v;
  } else {
    store_chunk_part<scalar_t>(dst + p, v, lo, hi);
  }
}
// ----------------------------------------------------------------------------------
// The realigned backward (backward.cuh, kRealigned): a row's tensors start at different offsets
// into their 16-byte chunks (a view one element in beside contiguous tensors, odd H). It works
// in one phase a row, that of x's, grad_y's or grad_x's rows (launch.cuh picks the one most
// tensors share): every input is held as the chunks of that phase, as the same-phase build holds
// its rows, so that its sums (class_sums) and its elementwise part are the same-phase build's.
// An input of another phase is realigned into it as it arrives (issue_row_at, finish_row_at), and
// an output of another phase realigned out of it as it is stored (store_row_from): a shuffle and a
// realignment a chunk of each such tensor only. (Before, every misaligned tensor was realigned to
// whole packs and back: a view of x and grad_y one element in at odd H read 1.31-1.50 of an add,
// bench/NOTES.md v26-v27.)
// Chunk q of a row in phase `phase` holds the row's bytes [16 q - phase, 16 q + 16 - phase).
// ----------------------------------------------------------------------------------

// Issues the loads of a row for finish_row_at. Without `realign` the row is in `phase` (its
// chunks as loaded: issue_row's). Otherwise chunk q in `phase` is realign_any(base[q], base[q + 1],
// start - phase) of the aligned chunks `base` from which the row's first byte lies `start` bytes
// on (start - phase in 0..15: start is the row's offset into its first chunk, or 16 more where
// that offset is below `phase`, base then one chunk earlier, never loaded). The segment's last
// lane holds the chunk after its slots in `ext` and, realigning, the one after that in `ext2`.
// Returns `start`.
template <typename scalar_t, int kPacks, bool kMayBeEmpty = false>
__device__ __forceinline__ int issue_row_at(Pack (&buf)[kPacks], Pack& ext, Pack& ext2, const scalar_t* row,
                                            int64_t H, const RowLane& rl, int phase, bool realign) {
  const int offset = static_cast<int>(reinterpret_cast<uintptr_t>(row) & 15);
  const int start = realign && offset < phase ? 16 + offset : offset;
  const Pack* base = reinterpret_cast<const Pack*>(reinterpret_cast<const char*>(row) - start);
  const int first = start >> 4;  // base[0] before the row (start >= 16): not loaded
  int chunks = static_cast<int>((start + H * int64_t(sizeof(scalar_t)) + 15) / 16);
  if (kMayBeEmpty && H == 0) chunks = first;  // no chunk (as issue_row)
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const int p = rl.base + i * rl.W;
    buf[i] = unsigned(p - first) < unsigned(chunks - first) ? base[p] : make_uint4(0u, 0u, 0u, 0u);
  }
  const bool last = rl.j == rl.W - 1;
  ext = last && rl.seg_end < chunks ? base[rl.seg_end] : make_uint4(0u, 0u, 0u, 0u);
  ext2 = realign && last && rl.seg_end + 1 < chunks ? base[rl.seg_end + 1] : make_uint4(0u, 0u, 0u, 0u);
  return start;
}

// Completes issue_row_at: zeroes what the chunks hold past the row's end (mask_row_end, and ext2
// where it holds that end), then, `realign`, realigns the chunks into `phase`: slot i from its
// chunk and the next one (the next lane's slot i; for the segment's last lane, lane 0's slot i +
// 1, or ext after its last slot), ext from ext and ext2. Then every chunk holds the row's bytes in
// `phase` and zeros past its end.
template <typename scalar_t, int kPacks>
__device__ __forceinline__ void finish_row_at(Pack (&buf)[kPacks], Pack& ext, Pack& ext2, int start, int64_t H,
                                              const RowLane& rl, int phase, bool realign) {
  const int end = start + static_cast<int>(H) * int(sizeof(scalar_t));
  mask_row_end(buf, ext, end, rl, true);
  if (!realign) return;
  if (end > 0 && rl.j == rl.W - 1 && (end - 1) / 16 == rl.seg_end + 1) {  // the end's chunk in ext2
    const int keep = end - 16 * (rl.seg_end + 1);
#pragma unroll
    for (int k = 0; k < 4; ++k) word(ext2, k) &= keep_mask(keep - 4 * k);
  }
  const int shift = start - phase;
  realign_slots(buf, ext, rl, shift);
  ext = realign_any(ext, ext2, shift);
}

// Stores a row held as chunks in `phase` (v; the last segment's last lane: `v_ext`, the chunk
// after its slots) into `row`, which starts elsewhere in its chunk (at `to`): its chunk q from
// the held chunks q - up and q - up + 1 (up = 1 where `to` > `phase`), `shift` = phase - to (mod
// 16) bytes on. Narrowly only at the row's two ends and where two segments meet: a segment's
// last lane writes the part of its last chunk that its own slot holds, the next segment's first
// lane the rest (as store_row).
template <typename scalar_t, int kPacks>
__device__ __forceinline__ void store_row_from(scalar_t* row, const Pack (&v)[kPacks], const Pack& v_ext, int64_t H,
                                               const RowLane& rl, int phase, bool last_segment, bool active) {
  const int to = static_cast<int>(reinterpret_cast<uintptr_t>(row) & 15);
  Pack* dst = reinterpret_cast<Pack*>(reinterpret_cast<char*>(row) - to);
  const int end = to + static_cast<int>(H) * int(sizeof(scalar_t));  // the row's end, in bytes from dst
  const int chunks = (end + 15) / 16;
  const int shift = (phase - to) & 15;
  const int up = phase < to ? 1 : 0;
  const int from = rl.j + 1 == rl.W ? 0 : rl.j + 1;
  const bool seg_last_lane = rl.j == rl.W - 1;
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const Pack offer = (rl.j == 0 && i + 1 < kPacks) ? v[i + 1 < kPacks ? i + 1 : i] : v[i];
    Pack next = shfl_pack(offer, from, rl.W);  // every lane takes part
    const bool seg_last = seg_last_lane && i + 1 == kPacks;  // next: the next segment's (or v_ext)
    if (seg_last) next = v_ext;
    const int q = rl.base + i * rl.W + up;
    if (!active || q >= chunks) continue;
    // The segment's last chunk: only its own bytes, but in the last segment (v_ext follows).
    const int hi = min(seg_last && !last_segment ? 16 - shift : 16, end - 16 * q);
    store_own_chunk_part<scalar_t>(dst, q, realign_any(v[i], next, shift), to, hi);
  }
  if (!active) return;
  // The head of a segment's first chunk: the bytes [16 - shift, 16) of chunk base + up - 1 (the
  // row's first chunk: from `to` on; before the first segment with up = 0: not the row's).
  const int head = rl.base + up - 1;
  if (rl.j == 0 && shift != 0 && head >= 0) {
    store_chunk_part<scalar_t>(dst + head, realign_any(v[0], v[0], shift), max(16 - shift, head == 0 ? to : 0),
                               min(16, end - 16 * head));
  }
  // The row's chunk after the last segment's slots.
  if (last_segment && seg_last_lane && rl.seg_end + up < chunks) {
    store_own_chunk_part<scalar_t>(dst, rl.seg_end + up, realign_any(v_ext, v_ext, shift), to,
                                   min(16, end - 16 * (rl.seg_end + up)));
  }
}

// A thread's stage (kAlignedStaged: CTAs of kStageThreads (launch_plan.h's kRowStageThreads) threads, rows of whole warps, so a lane's packs are
// base + 32 i): slot i of tensor t at stage[(t kPacks + i) kStageThreads + threadIdx.x], so that a warp's 16-byte
// reads and writes are consecutive and every slot's address a constant offset from the thread's first.
// stage_copies issues one cp.async a slot of a row into tensor t's slots (zero-filled past the row's packs:
// the table stages only rows whose every slot is in the row, launch_plan.h row_staged, so that is defensive);
// `after`, a zero computed from the registers last read from the stage, orders the copies after those reads.
// Each thread reads back only what it copied itself (cp.async.wait_group makes a thread's own copies visible
// to it): no barrier.
constexpr int kStageThreads = 256;  // = kRowStageThreads (launch_plan.h; static_assert in backward.cuh)
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
// chunks (a review's element-level model of every phase, bench/NOTES.md v33). A build of its own: its three packs
// of registers would spill in the builds of one-element tails.
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
