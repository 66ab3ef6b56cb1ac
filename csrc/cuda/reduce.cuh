// The CUDA kernels' reductions, each in a fixed order set by the launch geometry alone (so by
// H and the dtype): over a tiled kernel's block (tile_reduce), a row of one CTA
// (row_reduce) or of a thread-block cluster (cluster_row_reduce), and the backward's dW/dB
// block partials, summed by its last block or by a kernel of their own (ParamGrads,
// finish_param_grads, param_sum_kernel). Lane layout: row_lanes.cuh.
#pragma once

#include "row_lanes.cuh"

#include <cstdint>

namespace polynorm {
namespace {

// Sums N values over the kThreads threads of a tiled kernel's block, which holds one row; every
// thread gets the total. Inside a warp: xor shuffles; then each warp's lane 0 writes its totals to
// shared memory (`smem`: [kThreads / 32][N]) and every thread adds the warp totals in warp order.
// The tree depends only on kThreads. All threads of the block must call it.
template <int kThreads, int N, typename acc_t>
__device__ __forceinline__ void tile_reduce(acc_t (&v)[N], acc_t (*smem)[N]) {
  static_assert(kThreads % 32 == 0, "whole warps");
#pragma unroll
  for (int k = 0; k < N; ++k) {
    for (int off = 16; off > 0; off /= 2) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
  }
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) smem[warp][k] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < N; ++k) {
    acc_t total = smem[0][k];
    for (int w = 1; w < kThreads / 32; ++w) total += smem[w][k];
    v[k] = total;
  }
}

// Sums N values over the G lanes of each row group; every lane gets the total. Inside
// a warp: xor shuffles over offsets < W. Across the G / 32 warps of a larger group: a
// double-buffered shared slot per warp (`red[parity]`), one barrier, then every lane
// adds the warp totals in warp order. The tree depends only on G.
// kRolled (the same-phase and realigned backward builds, backward.cuh kChunks): the cross-warp loop kept rolled, a warp's N sums in one
// shared load for float sums (red 16-byte aligned; fp64 takes two); the same order, warp 0, 1, ...
// for each k. kOneWarp: rows of fewer than 32 lanes (the short-row builds), no cross-warp code.
template <int N, bool kRolled = false, bool kOneWarp = false, typename acc_t>
__device__ __forceinline__ void row_reduce(acc_t (&v)[N], acc_t (*red)[N], const RowLane& rl) {
  if (rl.W == 32) {  // the same tree, unrolled (a row of one warp or more)
#pragma unroll
    for (int k = 0; k < N; ++k) {
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      for (int off = rl.W / 2; off > 0; off /= 2) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
    }
  }
  if (!kOneWarp && rl.G > 32) {
    const int warps = rl.G / 32;
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) red[warp][k] = v[k];
    }
    __syncthreads();
    acc_t(*group_red)[N] = red + (warp - (rl.lane >> 5));  // the row's first warp (one CTA: lane < G)
    if constexpr (kRolled) {
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = group_red[0][k];
#pragma unroll 1
      for (int w = 1; w < warps; ++w) {
#pragma unroll
        for (int k = 0; k < N; ++k) v[k] += group_red[w][k];
      }
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) {
        acc_t total = group_red[0][k];
        for (int w = 1; w < warps; ++w) total += group_red[w][k];
        v[k] = total;
      }
    }
  }
}

// A row grid's staggered start (launch_common.cuh, row_stagger; not the grouped builds): the grid's
// first `wave` clusters (a block of one CTA is a cluster of one) start in four quarters, quarter q waiting
// q * cycles clock cycles before its first row, so that the blocks an SM holds, and the clusters of
// the grid, do not load and compute in step. A persistent grid staggers every cluster; a grid of
// a block per R rows the blocks resident at its start, and its later blocks start as others leave.
struct RowStagger {
  int cycles;  // between quarters; 0: no stagger
  int wave;    // the clusters staggered: those numbered below it
};
__device__ __forceinline__ void stagger_start(int64_t cluster_id, RowStagger stagger) {
  if (stagger.cycles <= 0 || cluster_id >= stagger.wave) return;
  const int64_t at = cluster_id * 4;  // quarter q: at in [q wave, (q + 1) wave)
  const int64_t wave = stagger.wave;
  const int q = (at >= wave) + (at >= 2 * wave) + (at >= 3 * wave);
  const long long wait = static_cast<long long>(q) * stagger.cycles;
  const long long t0 = clock64();
  while (clock64() - t0 < wait) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    __nanosleep(256);
#endif
  }
}

// Rows of thread-block clusters exchange their sums through two mbarriers a CTA, one for each
// row parity (`bars`: static shared memory, at the same offset in every CTA), one arrival each.
// A CTA may write a peer's shared memory, and arrive on its mbarriers, only once the peer has
// started and initialised them (CUDA programming guide, distributed shared memory). So thread 0
// initialises both (then fence.mbarrier_init, so that a peer past the start barrier sees them),
// every CTA of the cluster arrives at the cluster barrier (relaxed) when it starts, and waits on
// it once, before its first store into a peer: the row's loads are in flight meanwhile. A
// cluster with no row waits at the kernel's end. `phases`: bit p, the phase of bars[p] awaited
// next. Rows of one CTA (C = 1) do none of this.
struct ClusterStart {
  bool pending;  // arrived, not yet waited
  unsigned phases;
  uint64_t* bars;
  __device__ __forceinline__ ClusterStart(int C, uint64_t* mbarriers) : pending(C > 1), phases(0u), bars(mbarriers) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (pending) {
      if (threadIdx.x == 0) {
        const uint32_t b0 = static_cast<uint32_t>(__cvta_generic_to_shared(bars));
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b0) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b0 + 8u) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      }
      __syncwarp();  // thread 0 arms bars before its start wait; its warp's view (racecheck's) of the init
      __cluster_barrier_arrive_relaxed();
    }
#endif
  }
  __device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (pending) __cluster_barrier_wait();
#endif
    pending = false;
  }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// st.async of one value into a peer's shared memory (`slot`, `bar`: shared::cluster addresses),
// completing its bytes on the peer's mbarrier.
__device__ __forceinline__ void store_async(uint32_t slot, float v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
               ::"r"(slot), "r"(__float_as_uint(v)), "r"(bar) : "memory");
}
__device__ __forceinline__ void store_async(uint32_t slot, double v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];"
               ::"r"(slot), "l"(__double_as_longlong(v)), "r"(bar) : "memory");
}
// The shared::cluster address of a shared-memory address of this CTA in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t peer_address(uint32_t local, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
#endif

// Sums N values over a row held by a cluster of C CTAs of G threads each (G a multiple of
// 32); every lane gets the total. Each warp's total goes to its slot (the row's warp index,
// rl.lane / 32) in every CTA's `slots` (dynamic shared memory, [2][C G / 32][N]): thread 0 arms
// its CTA's mbarrier of the row's parity for the row's slot bytes (arrive.expect_tx), lanes
// 0..C-1 store into peer `lane` by st.async, each store completing its bytes on that peer's
// mbarrier, and every thread waits on its own CTA's mbarrier only (no CTA waits for all of a
// peer's threads, as the cluster barrier does). The wait acquires at CTA scope, as CUTLASS's
// transaction barriers (multicast bulk copies issued by other CTAs) and QuACK's cluster reduction
// do: the mbarrier's transaction count covers the peers' st.async bytes in this CTA's shared
// memory, all the exchange reads. This rests on that established practice: the PTX memory model's
// letter pairs st.async's cluster-scope release with an acquire whose scope includes the peer. At cluster scope
// (`.acquire.cluster`) ptxas invalidates the whole L1 after every wait (CCTL.IVALL: 11% of the
// bf16 131072 backward's stall samples, bench/results/h200-cluster-ctas/ncu.tgz). Then every lane
// adds all C G / 32 slots in a fixed order: lane l slots l, l + 32, ..., then an xor tree. The tree
// depends only on C G. Double-buffered by row parity: a peer writes slots of parity p again only
// after its wait on the next row, which needs this CTA's stores of that row, which each warp
// makes after it has read the slots of p. Before its first store into a peer, a CTA waits once
// on the cluster's start barrier (`started`, ClusterStart above). Against the cluster barrier,
// the same bits and less time: the backward at 65536 1.338 -> 1.203 of an add
// (bench/results/h200-clusters-of-16/tune_tx.log: b, b-tx).
template <int N, typename acc_t>
__device__ __forceinline__ void cluster_row_reduce(acc_t (&v)[N], acc_t* slots, int parity, const RowLane& rl,
                                                   int C, ClusterStart& started) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#pragma unroll
  for (int k = 0; k < N; ++k) {
    for (int off = 16; off > 0; off /= 2) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
  }
  const int warps = rl.G / 32;
  acc_t* buffer = slots + parity * warps * N;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(started.bars + parity));
  if (threadIdx.x == 0) {
    const uint32_t bytes = static_cast<uint32_t>(warps * N * sizeof(acc_t));
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
  }
  started.wait();  // every peer has started, its mbarriers initialised
  // Every lane's reads of the previous row's slots (the other parity) come before this warp's
  // stores of this row, which (once every warp's have landed) let the peers write that parity
  // again: the shuffle tree orders them by data alone; this makes it an ordering of the warp.
  __syncwarp();
  if (lane < C) {
    const uint32_t slot = static_cast<uint32_t>(__cvta_generic_to_shared(buffer + (rl.lane / 32) * N));
    const uint32_t peer_slot = peer_address(slot, lane), peer_bar = peer_address(bar, lane);
#pragma unroll
    for (int k = 0; k < N; ++k) store_async(peer_slot + k * uint32_t(sizeof(acc_t)), v[k], peer_bar);
  }
  const uint32_t phase = (started.phases >> parity) & 1u;
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done) : "r"(bar), "r"(phase) : "memory");
  } while (!done);
  started.phases ^= 1u << parity;
  // Lane l adds the slots of warps l, l + 32, ... in turn (each sum from zero), then the xor tree: four
  // float sums a slot in one 16-byte read (buffer is 16-byte aligned: the slots start so, a parity's
  // slots are warps * 16 bytes), in the same order as one sum at a time, with a quarter of the
  // shared-memory reads (PolyNorm's backward so at 131072 / 262144: 1.13 / 1.21 of an add, bf16 at
  // M·H = 2^26, bench/results/h200-staged-rows/tune.log). The forward's three sums padded to four
  // and read so gain nothing measurable, hence N == 4 only.
  acc_t total[N];
#pragma unroll
  for (int k = 0; k < N; ++k) total[k] = acc_t(0);
  if constexpr (N == 4 && sizeof(acc_t) == 4) {
#pragma unroll 2  // unrolled further, ptxas spilled in the aligned backward
    for (int w = lane; w < warps; w += 32) {
      const float4 t = *reinterpret_cast<const float4*>(buffer + w * N);
      total[0] += t.x;
      total[1] += t.y;
      total[2] += t.z;
      total[3] += t.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      for (int w = lane; w < warps; w += 32) total[k] += buffer[w * N + k];
    }
  }
#pragma unroll
  for (int k = 0; k < N; ++k) {
    for (int off = 16; off > 0; off /= 2) total[k] += __shfl_xor_sync(0xffffffffu, total[k], off);
    v[k] = total[k];
  }
#else
  __trap();  // clusters are launched on sm_90 and later only (plan_for)
#endif
}

// Where a backward launch puts dW and dB (docs/MATH.md): each block writes its partial
// sums [dw0, dw1, dw2, db] for its rows, and the last block to finish sums all the partials
// (finish_param_grads); or, for a row launch with `apart`, a kernel of its own does, launched
// right after it (param_sum_kernel; launch_backward.cuh, launch_backward_row says when).
template <typename acc_t>
struct ParamGrads {
  acc_t* partials;          // [the backward grid's blocks, 4] opmath: one block's sums each
  unsigned int* arrivals;   // blocks done so far; 0 between launches (unused with `apart`)
  acc_t* grad_weight;       // (3,) opmath: [dw0, dw1, dw2]
  acc_t* grad_bias;         // (1,) opmath
  bool apart = false;       // row kernels: param_sum_kernel sums the partials, not the last block
};

// The partials' sum in a fixed order, by `threads` threads (`tid`: this one's index, the
// threads a multiple of 32, at most 1024) of one block: thread t adds blocks t, t + threads, ...
// (all four columns, one 16-byte load a block for fp32), then each warp's xor tree, then the
// warps in order; so the bits depend only on `blocks` and `threads`. Every thread loads, so many
// partials (a block per R rows) are summed in a few round trips. kBatch: 1, a block's partial at
// a time (the row kernels' last block: few partials); more, kBatch blocks' loads in flight at once,
// then added in the same order, a conditional add each (the same bits; param_sum_kernel).
template <typename acc_t>
__device__ __forceinline__ void load_partial(const ParamGrads<acc_t>& pg, int64_t b, acc_t (&p)[4]) {
  if constexpr (sizeof(acc_t) == 4) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(pg.partials) + b);
    p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) p[k] = __ldcg(pg.partials + b * 4 + k);
  }
}
template <typename acc_t, int kBatch>
__device__ __forceinline__ void sum_param_partials(const ParamGrads<acc_t>& pg, int tid, int threads, int64_t blocks) {
  __shared__ acc_t warp_sums[32][4];
  acc_t t[4] = {acc_t(0), acc_t(0), acc_t(0), acc_t(0)};
  if constexpr (kBatch == 1) {
#pragma unroll 4
    for (int64_t b = tid; b < blocks; b += threads) {
      acc_t p[4];
      load_partial(pg, b, p);
#pragma unroll
      for (int k = 0; k < 4; ++k) t[k] += p[k];
    }
  } else {
    for (int64_t b0 = tid; b0 < blocks; b0 += int64_t(kBatch) * threads) {
      acc_t p[kBatch][4];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (b0 + int64_t(u) * threads < blocks) load_partial(pg, b0 + int64_t(u) * threads, p[u]);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (b0 + int64_t(u) * threads < blocks) {
#pragma unroll
          for (int k = 0; k < 4; ++k) t[k] += p[u][k];
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    for (int off = 16; off > 0; off /= 2) t[k] += __shfl_xor_sync(0xffffffffu, t[k], off);
  }
  if (tid % 32 == 0) {
#pragma unroll
    for (int k = 0; k < 4; ++k) warp_sums[tid / 32][k] = t[k];
  }
  __syncthreads();
  if (tid < 4) {
    acc_t total = warp_sums[0][tid];
    for (int w = 1; w < threads / 32; ++w) total += warp_sums[w][tid];
    if (tid < 3) {
      pg.grad_weight[tid] = total;
    } else {
      pg.grad_bias[0] = total;
    }
  }
}

// Called by every thread of a block right after its threads have written the block's
// partial (`tid`: the thread's index in the block of `threads`, a multiple of 32, at most
// 1024). The last block to arrive sums the partials (sum_param_partials): the bits depend only
// on the grid and block sizes, not on which block is last, and there are no atomics on the
// values: the same bits on every run. This replaces a second kernel launch (the
// threadFenceReduction pattern of the CUDA samples) for grids of few rounds; it costs the fences:
// every block waits for its last stores before it draws its ticket, which a grid of many rounds
// pays in every block (bf16 4096: 1.112 of an add against 1.092 summed apart,
// bench/results/h200-param-sums/tune.log: b-a0, b), hence param_sum_kernel.
// atomicInc wraps the counter back to 0 on the last block, ready for the next launch;
// launches on one stream never overlap, so one counter per stream suffices
// (arrival_counter), and a launch captured in a CUDA graph has a counter of its own.
template <typename acc_t>
__device__ __forceinline__ void finish_param_grads(const ParamGrads<acc_t>& pg, int tid, int threads) {
  __shared__ bool last;
  __threadfence();  // this block's partial is visible to all blocks before it is counted
  __syncthreads();
  if (tid == 0) {
    __threadfence();  // cumulative: the partial's stores, ordered before it by the barrier
    last = atomicInc(pg.arrivals, gridDim.x - 1) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // every other block's partial is visible to this one
  sum_param_partials<acc_t, 1>(pg, tid, threads, int64_t(gridDim.x));
}

// The row backward's partials summed apart (ParamGrads::apart): one block of kParamSumThreads,
// launched right after the row kernel as a programmatic dependent launch on sm_90
// (launch_backward.cuh, launch_param_sum), so it is placed once every block of the row kernel has left its rows
// (allow_param_sum) and waits here for the row kernel to complete and its stores to be visible
// (griddepcontrol.wait; without that launch attribute, stream order alone, and the wait returns
// at once). No fence, no ticket. Placed once every block has started instead (the trigger before
// the rows), it costs the persistent grids 1-2% (bench/results/h200-param-sums/tune.log: bw1-a1
// against bw1-a2). Its loads batched (8 blocks' partials in flight a thread for fp32, 49
// registers; 4 for fp64, 57), not one block's at a time (25 registers), so that one thread's sum
// waits on 8 loads at once, not on each in turn; on 256 threads it is no faster. The row kernels'
// last-block sum takes one partial at a time: batched there, ptxas moved a row load below the
// row's first wait in the bf16 and fp16 backward kernels (bench/sass_load_order.py).
constexpr int kParamSumThreads = 1024;
template <typename acc_t>
__global__ void __launch_bounds__(kParamSumThreads) param_sum_kernel(ParamGrads<acc_t> pg, int64_t blocks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  sum_param_partials<acc_t, sizeof(acc_t) == 4 ? 8 : 4>(pg, int(threadIdx.x), int(blockDim.x), blocks);
}

// The row kernel's side of it: let the sum's launch start (griddepcontrol.launch_dependents;
// it begins once every block of the grid has called this or exited).
__device__ __forceinline__ void allow_param_sum() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace
}  // namespace polynorm
