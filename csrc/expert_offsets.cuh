// The expert of a row for the grouped CUDA kernels (polynorm::grouped_forward and
// grouped_backward; docs/MATH.md, "Grouped PolyNorm", (11)): rows sorted by expert, expert e owning
// rows [offsets[e-1], offsets[e]) (offsets[-1] := 0). Included by cuda/args.cuh (the row and
// tiled kernels, with a per-row expert) and cuda/backward.cu (the per-expert sums).
// - offsets are read on the device, in place, int32 or int64 (widened to 64 bits): no host
//   synchronisation, and a launch is CUDA-graph capturable.
// - The search yields experts in [0, E] only, so offsets that decrease, are negative or exceed
//   M (undefined results) never make a kernel read or write out of bounds.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace polynorm {
namespace {

struct ExpertOffsets {
  const void* ptr;  // [E] int32 or int64: cumulative end offsets, stride apart; nullptr: not grouped
  int64_t stride;
  bool is64;
  int64_t E;
};

ExpertOffsets expert_offsets(const at::Tensor& offsets) {
  return {offsets.const_data_ptr(), offsets.stride(0), offsets.scalar_type() == at::kLong, offsets.size(0)};
}

// offsets[e], widened to 64 bits (a plain global load: L1-cached on Volta and later GPUs).
__device__ __forceinline__ int64_t offset_at(const ExpertOffsets& o, int64_t e) {
  return o.is64 ? static_cast<const int64_t*>(o.ptr)[e * o.stride]
                : static_cast<int64_t>(static_cast<const int32_t*>(o.ptr)[e * o.stride]);
}

// The first e with offsets[e] > row (a binary search: log2(E) reads, L1-cached): row's expert,
// or E for a row of no expert.
__device__ __forceinline__ int64_t expert_of(const ExpertOffsets& o, int64_t row) {
  unsigned lo = 0, hi = static_cast<unsigned>(o.E);  // E < 2^31: the launchers check it
  while (lo < hi) {
    const unsigned mid = (lo + hi) / 2;
    if (offset_at(o, mid) <= row) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The same expert by a warp vote, for a row that every lane of the warp holds (the aligned row kernels'
// rows of 32 threads or more): lane l reads offsets[k + l] for k = 0, 32, ... and the expert is
// the number of offsets <= row, which for nondecreasing offsets is expert_of's first e with
// offsets[e] > row (at most ceil(E / 32) reads a lane, independent, and fewer once a round finds
// an offset past the row, against log2(E) dependent ones; always in [0, E]).
__device__ __forceinline__ int64_t expert_of_warp(const ExpertOffsets& o, int64_t row) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned E = static_cast<unsigned>(o.E);  // < 2^31: the launchers check it
  unsigned count = 0;
  for (unsigned k = 0; k < E; k += 32) {
    const unsigned e = k + lane;
    const unsigned vote = __ballot_sync(0xffffffffu, e < E && offset_at(o, e) <= row);
    count += __popc(vote);
    if (vote != 0xffffffffu) break;  // an offset past the row: the rest are too (nondecreasing)
  }
  return count;
}

}  // namespace
}  // namespace polynorm
