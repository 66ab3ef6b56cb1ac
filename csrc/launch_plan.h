// Which CUDA kernel serves a PolyNorm row, and with what geometry: host code only, a pure
// function of (op, H, dtype, whether the device launches clusters), so that the CPU machine
// computes and tests it (torch.ops.polynorm._launch_plan says it for any row and layout).
//
// The table. H is for bf16/fp16 rows; fp32 rows hold half as many elements (halve every H
// below), fp64 a quarter. Ratios: kernel time over a copy (forward) or an add (backward) of
// the same bytes, bf16 at M·H = 2^26 on an H200, from the bench/results/ folder cited.
//
//   op           | rows (bf16)       | kernel                          | why
//   -------------+-------------------+---------------------------------+------------------------------------
//   forward      | H <= 32768        | row, one CTA (<= 256 threads),  | the row in registers (16 packs of x
//                |                   | a block per 128 / G rows        | a thread), read once: 1.05-1.06 of a
//                |                   |                                 | copy at 2048-16384 (h200-row-packs)
//                | <= 524288         | row, a cluster of 2-16 CTAs of  | split past 256 threads over
//                |                   | <= 128 threads (or of 256),     | distributed shared memory: 131072
//                |                   | persistent                      | 1.18 on 8 x 128 (h200-cluster-ctas)
//                | beyond            | tiled                           | past 16 x 256 threads
//   forward, odd | H <= 32769        | row, narrow: 8 (or 7) packs,    | odd rows are realigned: 1.37 of a
//   H, 2-byte    |                   | one CTA (<= 512 threads)        | copy at 8 packs, 1.63 at 16 (5125,
//                | <= 524289         | a cluster of CTAs of 128 or 512 | h200-narrow-forward)
//   backward     | H <= 16384        | row, one CTA (<= 256 threads),  | x and grad_y in registers (8 packs
//                |                   | persistent, or 2 CTAs of <= 128 | each): 1.10-1.13 of an add
//                |                   | where they hold no more threads | at 2048-8192 (h200-row-packs)
//                | <= 262144         | a cluster of 2-16 CTAs of 128   | 65536: 1.13 on 8 x 128
//                |                   | (up to 8), else of 256          | (h200-cluster-ctas)
//                | beyond            | tiled                           |
//   mul_forward  | H <= 16384        | as forward, 8 packs each of x   | two CTAs of 128 past 128 threads:
//                | <= 262144, beyond | and mul; 4 for rows of whole    | 16384 1.06 of an add, 1.09 on one
//                |                   | packs a quarter idle at 8       | of 256 (h200-pack-counts)
//   mul_backward | H <= 8192         | as backward, 4 packs each of x, | rows of clusters on CTAs of 256
//                | <= 131072, beyond | grad_out and mul; odd rows on   | staged a row ahead (row_staged);
//                |                   | fewer lanes with a wide tail    | odd rows' tail (row_tail_plan)
//   grouped_*    | as forward, backward: the same kernels and geometry, each row with its expert's parameters
//
// - Row kernels, one CTA: G threads a row, the fewest that cover it (a power of two up to 32,
//   then a multiple of 32: bf16 5125 forward takes 96, 16387 takes 288); blocks of 128 / G rows
//   when G < 128. Rows of clusters: row_plan. Clusters of 16 CTAs are not portable: a device that
//   cannot place one runs that row on the tiled kernels (csrc/cuda/launch_common.cuh, clusters_fit).
// - Devices without clusters (before sm_90): one CTA a row up to 256 threads (bf16: forward
//   H <= 32768, backward and mul_forward 16384, mul_backward 8192; the narrow forward 1024
//   threads, 65536), the tiled kernels beyond.
// - Misaligned rows take the same plan in a realigning build (RowBuild): the same packs and sums,
//   so the same bits as aligned rows.
// - Every choice depends on H, the dtype and whether the device launches clusters, never on M,
//   so a row's bits do not depend on the batch it comes in. tests/test_launch_plan.py pins the
//   boundaries.
#pragma once

#include <algorithm>
#include <cstdint>

namespace polynorm {

// Row kernels: a row held in registers by G threads, kPacks 16-byte packs a thread and tensor.
// The wide builds hold 16 packs a thread (PolyNorm's forward 16 of x, its backward 8 each of x
// and grad_y, the fused forward 8 each of x and mul, its backward 4 each of three tensors) at
// up to 128 registers in CTAs of at most 256 threads: forward 1.05-1.06 of a copy at 2048-16384
// against 1.07-1.17 at 8 packs (h200-row-packs/tune_bf16.log: f16w0, f8w0). The narrow builds
// (row_packs) hold half as many at up to 80 registers, in CTAs of up to 512 threads (1024 without
// clusters).
constexpr int kRowFwdPacks = 16;     // wide: 256 bytes of x a thread
constexpr int kRowBwdPacks = 8;      // wide: 128 bytes each of x and grad_y
constexpr int kRowMulFwdPacks = 8;   // wide: x and mul
constexpr int kRowMulBwdPacks = 4;   // wide: x, grad_out and mul
constexpr int kRowWidePacks = 12;    // packs held a thread from which a build is wide (args.cuh, row_min_blocks)
constexpr int kRowWideThreads = 256; // the wide builds' largest CTA
constexpr int kRowMinThreads = 128;  // block size when G < 128: R = 128 / G rows a block
constexpr int kRowMaxThreads = 1024;

// The wide packs a thread of an op's row kernel.
constexpr int row_wide_packs(bool backward, bool mul) {
  return mul ? (backward ? kRowMulBwdPacks : kRowMulFwdPacks) : (backward ? kRowBwdPacks : kRowFwdPacks);
}
// Packs a thread holds in registers: kPacks for each tensor the kernel keeps.
constexpr int packs_held(bool backward, bool mul, int packs) { return packs * (backward ? 2 : 1) + (mul ? packs : 0); }
constexpr bool wide_build(bool backward, bool mul, int packs) { return packs_held(backward, mul, packs) >= kRowWidePacks; }
// The narrow 8-pack forward (PolyNorm's 2-byte odd rows): the one build with CTAs past 256 threads.
constexpr bool large_build(bool backward, bool mul, int packs) { return !backward && !mul && packs == kRowFwdPacks / 2; }

// Whether a row of H elements is whole 16-byte packs.
inline bool whole_packs(int64_t H, int elem_size) { return (H * elem_size) % 16 == 0; }

// Rows of clusters (sm_90). A row that needs more threads than the split (forward 512, backward
// 256; the wide builds split past kRowWideThreads) takes the fewest CTAs of at most
// kRowClusterCtaThreads (wide: 256) each, up to kRowMaxCluster. First, though, a row past the
// forward's split or kRowBwdSmallSplit (backward; the fused forward kRowMulFwdSmallSplit) takes
// the fewest CTAs of kRowSmallCtaThreads that hold it, up to kRowFwdSmallCluster (forward) or
// kRowBwdSmallCluster (backward), where they hold no more threads than the other plan: the
// forward at 131072 1.27 -> 1.18 of a copy on 8 x 128 (h200-cluster-ctas). PolyNorm's forward
// keeps one CTA up to 256 threads (32768: 1.116 on one of 256, 1.125 on two of 128,
// h200-pack-counts/tune_long.log); the fused forward splits past 128 (16384: 1.064 on two of 128
// against 1.092, the same file). Clusters of more than kRowPortableCluster are not portable
// (clusters_fit); against the tiled kernels they win (backward 262144: 1.47 of an add against
// 1.83, h200-clusters-of-16/tune_tx.log).
constexpr int kRowFwdSplit = 512;
constexpr int kRowBwdSplit = 256;
constexpr int kRowBwdSmallSplit = 128;
constexpr int kRowMulFwdSmallSplit = 128;
constexpr int kRowSmallCtaThreads = 128;
constexpr int kRowFwdSmallCluster = 16;
constexpr int kRowBwdSmallCluster = 8;
constexpr int kRowClusterCtaThreads = 512;
constexpr int kRowMaxCluster = 16;
constexpr int kRowPortableCluster = 8;

// A persistent row grid (the backward's, the forward's rows of clusters) starts in four quarters
// kRowStaggerCycles apart (reduce.cuh, stagger_start) when its clusters take at least
// kRowStaggerRounds rounds of rows: started together, its blocks load and compute in step and
// the memory pipe idles while they compute (the forward at 131072: 1.200 -> 1.153 of a copy,
// h200-persistent-stagger). Over fewer rounds it gains at some H and loses at others (the same
// file at M·H = 2^24): hence the rounds. The delay moves no bit, only when a block starts. The
// grouped builds are never staggered.
constexpr int kRowStaggerCycles = 1500;
constexpr int64_t kRowStaggerRounds = 8;
inline int row_stagger_cycles(int64_t rounds) { return rounds >= kRowStaggerRounds ? kRowStaggerCycles : 0; }

// A grid of a block per R rows staggers its first wave (the blocks resident at its start) in four
// quarters kRowWaveStaggerCycles apart when it holds more than one wave: the fused forward at
// 2048 x 4096 1.325 -> 1.140 of an add (h200-wave-stagger). A grid of one wave or less starts
// whole: no later wave's blocks wait behind it, so a delay there only makes the launch longer.
// From kRowWaveStaggerWaves waves, the forward's blocks of more than kRowMinThreads threads (one
// CTA of 256: bf16 16385-32768) wait kRowWideWaveStaggerCycles (32768: 1.109 at 750, 1.083 at
// 3000, h200-pack-counts/tune_long.log).
constexpr int kRowWaveStaggerCycles = 750;
constexpr int kRowWideWaveStaggerCycles = 3000;
constexpr int64_t kRowWaveStaggerWaves = 2;
// `clusters`: the grid's blocks (clusters); `wave`: those resident at its start (at most clusters).
constexpr int row_wave_stagger_cycles(int64_t clusters, int64_t wave, int threads, bool backward) {
  if (clusters <= wave) return 0;
  if (clusters < kRowWaveStaggerWaves * wave) return kRowWaveStaggerCycles;
  return !backward && threads > kRowMinThreads ? kRowWideWaveStaggerCycles : kRowWaveStaggerCycles;
}
// The rule at its edges, for 528 resident blocks (132 SMs x 4): a wave, just past it, just short
// of two, two (wide forward blocks, and the backward's).
static_assert(row_wave_stagger_cycles(528, 528, 128, false) == 0 &&
              row_wave_stagger_cycles(529, 528, 128, false) == kRowWaveStaggerCycles &&
              row_wave_stagger_cycles(1055, 528, 256, false) == kRowWaveStaggerCycles &&
              row_wave_stagger_cycles(1056, 528, 256, false) == kRowWideWaveStaggerCycles &&
              row_wave_stagger_cycles(1056, 528, 256, true) == kRowWaveStaggerCycles);

// The row backward's dW / dB partials (reduce.cuh): a launch whose persistent grid would take
// kRowSumApartRounds rounds of rows or more has them summed by a kernel of their own
// (param_sum_kernel, on sm_90 a programmatic dependent launch), not by the row kernel's last
// block, which needs every block to fence after its last stores; PolyNorm's one-CTA rows of whole
// packs that fill every lane's slots then take a block per R rows. At 2^26, bf16 4096: 1.112 ->
// 1.092 of an add (h200-param-sums). Fewer rounds keep the last block's sum: one launch.
constexpr int64_t kRowSumApartRounds = 4;
inline bool row_sum_apart(int64_t rounds) { return rounds >= kRowSumApartRounds; }

// Rows of clusters: the launch's cluster scheduling policy preference (cudaClusterSchedulingPolicy:
// 0 the default, 2 load balancing). Load balancing lets CTAs of one cluster share an SM: an H200
// holds 15 clusters of 16 x 256 threads with it, 14 without. Clusters of 16 take it (the forward at
// 262144: 1.269 -> 1.201 of a copy, h200-cluster-policy); clusters of 8 keep the default, where it
// was slower (the forward at 131072: 1.153 -> 1.284).
constexpr int kRowClusterLoadBalancing = 2;
inline int row_cluster_policy(int cluster) { return cluster > kRowPortableCluster ? kRowClusterLoadBalancing : 0; }

// The realigned row builds' phase (rows whose tensors start at different offsets into their
// 16-byte chunks): the row works in the phase of one tensor's rows, and a tensor not in it is
// realigned into it as it arrives (an input) or out of it as it is stored (an output).
// `classes`: each tensor's phase class, equal for tensors whose rows share every row's phase, in
// the order x, y (and mul) forward; x, grad_y, grad_x (and mul, grad_mul) backward. Returns the
// index of the tensor whose phase the rows take:
// - forward: y's for PolyNorm (x realigned in, an input, costs less than y realigned out); the
//   fused op, y's where mul's rows share y's phase and not x's (one input in), else x's.
// - backward: the least cost, an input in counting 4 and an output out 7, the first of x,
//   grad_y, grad_x on a tie (PolyNorm with x and grad_y moved: grad_x out, 7, rather than both
//   in, 8).
constexpr int kPhaseInCost = 4, kPhaseOutCost = 7;
inline int realign_phase(bool backward, bool mul, const int* classes) {
  if (!backward) {
    if (!mul) return 1;
    return classes[2] == classes[1] && classes[2] != classes[0] ? 1 : 0;
  }
  const int n = mul ? 5 : 3;
  const bool output[5] = {false, false, true, false, true};  // x, grad_y, grad_x, mul, grad_mul
  int best = 0, best_cost = 0;
  for (int ref = 0; ref < 3; ++ref) {
    int cost = 0;
    for (int t = 0; t < n; ++t) {
      if (classes[t] != classes[ref]) cost += output[t] ? kPhaseOutCost : kPhaseInCost;
    }
    if (ref == 0 || cost < best_cost) best = ref, best_cost = cost;
  }
  return best;
}

// Tiled kernels: kMaxGroup threads a row, one row a block, kFwdPacks (kBwdPacks) packs a thread
// and tensor in registers a tile; with 1024 threads the register cap is 64 a thread, which these
// counts fit. The table sends them only rows past the row kernels (more than 256 threads of the
// wide builds), which every group of fewer threads would walk in more tiles.
constexpr int kBlockThreads = 256;  // the tiled backward's shared partials (backward.cuh)
constexpr int kMaxGroup = 1024;
constexpr int kFwdPacks = 4;
constexpr int kBwdPacks = 2;

// The kernel family: kAuto is a request only (the table's choice), a plan holds kRow or kTiled.
enum class Family { kAuto, kRow, kTiled };

struct RowPlan {
  bool ok;
  int G;        // threads a row in one CTA
  int threads;  // threads a block: R * G
  int cluster;  // CTAs a row: 1, or a thread-block cluster of 2-16 CTAs of G threads each
};

struct LaunchPlan {
  Family family;  // kRow or kTiled
  int packs;      // row kernels: packs a thread and tensor
  RowPlan row;
  bool staged;    // row kernels: aligned rows staged a row ahead (row_staged)
  int tail;       // row kernels: elements past the lanes' slots held by the row's last lane, where more
                  // than one (row_tail_plan: the tail builds); else 0
};

// Packs the lanes of a row hold in their slots: the row's packs, but for rows not of whole packs
// those of its first H - 1 elements. A row one element past whole packs (bf16 4097) keeps its
// last element apart (the last lane's `extra`) rather than take a warp more for one element (64
// threads, not 96 with a third of their slots idle).
inline int64_t slot_packs(int64_t H, int elem_size) {
  return whole_packs(H, elem_size) ? H * elem_size / 16 : ((H - 1) * elem_size + 15) / 16;
}

// The threads G of a row that needs `need`: a power of two up to 32 (several rows a warp), then a
// multiple of 32 (bf16 5125 forward: 96, not 128).
inline int64_t row_lanes(int64_t need) {
  int64_t G = 1;
  while (G < need && G < 32) G *= 2;
  return G < need ? (need + 31) / 32 * 32 : G;
}
// A row's plan in one tier: G = row_lanes threads, in blocks of R = 128 / G rows when G divides
// 128 (up to 16 blocks of 128 an SM when rows are short), else of one row. A row past `split`
// threads (with max_cluster > 1) takes the fewest CTAs (2 to max_cluster) of at most
// `cta_threads`, a multiple of 32. Not ok past max_threads in one CTA, or past max_cluster CTAs.
inline RowPlan row_plan_one_tier(int64_t need, int split, int cta_threads, int max_cluster, int max_threads) {
  const int64_t G = row_lanes(need);
  if (G > split && max_cluster > 1) {
    int64_t C = 2;
    while (C < max_cluster && (need + C - 1) / C > cta_threads) C *= 2;
    const int64_t per_cta = ((need + C - 1) / C + 31) / 32 * 32;
    if (per_cta > cta_threads) return {false, 0, 0, 0};
    return {true, static_cast<int>(per_cta), static_cast<int>(per_cta), static_cast<int>(C)};
  }
  if (G > max_threads) return {false, 0, 0, 0};
  const int64_t rows = G < kRowMinThreads && kRowMinThreads % G == 0 ? kRowMinThreads / G : 1;
  return {true, static_cast<int>(G), static_cast<int>(rows * G), 1};
}
// A row's plan in two tiers: past `small_split` threads, the fewest CTAs (2 to small_cluster) of at
// most kRowSmallCtaThreads where they hold no more threads than the one-tier plan (bf16 backward
// 9000: one CTA of 160 threads, not two of 96, which hold 32 threads more).
// `whole_slots`: the row's whole packs in slots, the rest apart (row_tail_plan), not slot_packs.
inline RowPlan row_plan(int64_t H, int elem_size, int packs_per_thread, int split, int cta_threads, int max_cluster,
                        int max_threads, int small_split, int small_cluster, bool whole_slots = false) {
  const int64_t packs = whole_slots ? H * elem_size / 16 : slot_packs(H, elem_size);
  const int64_t need = (packs + packs_per_thread - 1) / packs_per_thread;
  const RowPlan plan = row_plan_one_tier(need, split, cta_threads, max_cluster, max_threads);
  if (row_lanes(need) <= small_split || max_cluster <= 1) return plan;
  for (int64_t C = 2; C <= std::min(small_cluster, max_cluster); C *= 2) {
    if ((need + C - 1) / C > kRowSmallCtaThreads) continue;
    const int64_t per_cta = ((need + C - 1) / C + 31) / 32 * 32;
    if (plan.ok && C * per_cta > int64_t(plan.cluster) * plan.G) break;  // more idle threads: the plan
    return {true, static_cast<int>(per_cta), static_cast<int>(per_cta), static_cast<int>(C)};
  }
  return plan;
}

// The row plan of one op's launch: the table's split, CTA size and cluster caps; the wide builds'
// CTAs hold at most kRowWideThreads threads (so do their rows without clusters). `clusters`: the
// device launches clusters (sm_90 and later).
inline RowPlan row_plan_for(bool backward, bool mul, int64_t H, int elem_size, int packs_per_thread, bool clusters,
                            bool whole_slots = false) {
  const int cap = wide_build(backward, mul, packs_per_thread) ? kRowWideThreads : kRowMaxThreads;
  const int split = std::min(backward ? kRowBwdSplit : kRowFwdSplit, cap);
  const int small_split = backward ? kRowBwdSmallSplit : mul ? std::min(split, kRowMulFwdSmallSplit) : split;
  return row_plan(H, elem_size, packs_per_thread, split, std::min(kRowClusterCtaThreads, cap),
                  clusters ? kRowMaxCluster : 1, cap, small_split,
                  backward ? kRowBwdSmallCluster : kRowFwdSmallCluster, whole_slots);
}

// Packs a thread for one op and row: the wide count, with three exceptions. Each depends on the op,
// H and the element size only, never on clusters or M.
// - Rows not of whole packs hold at most 64 elements a thread (4 x the element size in packs):
//   PolyNorm's forward of 2-byte odd rows takes the narrow build (8 packs). Its realigned sums
//   and the idle slots of its rounded G cost issue slots that 16 packs of 8 elements cannot spare
//   (bf16 5125: 1.37 of a copy at 8 packs, 1.63 at 16, h200-narrow-forward); every other op and
//   dtype holds 64 elements or fewer a thread at the wide count, and is faster wide.
// - Odd rows of more than a warp take one pack fewer where that covers their slot packs with fewer
//   slots on at most 256 threads (every op but the fused backward, whose 3 packs of three tensors
//   would not be a wide build): bf16 5125 (641 slot packs) on 96 threads holds 768 slots at 8, its
//   last warp half idle, 672 at 7 (PolyNorm's backward 1.56 -> 1.43 of an add,
//   h200-clusters-of-16/tune_trim.log).
// - The fused forward's rows of whole packs, of more than a warp, that leave more than a quarter of
//   their slots idle at 8 packs take 4 (a narrow build) where that takes fewer slots on at most
//   kRowMinThreads threads: bf16 3000 (375 packs) on 64 lanes of 8 holds 512 slots, on 96 of 4 384
//   (1.106 -> 1.038 of an add, h200-pack-counts/exp_packs.log).
inline int row_packs(bool backward, bool mul, int64_t H, int elem_size) {
  const int wide = row_wide_packs(backward, mul);
  if (whole_packs(H, elem_size)) {
    if (!mul || backward) return wide;
    const int64_t slots = slot_packs(H, elem_size), half = wide / 2;
    const int64_t at = row_lanes((slots + wide - 1) / wide), halved = row_lanes((slots + half - 1) / half);
    return at > 32 && 4 * slots < 3 * at * wide && halved <= kRowMinThreads && halved * half < at * wide ? int(half)
                                                                                                     : wide;
  }
  const int packs = std::min(wide, 4 * elem_size);
  if (backward && mul) return packs;  // 3 packs each of three tensors would not be a wide build
  const int64_t slots = slot_packs(H, elem_size);
  const int64_t at = row_lanes((slots + packs - 1) / packs), fewer = row_lanes((slots + packs - 2) / (packs - 1));
  return at > 32 && fewer <= kRowWideThreads && fewer * (packs - 1) < at * packs ? packs - 1 : packs;
}

// The fused backward's aligned rows of clusters on CTAs of kRowStageThreads (2- and 4-byte dtypes)
// whose every slot is in the row stage their packs a row ahead (backward.cuh, kAlignedStaged): each
// thread copies its packs into its own shared-memory stage (cp.async, 48 KB a CTA) and issues the
// next row's copies as soon as this row's are in registers. The same packs and sums: the same bits.
// bf16 131072 (16 x 256): 1.107 of an add plus a copy staged, 1.257 not (h200-staged-rows).
// Not PolyNorm's backward (two tensors of 8 packs, 64 KB a CTA: slower staged there).
constexpr int kRowStageThreads = 256;
inline bool row_staged(bool backward, bool mul, int64_t H, int elem_size, int packs, const RowPlan& row) {
  const bool full = whole_packs(H, elem_size) && int64_t(row.G) * row.cluster * packs == slot_packs(H, elem_size);
  return backward && mul && elem_size <= 4 && row.cluster > 1 && row.threads == kRowStageThreads && full;
}

// The fused backward's odd rows (2- and 4-byte dtypes) hold only their whole packs in slots, and the
// 2 to kVec - 1 elements past them on the row's last lane (its tail: row_lanes.cuh row_tail; the tail
// builds), where that takes fewer lanes than the slot_packs plan, and still whole warps on CTAs of
// at most 256 threads: bf16 5125 (640 packs and 5 elements) takes one CTA of 160 threads, not two
// of 96 (1.126 of an add plus a copy against 1.198, h200-tail-rows). Rows one element past whole
// packs keep their plan. Returns the tail's elements, 0 where the rule does not serve; `row` then
// becomes the tail plan. Other ops keep slot_packs' plans: they have no tail builds.
inline int row_tail_plan(bool backward, bool mul, int64_t H, int elem_size, int packs, bool clusters, RowPlan& row) {
  if (!backward || !mul || elem_size > 4 || whole_packs(H, elem_size) || !row.ok) return 0;
  const RowPlan t = row_plan_for(backward, mul, H, elem_size, packs, clusters, true);
  const int64_t lanes = int64_t(t.G) * t.cluster;
  if (!t.ok || t.threads > kRowWideThreads || lanes < 32 || lanes >= int64_t(row.G) * row.cluster) return 0;
  const int64_t tail = H - lanes * packs * (16 / elem_size);
  if (tail < 2 || tail >= 16 / elem_size) return 0;  // never, by the rounding of whole packs; the kernels' bound
  row = t;
  return static_cast<int>(tail);
}

// The table above. `clusters`: the device launches thread-block clusters (sm_90 and later).
// `family`: kAuto, the table's choice; kTiled, the tiled kernels for every row (a test's explicit
// configuration); kRow, the table's (the row kernels serve every row they can).
inline LaunchPlan plan_launch(bool backward, bool mul, int64_t H, int elem_size, bool clusters,
                              Family family = Family::kAuto) {
  LaunchPlan plan{};
  plan.packs = row_packs(backward, mul, H, elem_size);
  plan.row = row_plan_for(backward, mul, H, elem_size, plan.packs, clusters);
  plan.family = family == Family::kTiled || !plan.row.ok ? Family::kTiled : Family::kRow;
  if (plan.family == Family::kRow) {
    plan.staged = row_staged(backward, mul, H, elem_size, plan.packs, plan.row);
    plan.tail = row_tail_plan(backward, mul, H, elem_size, plan.packs, clusters, plan.row);
  }
  return plan;
}

// ---- The row kernel a launch takes --------------------------------------------------------------

// The row kernels' builds: their kLayout / kBuild template argument (row_lanes.cuh RowLayout, the same
// values: csrc/cuda/launch_common.cuh checks them). The first four are also the rows' layouts as the
// launcher finds them: aligned (every row 16-byte aligned, H whole packs); same-phase (rows that
// start alike in every tensor: odd H in contiguous tensors); realigned (rows that do not: one phase
// a row); pack-realigned (a misaligned view of whole packs beside aligned outputs).
enum class RowBuild : int {
  kAligned = 0, kRealigned = 1, kSamePhase = 2, kPackRealigned = 3, kAlignedStaged = 4, kSamePhaseTail = 5,
  kRealignedTail = 6
};
constexpr int kRowBuilds = 7;

// A row kernel: its template arguments beside the scalar type.
struct RowKernel {
  int packs;         // kPacks
  RowBuild build;    // kLayout (forward) / kBuild (backward)
  int max_threads;   // kMaxThreads: 256, or 1024 (the narrow 8-pack forward's CTAs past 256 threads)
  bool mul;          // kMul
  bool grouped;      // kGrouped
  bool whole_warps;  // kWholeWarps: rows of 32 lanes or more (row_lanes.cuh row_lane), or every row
};
constexpr bool operator==(const RowKernel& a, const RowKernel& b) {
  return a.packs == b.packs && a.build == b.build && a.max_threads == b.max_threads && a.mul == b.mul &&
         a.grouped == b.grouped && a.whole_warps == b.whole_warps;
}

// The kernel that a row plan launches for rows of `layout` (one of the first four RowBuild values).
// - The wide builds have an aligned build of every row (kWholeWarps false: with W fixed at 32,
//   ptxas moved some of the aligned backward's loads past the first wait, bench/sass_load_order.py);
//   the narrow builds take the pack-realigned build for aligned rows, which realigns nothing there.
// - The realigning builds come twice up to 256 threads: for rows of 32 lanes or more
//   (kWholeWarps) and for shorter rows (no cross-warp sum, no cluster); the narrow 8-pack forward's
//   CTAs past 256 threads take its 1024-thread build, whose rows are whole warps.
// - The fused backward's staged rows (row_staged) take kAlignedStaged when aligned; its tail rows
//   (row_tail_plan), always odd, the tail builds of their layout.
// - The grouped builds (GroupArgs) are one build for every row (kWholeWarps false).
inline RowKernel row_kernel_for(bool backward, bool mul, bool grouped, const LaunchPlan& plan, RowBuild layout) {
  RowKernel k{plan.packs, layout, kRowWideThreads, mul, grouped && !mul, false};
  if (backward && plan.staged && layout == RowBuild::kAligned) {
    k.build = RowBuild::kAlignedStaged;
    return k;
  }
  if (backward && plan.tail > 0) {
    k.build = layout == RowBuild::kSamePhase ? RowBuild::kSamePhaseTail : RowBuild::kRealignedTail;
    k.whole_warps = true;
    return k;
  }
  const bool wide = wide_build(backward, mul, plan.packs);
  if (wide && layout == RowBuild::kAligned) return k;
  if (layout == RowBuild::kAligned) k.build = RowBuild::kPackRealigned;
  if (large_build(backward, mul, plan.packs) && plan.row.threads > kRowWideThreads) {
    k.max_threads = kRowMaxThreads;
    k.whole_warps = true;
  } else {
    k.whole_warps = int64_t(plan.row.G) * plan.row.cluster >= 32;
  }
  if (k.grouped) k.whole_warps = false;
  return k;
}

// The build that sizes a backward launch's grid, and so the order of its dW / dB sums, whatever the
// layout: the aligned build of the row's packs, so that a view's dW and dB are the aligned rows' bits.
inline RowKernel row_sizing_kernel(bool mul, bool grouped, const LaunchPlan& plan) {
  return {plan.packs, RowBuild::kAligned, kRowWideThreads, mul, grouped && !mul, false};
}

// Whether a forward build's same-phase stage may not fit a block's shared memory (the 1024-thread
// narrow build: 144 KB at 1024 threads, over the 99 KB a block of sm_86 / sm_89); its rows then take
// the pack-realigned build of the same geometry, whose bits are the same. Every other build's stage
// and cluster slots fit 76 KB.
constexpr bool row_stage_may_not_fit(const RowKernel& k) { return k.max_threads > kRowWideThreads; }

// Whether a row kernel is compiled for an op's direction and element size: exactly the kernels that
// row_kernel_for, row_sizing_kernel and the stage's fallback give for some H and layout
// (tests/test_launch_plan.py checks both ways; bench/instantiations.py checks the binary).
constexpr bool row_kernel_compiled(bool backward, int elem_size, const RowKernel& k) {
  const bool mul = k.mul;
  if (mul && k.grouped) return false;
  if (k.grouped && k.whole_warps) return false;
  const int wide = row_wide_packs(backward, mul);
  const int odd = std::min(wide, 4 * elem_size);        // odd rows' packs, and one fewer (row_packs)
  const bool whole = k.packs == wide;                    // rows of whole packs, of any length
  const bool halved = !backward && mul && k.packs == wide / 2;  // the fused forward's, of whole warps
  const bool odd_any = k.packs == odd;                   // odd rows of any length
  const bool trimmed = k.packs == odd - 1 && !(backward && mul);  // odd rows of whole warps
  const bool any_warps = k.grouped ? !k.whole_warps : true;
  const bool warps_only = k.grouped ? !k.whole_warps : k.whole_warps;
  const bool is_wide = wide_build(backward, mul, k.packs);
  const bool large = large_build(backward, mul, k.packs);
  const bool staged_tail = backward && mul && elem_size <= 4 && k.packs == wide;
  if (k.max_threads == kRowMaxThreads) {
    // The narrow 8-pack forward's CTAs past 256 threads: odd rows, and the stage's fallback.
    return large && odd_any && (k.build == RowBuild::kSamePhase || k.build == RowBuild::kRealigned ||
                                k.build == RowBuild::kPackRealigned) && warps_only;
  }
  if (k.max_threads != kRowWideThreads) return false;
  switch (k.build) {
    case RowBuild::kAligned:  // aligned rows of the wide builds; the backward's grid sizing
      return is_wide && !k.whole_warps && (whole || (backward && trimmed));
    case RowBuild::kPackRealigned:  // misaligned views of whole packs; the narrow builds' aligned rows
      return (whole && is_wide && any_warps) || (halved && warps_only);
    case RowBuild::kSamePhase:
    case RowBuild::kRealigned:
      return (odd_any && any_warps) || (trimmed && warps_only);
    case RowBuild::kAlignedStaged:
      return staged_tail && !k.grouped && !k.whole_warps;
    case RowBuild::kSamePhaseTail:
    case RowBuild::kRealignedTail:
      return staged_tail && !k.grouped && k.whole_warps;
  }
  return false;
}

}  // namespace polynorm
