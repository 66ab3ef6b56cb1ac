// The row kernels' rows held as 16-byte chunks in a phase of their own, not realigned to packs:
// same-phase rows (every tensor's rows start alike: the forward's stage, stage_row ...
// staged_pack, and the stores of whole chunks, store_own_chunk) and the realigned builds' one
// phase a row (issue_row_at, finish_row_at, store_row_from). Lane layout: row_lanes.cuh.
#pragma once

#include "packs.cuh"
#include "row_lanes.cuh"

#include <cstdint>

namespace polynorm {
namespace {

// Same-phase rows (every tensor of a row starts at the same offset into its 16-byte chunk,
// as odd-H rows of contiguous tensors do): the elementwise part runs on the chunks as
// loaded, and only the forward's sums see realigned packs (the backward's take the aligned
// row's order class by class: backward.cuh, class_sums), so that the sums' order, and so the
// bits, are those of the aligned row. The stores then write whole aligned chunks, narrowly only at the
// row's two ends (store_own_chunk).
// The forward's sums read realigned packs through shared memory, not through a shuffle and
// selects a pack (~27 instructions a pack and tensor, a third of them the selects of a run-time
// word offset, as realign_any). Each warp stages its row's chunks in its own
// area, [kPacks + 1 slots][4 words][32 lanes] (a warp access of one word is conflict-free):
// slot i, column l holds lane l's chunk i, and slot kPacks the segment's next chunk (ext,
// written by its last lane at its segment's first column). A lane's realigned pack i is then
// five words read at offsets fixed for the row (StageWindow: its chunk's, then the next
// chunk's: the next lane's, or for a segment's last lane, its first lane's in the next slot)
// and four funnel shifts for a shift that is not a multiple of 4: ~13 instructions a pack and
// tensor. The bytes are realign_any's of the chunk and the next one, as finish_row's. The
// forward's same-phase and realigned builds stage; the backward's sums go in the class order
// instead (backward.cuh, class_sums).
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

// The realigned builds (kRealigned): a row's tensors start at different offsets into their
// 16-byte chunks (a view one element in beside contiguous tensors, odd H). They work in one phase
// a row, that of one tensor's rows (launch_plan.h, realign_phase: x's, grad_y's or grad_x's
// backward, x's or y's forward): every input is held as the chunks of that phase, as the
// same-phase build holds its rows, so that the sums and the elementwise part are the same-phase
// build's. An input of another phase is realigned into it as it arrives (issue_row_at,
// finish_row_at), an output of another phase out of it as it is stored (store_row_from): a
// shuffle and a realignment a chunk of each such tensor only. Realigning every misaligned tensor
// to whole packs and back instead, a view of x and grad_y one element in at odd H read 1.31-1.50
// of an add (bench/results/h200-misaligned-rows/compare_mn.log, the m build's rows Hv).
// Chunk q of a row in phase `phase` holds the row's bytes [16 q - phase, 16 q + 16 - phase).

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

}  // namespace
}  // namespace polynorm
