// Which CUDA kernel serves a PolyNorm row, and with what geometry: host code only, so that
// the choice is a value that the CPU machine can compute and test
// (torch.ops.polynorm._launch_plan) and that a benchmark can force (_force_kernel).
//
// The table. H is for bf16/fp16 rows; fp32 rows hold half as many elements (halve every H
// below), fp64 a quarter. The kernels are in csrc/cuda/ (forward.cuh, backward.cuh).
//
// Every row takes the wide builds (below) but PolyNorm's forward of 2-byte rows not of whole
// 16-byte packs ("odd H": H * element size not a multiple of 16, bf16 H not a multiple of 8),
// which takes the narrow build (row_packs says why), and the fused forward's rows of whole packs
// that would leave a quarter of their slots idle (4 packs). Odd rows whose last warp would be half
// idle hold one pack fewer (every op but mul_backward: row_packs):
//
//   direction    | rows (bf16)       | kernel                         | why
//   -------------+-------------------+--------------------------------+-------------------------------------
//   forward      | H <= 32768        | row, one CTA (<= 256 threads), | the row in registers (16 packs of x a
//                |                   | a block per 128 / G rows       | thread, 128 registers): read once, one
//                |                   |                                | reduction, no barrier but its own;
//                |                   |                                | persistent: 1.05-1.11 of a copy
//                | 32768 < H         | row, a cluster of 2-16 CTAs,   | split past 256 threads; resident
//                |   <= 524288       | persistent: CTAs of <= 128     | clusters walk the rows; 131072: 1.18
//                |                   | threads where they hold no more| on 8 x 128, 1.27 on 4 x 256 (65536 /
//                |                   | threads than CTAs of <= 256    | 262144: 4 / 16 x 128; 262144
//                |                   |                                | load-balanced 1.19, default 1.26)
//                | H > 524288        | tiled                          | past 16 x 256 threads; the row walked
//                |                   |                                | twice (the second pass mostly in L2)
//   forward, odd | H <= 32769        | row, narrow: 8 (or 7) packs,   | CTAs of up to 512 threads (80 registers
//   H, 2-byte    |                   | one CTA (<= 512 threads)       | up to 256, 64 beyond), split past 512;
//                | <= 524289         | a cluster of 2-16 CTAs: of 128 | a block per R rows, persistent on
//                |                   | as above, else of <= 512       | clusters (65537: 1.22 on 8 x 128,
//                |                   |                                | 1.40 on 2 x 512)
//   backward     | H <= 16384        | row, one CTA (<= 256 threads), | x and grad_y in registers (8 packs each);
//                |                   | persistent (a block per R rows | a block per row with the last block's
//                |                   | of full lanes where the        | sum: 1.5-1.7 of an add; summed apart
//                |                   | partials are summed apart); or | 1.08-1.10 (v19), 1.06-1.08 with
//                |                   | 2 CTAs of <= 128               | the sum's loads batched (v20).
//                |                   | where they hold no more threads| 16384: 1.10 on 2 x 128, 1.13 on 1 x 256
//                |                   | (12288, 16384: 2 x 96, 2 x 128)| (12288: 1.12 against 1.20)
//                | 16384 < H         | row, a cluster of 2-16 CTAs:   | 65536: 1.14 on 8 x 128, 1.19 on 4 x
//                |   <= 262144       | of <= 128 threads (up to 8) as | 256; 262144 on 16: 1.43 of an add,
//                |                   | above, else of <= 256          | tiled 1.83; load-balanced 1.39 (v29);
//                |                   |                                | slots read 4 at a time 1.20 (v32)
//                | H > 262144        | tiled                          |
//   mul_forward  | H <= 16384        | as forward, 8 packs each of x  | rows past 128 threads on two CTAs
//                | <= 262144, beyond | and mul; 4 (narrow) for rows of| of <= 128 where they hold no more
//                |                   | whole packs a quarter idle at 8| threads (16384: 1.06 on 2 x 128,
//                |                   |                                | 1.09 on 1 x 256, v21), else one;
//                |                   |                                | past 128 threads persistent; 3000:
//                |                   |                                | 1.04 at 4 packs, 1.11 at 8 (v21)
//   mul_backward | H <= 8192         | as backward, 4 packs each of x,| persistent grids throughout; rows of
//                | <= 131072, beyond | grad_out and mul; odd rows on  | clusters on CTAs of 256 staged a row
//                |                   | their whole packs' lanes, the  | ahead (row_staged; 131072: 1.11, 1.25
//                |                   | rest on the last lane, where   | unstaged, v32); 5125 one CTA of 160
//                |                   | fewer lanes (row_tail_plan)    | (1.13), not 2 x 96 (1.20, v33)
//   the backwards' dW / dB partials: summed by the last block, or apart where the persistent grid
//                | takes 4 rounds of rows or more (row_sum_apart; PolyNorm's one-CTA rows then take
//                | a block per R rows)
//   clusters     | of 16 CTAs launched with load balancing, a cluster's CTAs free to share an SM; smaller
//                | ones with the default policy, one CTA of a cluster an SM (row_cluster_policy)
//   the start    | persistent grids of 8 rounds or more in four quarters (row_stagger_cycles); grids
//                | of a block per R rows of more than one wave their first wave (row_wave_stagger_cycles)
//   grouped_*    | as forward, backward: the same kernels and geometry, each row with its expert's parameters
//
// Odd-H rows are planned by the packs their lanes hold (slot_packs): a misaligned row's one
// extra chunk is held apart (the last lane's `ext`), and so is a last element past whole packs,
// so odd rows reach the same bounds plus an element (bf16 backward: H = 16385 on the plan of
// 16384; H = 4097 forward on 64 threads, not 96). The fused backward's odd rows hold up to 7 (bf16)
// elements apart (its tail builds) where that takes fewer lanes (row_tail_plan: bf16 5125 on one CTA
// of 160 threads, not two of 96).

// - Row kernels, one CTA: G threads a row, the fewest that cover it (a power of two up to 32,
//   then a multiple of 32: H = 5125 bf16 forward takes 96, 16387 takes 288); blocks of 128 / G
//   rows when G < 128. Cluster rows: the fewest CTAs (2, 4, 8 or 16) of at most 256 (wide) or
//   512 (narrow) threads each; or the fewest of at most 128, up to 16 (forward) or 8 (backward),
//   where they hold no more threads (row_plan). Clusters of 16 are not portable: a device that cannot
//   place one takes the tiled kernels for that row (launch.cuh, clusters_fit).
// - Devices without clusters (before sm_90): one CTA a row up to 256 threads wide (bf16:
//   forward H <= 32768, backward and mul_forward 16384, mul_backward 8192; the narrow forward
//   1024 threads, 65536), the tiled kernels beyond.
// - bench/NOTES.md, v6, v8, v15 and v16, has the measurements (bf16, M·H = 2^26, kernel time over a copy
//   or an add of the same bytes); tests/test_launch_plan.py pins the boundaries.
//
// Every choice depends on H, the dtype and whether the device launches clusters, never on M
// (nor on E), so a row's bits do not depend on the batch it comes in. (Not modelled here: a
// device that cannot place a row's cluster of 16 runs that row, in every layout, on the tiled
// kernels: launch.cuh, clusters_fit. _launch_plan still reports the cluster.)
// Misaligned rows (odd H, a view that starts off a 16-byte boundary) take the same kernel in a
// realigning build (RowLayout: realigned, or same-phase when every tensor's rows start alike).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace polynorm {

// Row kernels: a row held in registers by G threads, kPacks 16-byte packs per thread and
// tensor. The wide builds hold 16 packs a thread (256 bytes: PolyNorm's forward 16 of x, its
// backward 8 each of x and grad_y; the fused op's forward 8 each of x and mul; its backward 4
// each of x, grad_out and mul; 12) at up to 128 registers, in CTAs of at most 256 threads.
// Measured on an H200 (bench/NOTES.md, v8, h200-2026-12-01b/call2-3, bf16 at M·H = 2^26): forward
// 1.05-1.07 of a copy for H = 2048-16384 against 1.07-1.13 at 8 packs (80 registers), backward
// 1.10-1.13 of an add for 2048-8192 against 1.14-1.27 at 4 packs; fp32 alike; the fused op's
// backward 1.08-1.09 of its floor at 2048-4096 against 1.13-1.26. The narrow build (PolyNorm's
// forward of 2-byte odd-H rows, row_packs) holds half as many (8, or 7) at up to 80 registers in
// CTAs of up to 512 threads (1024 without clusters; the 7-pack build, 256). A row's packs, and
// so its bits, depend only on the op, H and the dtype, whatever its alignment.
constexpr int kRowFwdPacks = 16;     // wide: 256 bytes of x per thread
constexpr int kRowBwdPacks = 8;      // wide: 128 bytes each of x and grad_y per thread
constexpr int kRowMulFwdPacks = 8;   // wide: x and mul
constexpr int kRowMulBwdPacks = 4;   // wide: x, grad_out and mul
constexpr int kRowWidePacks = 12;    // packs held a thread from which a build is wide (row_min_blocks)
constexpr int kRowWideThreads = 256; // the wide builds' largest CTA
constexpr int kRowMinThreads = 128;  // block size when G < 128: R = 128 / G rows a block
constexpr int kRowMaxThreads = 1024;

// Packs a thread holds in registers: kPacks for each tensor the kernel keeps (forward: x, and
// mul for the fused op; backward: x and grad_y, and mul).
constexpr int packs_held(bool backward, bool mul, int packs) { return packs * (backward ? 2 : 1) + (mul ? packs : 0); }
constexpr bool wide_build(bool backward, bool mul, int packs) { return packs_held(backward, mul, packs) >= kRowWidePacks; }

// Whether a row of H elements is whole 16-byte packs: the wide builds' rows.
inline bool whole_packs(int64_t H, int elem_size) { return (H * elem_size) % 16 == 0; }

// Clusters (sm_90): a row that needs more threads than kRowFwdSplit (forward, mul_forward; the
// wide builds: kRowWideThreads) or kRowBwdSplit (backward, mul_backward) is split over a
// cluster of CTAs of at most kRowClusterCtaThreads threads (the wide builds: kRowWideThreads),
// up to kRowMaxCluster CTAs. First, though, a row that needs more threads than the forward's
// split or than kRowBwdSmallSplit (backward; kRowMulFwdSmallSplit, the fused forward) takes the
// fewest CTAs of kRowSmallCtaThreads that hold it, up to kRowFwdSmallCluster (forward) or kRowBwdSmallCluster (backward) of them, where
// they hold no more threads than the other plan (row_plan). Measured on an H200 (bench/NOTES.md v16, h200-2026-12-02c/call1,
// bf16, against the CTAs of 256 of before in the same run): the forward at 65536 / 131072 /
// 262144 1.22 / 1.27 / 1.39 -> 1.14 / 1.18 / 1.30 of a copy on 4 / 8 / 16 CTAs of 128, the
// narrow forward at 65537 1.40 -> 1.20 (call 3: 1.40 -> 1.22); the backward at 16384 / 32768 / 65536 1.14 / 1.13 / 1.21
// -> 1.10 / 1.11 / 1.13 of an add on 2 / 4 / 8; the fused op alike. Not taken: one CTA of 256
// split in two in the forward (32768: 1.12 -> 1.14), in the backward 16 CTAs of 128 instead of 8
// of 256 (the fused backward at 65536: 1.28 -> 1.38), and CTAs of 128 that hold more threads
// than the other plan (bf16 backward H = 9000, call 3: two of 96 1.35, one of 160 1.16). Left as
// measured: the fused backward at odd 16385 on 4 CTAs of 128, 1.26 against 1.19 on 2 of 256. A
// tie can turn a portable cluster of 8 x 256 into 16 x 128 (bf16 forward 163848-262144, the
// fused forward 81928-131072): a device that cannot place 16 takes the tiled kernels for those
// rows (clusters_fit), not the 8 x 256 (which an H200 never needs). Clusters of more than kRowPortableCluster CTAs (8, the
// portable size, which every sm_90 device launches) are not portable: where the device cannot
// place one, the launcher takes the tiled kernels instead (launch.cuh, clusters_fit). Clusters
// of 16 against the tiled kernels, bf16 on an H200 (bench/NOTES.md v15): backward 262144 1.47 of
// an add against 1.83, the fused backward 131072 1.54 against 2.18, the fused forward 262144
// 1.43 against 1.49. Measured on an H200 for the fused op's builds (bench/NOTES.md, v6,
// call1/tune_clusters.log): one CTA of 512 threads beats two of 256 in the forward, two CTAs of
// 256 beat one of 512 in the backward, and CTAs of 512 threads beat CTAs of 1024 (64
// registers, spills) and mostly those of 256 for longer rows.
constexpr int kRowFwdSplit = 512;
constexpr int kRowBwdSplit = 256;
constexpr int kRowBwdSmallSplit = 128;
// The fused forward's first tier starts past 128 threads too (bf16 16384: two CTAs of 128, not one
// of 256; measured on an H200, bench/NOTES.md v21, h200-2026-12-03b/call1/tune_long.log, bf16 at
// M·H = 2^26: 1.064 of an add against 1.092; call2/tune.log, the table against `--cta 256`: 12288 /
// 16384 1.074 / 1.071 against 1.139 / 1.095 (2 x 96 / 2 x 128), fp32 8192 1.060 against 1.065).
// PolyNorm's forward keeps one CTA up to 256 threads (32768: 1.116 on one CTA of 256, 1.125 on two
// of 128, call 1).
constexpr int kRowMulFwdSmallSplit = 128;
constexpr int kRowSmallCtaThreads = 128;
constexpr int kRowFwdSmallCluster = 16;
constexpr int kRowBwdSmallCluster = 8;
constexpr int kRowClusterCtaThreads = 512;
constexpr int kRowMaxCluster = 16;
constexpr int kRowPortableCluster = 8;

// Bench-only tuning of the row kernels (torch.ops.polynorm._tune_rows): the grid: 0 = one
// block per R rows (the hardware schedules them), k > 0 = at most k blocks per resident slot,
// -1 = the table's (launch_forward_row, launch_backward_row); the same-phase path of misaligned
// rows; the CTA size past which a row is split; the largest cluster; row_packs' trim; the
// row grids' staggered start (row_stagger_cycles, row_wave_stagger_cycles); and who sums the
// backward's partials (row_sum_apart). Defined in polynorm.cpp.
struct RowTuning {
  int grid_waves;
  bool same_phase;  // misaligned rows that start alike in every tensor: the same-phase path
  int cta_threads;  // the most threads of a row in one CTA before it is split over a cluster of CTAs of that
                    // size, one tier (0 = the table's, two tiers: row_plan)
  int max_cluster;  // the most CTAs a row (0 = the table's, kRowMaxCluster)
  bool trim_packs;   // half-idle odd rows take a pack fewer (row_packs; false: the untrimmed count)
  int stagger;       // clock cycles between the quarters of a row grid's first wave (-1: the table's; launch.cuh)
  int sum_apart;     // the backward's dW / dB partials: -1 the table's (row_sum_apart), 0 summed by the row
                     // kernel's last block, 1 by a kernel of their own
  int cluster_policy;  // rows of clusters: the launch's cluster scheduling policy preference (-1: the table's,
                       // row_cluster_policy; 0, 1, 2: cudaClusterSchedulingPolicy default, spread, load balancing)
  int stage_rows;      // the fused backward's aligned rows of clusters staged a row ahead: -1 the table's (row_staged),
                       // 0 never, 1 wherever the staged build serves
  bool tail_rows;      // the fused backward's odd rows on fewer lanes with a wide tail where that serves (row_tail_plan);
                       // false: never (the plans of before the thirtieth session), a bench's A/B
  bool narrow_forward;  // PolyNorm's forward of 2-byte rows of whole packs at the narrow count (row_packs), a bench's A/B
  int forward_regs;     // PolyNorm's aligned forward of the wide build (16 packs, 2- and 4-byte dtypes): 0 the table's
                        // build (128 registers a thread, fp32 127), 96 or 80 a build capped so (csrc/cuda/args.cuh,
                        // row_cap_threads), a bench's A/B; the plans do not change (the grid and stagger do)
};
RowTuning row_tuning();

// A persistent row grid (the backward's, and the forward's rows of clusters) starts in four
// quarters kRowStaggerCycles clock cycles apart (stagger_start, csrc/cuda/reduce.cuh) when its
// clusters take at least kRowStaggerRounds rounds of rows: started together, the blocks an SM holds
// and the clusters of the grid load and compute in step, and the memory pipe idles while they
// compute. The delay never changes a bit, only when a block starts. Measured on an H200
// (bench/NOTES.md v18, h200-2026-12-02e/call2, bf16 at M·H = 2^26, 15-16 rounds, against no stagger
// in the same run): the forward at 65536 / 131072 / 262144 1.151 / 1.200 / 1.311 -> 1.120 / 1.153 /
// 1.269 of a copy, the fused forward at 32768 / 65536 / 131072 1.153 / 1.148 / 1.249 -> 1.083 / 1.078
// / 1.149; the backward at 16384-131072 1-2.7% faster, the fused backward at 16384-65536 4.6-4.9%;
// one-CTA backward rows within 1%. 3000 and 4500 cycles gained less. At 2^24 (about 4 rounds) it
// was mixed (the backward at 65536 and the forward at 131072 5-6% faster, the backward at 4096 and
// the forward at 16384 1-3% slower): hence the rounds. The grouped builds are never staggered.
constexpr int kRowStaggerCycles = 1500;
constexpr int64_t kRowStaggerRounds = 8;
inline int row_stagger_cycles(int64_t rounds) { return rounds >= kRowStaggerRounds ? kRowStaggerCycles : 0; }

// A grid of a block per R rows (one-CTA rows: PolyNorm's forward, the fused forward's to 128
// threads, PolyNorm's backward rows of full lanes summed apart) staggers its first wave, the blocks resident at its start, in four
// quarters kRowWaveStaggerCycles apart, when it holds more than one such wave; its later blocks
// start as others leave, out of step already. Measured on an H200 (bench/NOTES.md
// v20, h200-2026-12-03/call2, bf16, kernel over its floor, against no stagger in the same run):
// the forward at M·H = 2^25 (about 4 waves) 4096 / 16384 1.092 / 1.114 -> 1.068 / 1.083 of a
// copy; at 2^26 1.000-1.014 faster at 512-2048 and 16384, 1.006 slower at 4096 / 8192 (the
// spread); the fused forward 4096 / 8192 1.057 / 1.052 -> 1.029 / 1.022 of an add; the backward
// 0-0.4% faster. 1500 cycles alike but for the forward at 2^25 4096 (1.091); 3000 slower.
// Grids of one to two waves (more blocks than fit at once, fewer than twice as many) wait
// kRowWaveStaggerCycles whatever their blocks' size: at the seed shapes (v22,
// h200-2026-12-03c/call3/tune_seed.log, M = 2048, `--stagger`) the fused forward at 4096 (1.94
// waves of blocks of two rows) read 1.279 of an add unstaggered, 1.166 / 1.122 / 1.084 / 1.110 at
// 250 / 500 / 1000 / 2000 cycles, and PolyNorm's forward at 8192 (1.94 waves) 1.187 against 1.170 /
// 1.132 / 1.138 / 1.123 of a copy. A grid of one wave or less starts whole: PolyNorm's forward at
// 4096 (0.97 waves) read 1.131 unstaggered, 1.161-1.227 staggered; the fused forward at 1024 /
// 2048 (0.48 / 0.97 waves) within that run's spread (0.07 between two unstaggered columns). At
// 750 cycles against none (call 4, `call4/tune.log`, `--stagger 0`): the fused forward at 2048 x
// 4096 1.140 / 1.325, at 750 blocks of 528 (6000 x 1024, 1500 x 4096) 1.198 / 1.132 against
// 1.356 / 1.382; PolyNorm's forward at 2048 x 8192 1.160 / 1.166 (no gain past the spread), 12000
// x 1024 / 3000 x 4096 1.123 / 1.055 against 1.189 / 1.069, and with blocks of 256 threads at 400
// x 32768 (400 blocks of 264, the one such grid measured) 1.354 against 1.398.
// The forward's blocks of more than kRowMinThreads threads (PolyNorm's at bf16 16385-32768: one CTA
// of 256, two an SM) wait kRowWideWaveStaggerCycles between quarters (the backward's such blocks,
// rows summed apart at bf16 10240 / 14336, not measured, keep kRowWaveStaggerCycles): at 32768 (v21,
// h200-2026-12-03b/call1/tune_long.log, `--stagger`) 750 / 1500 / 3000 cycles read 1.109 / 1.099 /
// 1.083 of a copy; in call 2 (`call2/tune.log`, the table against `--stagger 750`) 1.081 against
// 1.093, fp16 1.096 / 1.102, fp32 16384 1.035 / 1.034, the narrow odd 16385 (256 threads, three
// blocks an SM) 1.136 / 1.124: a small gain at bf16 32768, elsewhere within that run's ~1% spread.
constexpr int kRowWaveStaggerCycles = 750;
constexpr int kRowWideWaveStaggerCycles = 3000;
constexpr int64_t kRowWaveStaggerWaves = 2;  // from this many waves, the forward's wide blocks wait longer
// `clusters`: the grid's blocks (clusters); `wave`: those resident at its start (at most clusters).
constexpr int row_wave_stagger_cycles(int64_t clusters, int64_t wave, int threads, bool backward) {
  if (clusters <= wave) return 0;
  if (clusters < kRowWaveStaggerWaves * wave) return kRowWaveStaggerCycles;
  return !backward && threads > kRowMinThreads ? kRowWideWaveStaggerCycles : kRowWaveStaggerCycles;
}
// The rule at its edges, for 528 resident blocks (an H200's 132 SMs x 4): a wave, just past it,
// just short of two, two (wide forward blocks, and the backward's).
static_assert(row_wave_stagger_cycles(528, 528, 128, false) == 0 &&
              row_wave_stagger_cycles(529, 528, 128, false) == kRowWaveStaggerCycles &&
              row_wave_stagger_cycles(1055, 528, 256, false) == kRowWaveStaggerCycles &&
              row_wave_stagger_cycles(1056, 528, 256, false) == kRowWideWaveStaggerCycles &&
              row_wave_stagger_cycles(1056, 528, 256, true) == kRowWaveStaggerCycles);

// The row backward's dW / dB partials (csrc/cuda/reduce.cuh): a launch whose persistent grid
// would take kRowSumApartRounds rounds of rows or more has them summed by a kernel of their own
// (param_sum_kernel: one block, launched after the row kernel, on sm_90 as a programmatic
// dependent launch), not by the row kernel's last block, which needs every block to fence after
// its last stores; and PolyNorm's one-CTA rows of whole packs that fill every lane's slots (as
// every power of two from 512 to 8192 in bf16) then take a block per R rows, not a persistent
// grid. The fused backward, rows of clusters and other rows stay persistent: bf16 3000 (375 packs
// on 64 lanes of 8) / 4097 / 5125 ran 1.25 / 1.21 / 1.36 on a block per R rows against 1.12 /
// 1.17 / 1.30 persistent, the sum apart either way (call 4). Fewer rounds (small M, as most
// seed shapes) keep the last block's sum: one launch, less host time. Measured on an H200
// (bench/NOTES.md v19, h200-2026-12-02f, bf16, kernel over an add in one run), call 1, at M·H =
// 2^26 (15-16 rounds): PolyNorm's backward at 512-8192 1.06-1.04 on a block per R rows with no sum
// at all (a bound), 1.47 with the last block's sum there (every block fences), 1.11-1.13
// persistent with it (the table of before); call 2, the table against the last block's sum on the
// persistent grid (`b` against `b-a0`): at 2^26 512 / 1024 / 2048 / 4096 / 8192 1.137 / 1.120 /
// 1.120 / 1.112 / 1.117 -> 1.103 / 1.094 / 1.078 / 1.092 / 1.091; at 2^25 (8 rounds) 1024 / 4096
// / 8192 1.181 / 1.167 / 1.151 -> 1.136 / 1.132 / 1.129; at 2^24 (4 rounds) 1.230 / 1.224 / 1.225
// -> 1.185 / 1.191 / 1.166 (hence 4); on clusters 16384 / 65536 1.093 / 1.110 -> 1.080 / 1.104
// (the sum's launch let start once every block has left its rows; once every block had started,
// 1.101 / 1.121); the fused backward 0.3-1% faster (2048-16384, started early), even at 65536.
constexpr int64_t kRowSumApartRounds = 4;
inline bool row_sum_apart(int64_t rounds) { return rounds >= kRowSumApartRounds; }

// Rows of clusters: the launch's cluster scheduling policy preference (cudaClusterSchedulingPolicy:
// 0 the default, 1 spread, 2 load balancing; a launch attribute where it is not 0, which the grid's
// occupancy query sees too). By default (0, which gave the grids of spread, 1) a cluster's CTAs sit on
// distinct SMs of one GPC, and GPCs whose SMs do not divide into whole clusters leave SMs out: an H200
// holds 14 clusters of 16 x 256 threads where its registers hold 16.5, and 28 of 16 x 128 where they
// hold 33. Load balancing lets CTAs of one cluster share an SM: 15 and 30. Clusters of more than
// kRowPortableCluster (8) CTAs, i.e. of 16, take it; smaller ones keep the default: on 8 CTAs load
// balancing was slower where it added clusters (their CTAs doubled up on an SM, and the cluster waits
// for its slowest), on 4 within the spread. Measured on an H200 (bench/NOTES.md v29,
// h200-2026-12-04b/call2/tune.log and tune_mul.log, bf16 at M·H = 2^26, against the default in the
// same run): on 16 CTAs, the forward at 262144 1.269 -> 1.201 of a copy, the backward 1.423 -> 1.393
// of an add, the fused forward at 131072 1.093 -> 1.069, the fused backward 1.433 -> 1.402; on 8, the
// forward at 131072 1.153 -> 1.284, the backward at 65536 1.098 -> 1.180, the fused backward at 32768
// 1.082 -> 1.169; on 4, the forward at 65536 1.125 -> 1.124, the backward at 32768 1.090 -> 1.090,
// the fused forward at 32768 1.073 -> 1.066, the fused backward at 16384 1.062 -> 1.049. Not measured
// under it: the 16 x 256 forward rows (bf16 262144 < H <= 524288) and the fused forward's.
constexpr int kRowClusterLoadBalancing = 2;
inline int row_cluster_policy(int cluster) {
  const int tuned = row_tuning().cluster_policy;
  if (tuned >= 0) return tuned;
  return cluster > kRowPortableCluster ? kRowClusterLoadBalancing : 0;
}

// The realigned row builds' phase (rows whose tensors start at different offsets into their
// 16-byte chunks, and no stage or class area forbids it: csrc/cuda/forward.cuh and backward.cuh,
// kRealigned): the row works in the phase of one tensor's rows; a tensor not in it is realigned
// into it as it arrives (an input) or out of it as it is stored (an output). `classes`: each
// tensor's phase class, equal for tensors whose rows share every row's phase (launch.cuh,
// same_phase_rows, an equivalence), in the order x, y (and mul) forward; x, grad_y, grad_x (and
// mul, grad_mul) backward. Returns the index of the tensor whose phase the rows take. Measured on
// an H200 (bench/NOTES.md v28, bf16 views one element in at M·H = 2^26):
// - forward: y's for PolyNorm (x realigned in: 4-6% faster than y realigned out, call 1); the
//   fused op, y's where mul's rows share y's phase and not x's (one input in), else x's.
// - backward: the least cost, an input in counting 4 and an output out 7, the first of x, grad_y,
//   grad_x on a tie (call 4: PolyNorm with x and grad_y moved 5-7% slower with both in than with
//   grad_x out; the fused op with x, mul and grad_out moved 1-4% faster with the three in).
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

// Tiled kernels: up to kMaxGroup threads a row, R = kBlockThreads / G rows a block, and
// kFwdPacks (kBwdPacks) packs per thread and tensor in registers per tile. With
// 1024-thread groups the register cap is 64 a thread, which these counts fit.
constexpr int kBlockThreads = 256;
constexpr int kMaxGroup = 1024;
constexpr int kFwdPacks = 4;
constexpr int kBwdPacks = 2;

enum class KernelKind { kAuto, kRow, kTiled };

struct RowPlan {
  bool ok;
  int G;        // threads a row in one CTA
  int threads;  // threads a block: R * G
  int cluster;  // CTAs a row: 1, or a thread-block cluster of 2-16 CTAs of G threads each
};

struct TiledPlan {
  int G;     // threads a row (blockDim.x)
  int rows;  // rows a block (blockDim.y)
};

struct LaunchPlan {
  KernelKind kind;  // kRow or kTiled
  int packs;        // row kernels: packs per thread and tensor
  RowPlan row;
  TiledPlan tiled;
  bool staged;      // row kernels: aligned rows staged a row ahead (row_staged)
  int tail;         // row kernels: the elements past the lanes' slots held apart by the row's last lane, where
                    // more than one (row_tail_plan: the tail builds); else 0
};

// Packs the lanes of a row hold in their slots: the row's packs, but for rows not of whole packs
// those of its first H - 1 elements. Such a row one element past whole packs (H = 4097 bf16:
// 512 packs and 2 bytes) keeps its last element apart (the row kernels' `extra`: the row's last
// lane loads it as a scalar and adds it to its sums after its packs) rather than take a warp
// more a row for one element (H = 4097: 64 threads, not 96 with a third of their slots idle).
// Every chunk a misaligned row touches is still held: slots and the last lane's `ext`, the
// chunk past them. Rows of whole packs are always aligned or realigned as whole packs.
inline int64_t slot_packs(int64_t H, int elem_size) {
  return whole_packs(H, elem_size) ? H * elem_size / 16 : ((H - 1) * elem_size + 15) / 16;
}

// The threads G of a row that needs `need` (its slot packs over the packs a thread holds, so
// the row is read once): a power of two up to 32 (several rows a warp), then a multiple of 32
// (H = 5125 bf16 forward takes 96 threads, 16387 takes 288: not 128 and 512).
inline int64_t row_lanes(int64_t need) {
  int64_t G = 1;
  while (G < need && G < 32) G *= 2;
  return G < need ? (need + 31) / 32 * 32 : G;
}
// A row's plan in one tier, for a row that needs `need` threads: G = row_lanes threads. Blocks
// of R = 128 / G rows when G divides 128 (128-thread blocks keep up to 16 blocks an SM resident
// when rows are short), else of one row. A row that needs more than `split` threads (and
// max_cluster > 1) is split over a thread-block cluster of CTAs that add their partial sums
// through distributed shared memory: the fewest CTAs (a power of two from 2 to max_cluster) of
// at most `cta_threads` threads each, a multiple of 32. Not ok past max_threads threads in one
// CTA, or past max_cluster CTAs of cta_threads.
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
// A row's plan: row_plan_one_tier's, but for the first tier (small_cluster > 1): a row that
// needs more than `small_split` threads takes instead the fewest CTAs (2 to small_cluster) of at
// most kRowSmallCtaThreads threads each, where there are such CTAs and they hold no more threads
// than the one-tier plan (bf16 backward H = 9000, 141 threads: one CTA of 160, not two of 96:
// 1.16 of an add against 1.35, bench/NOTES.md v16).
// `whole_slots`: the row's whole packs in slots, the rest apart (row_tail_plan), not slot_packs.
inline RowPlan row_plan(int64_t H, int elem_size, int packs_per_thread, int split = kRowMaxThreads,
                        int cta_threads = kRowMaxThreads, int max_cluster = 1, int max_threads = kRowMaxThreads,
                        int small_split = kRowMaxThreads, int small_cluster = 0, bool whole_slots = false) {
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

// The row kernels' split point and CTA size for rows of clusters, and the largest cluster
// (all tunable: _tune_rows' cta_threads sets both the split and the CTA size, and then rows
// take CTAs of that size only, without the first tier of kRowSmallCtaThreads). `clusters`: the
// device launches clusters (sm_90 and later).
inline int row_split_threads(bool backward) {
  const RowTuning t = row_tuning();
  if (t.cta_threads > 0) return t.cta_threads;
  return backward ? kRowBwdSplit : kRowFwdSplit;
}
inline int row_cta_threads() {
  const RowTuning t = row_tuning();
  return t.cta_threads > 0 ? t.cta_threads : kRowClusterCtaThreads;
}
inline int row_max_cluster(bool clusters) {
  if (!clusters) return 1;
  const RowTuning t = row_tuning();
  return t.max_cluster > 0 ? t.max_cluster : kRowMaxCluster;
}
inline int row_small_cluster(bool backward) {
  if (row_tuning().cta_threads > 0) return 0;
  return backward ? kRowBwdSmallCluster : kRowFwdSmallCluster;
}

// The row plan of one launch: the table's (or the tuning's) split, CTA size and cluster cap;
// the wide builds' CTAs hold at most kRowWideThreads threads (so do their rows without clusters).
inline RowPlan row_plan_for(bool backward, bool mul, int64_t H, int elem_size, int packs_per_thread, bool clusters,
                            bool whole_slots = false) {
  const int cap = wide_build(backward, mul, packs_per_thread) ? kRowWideThreads : kRowMaxThreads;
  const int split = std::min(row_split_threads(backward), cap);
  return row_plan(H, elem_size, packs_per_thread, split, std::min(row_cta_threads(), cap), row_max_cluster(clusters),
                  cap, backward ? kRowBwdSmallSplit : mul ? std::min(split, kRowMulFwdSmallSplit) : split,
                  row_small_cluster(backward), whole_slots);
}

// Packs a thread of the row kernels for one op and row: the wide builds' count, but rows not
// of whole packs (every launch realigns them) hold at most 64 elements a thread (4 x the element
// size in packs): PolyNorm's forward of 2-byte rows then takes the narrow build (8 packs, or 7
// below). Its
// realigned sums (a shuffle and a realignment a pack when this was measured, before the
// same-phase stage of bench/NOTES.md v13) and the idle slots of its rounded G cost
// issue slots that 16 packs of 8 elements a thread cannot spare (bench/NOTES.md v10, call 2: bf16
// H = 5125 forward 1.37 of a copy at 8 packs against 1.66 at 16; 4097 and 16385, which slot_packs
// leaves no idle slot either way, 1.20 / 1.25 against 1.20 / 1.19: kept narrow, one rule); every
// other op and dtype holds 64 elements or fewer a thread at the wide count and is faster wide
// (backward 5125 / 16385: 1.72 / 1.69 of an add against 1.93 / 1.86 at 4 packs; fp32 forward
// 4097: 1.23 against 1.32; the fused op 10-25% faster both ways).
//
// Rows not of whole packs, of more than a warp, take one pack fewer where that covers the row's
// slot packs with fewer slots on at most 256 threads (every op but the fused backward, whose 3
// packs of three tensors would not be a wide build): a row's lanes are rounded up to whole
// warps, so bf16 H = 5125 (641 slot packs) at 8 packs takes 96 threads, 768 slots, its last
// warp's half idle, and every lane-slot loop of a same-phase row works on them; at 7, 96
// threads and 672 slots (bf16 5125, bench/NOTES.md v15, against the untrimmed count in the same
// run: PolyNorm backward 1.56 -> 1.43 of an add, forward 1.20 -> 1.11 of a copy; the fused forward
// 1.16 -> 1.12 of an add; fp32 backward 1.22 -> 1.17; the fp32 forward unchanged). The choice depends on the op, H and the element size only
// (never on clusters or M), like every row's packs; `trim` false (a bench's A/B, _tune_rows'
// trim_packs) gives the count without it.
//
// The fused forward's rows of whole packs, of more than a warp, that leave more than a quarter of
// their slots idle at its 8 packs take 4 (a narrow build: 80 registers, the realigning build, on rows that need no
// realignment) where that takes fewer slots on at most kRowMinThreads (128) threads, the band
// measured (rows of 160 lanes at 4 packs, bf16 4104-4600, were not: they keep 8): bf16 H = 3000 (375 packs) on 64
// lanes of 8 holds 512 slots, 27% idle, on 96 of 4 384. Measured on an H200 (bench/NOTES.md v21,
// h200-2026-12-03b/call1/exp_packs.log, bf16 at M·H = 2^26, over an add in one run): 3000 1.106 ->
// 1.038 (6 packs on 64 lanes: 1.049); the table against `trim_packs` false (call2/tune.log): 3000
// 1.053 against 1.114, 2304 1.198 against 1.268, fp32 1500 1.009 against 1.013. Not taken where it was slower in that run: odd rows (3001,
// same-phase, 7 packs 1.133 against 4 packs 1.152; 5125 1.112 against 1.317), PolyNorm's backward
// at 4 or 5 packs (80 registers: 1.2-1.7 at 3000-6001) and the fused backward at 3 (1.16-1.59
// against 1.04-1.37). `trim` false: the wide count here too.
inline int row_packs(bool backward, bool mul, int64_t H, int elem_size, bool trim = true, bool narrow = false) {
  const int wide = mul ? (backward ? kRowMulBwdPacks : kRowMulFwdPacks) : (backward ? kRowBwdPacks : kRowFwdPacks);
  // `narrow` (a bench's A/B, _tune_rows' narrow_forward): PolyNorm's forward of 2-byte rows of whole packs at the
  // narrow build's count (half), as its odd rows; its aligned rows then take the pack-realigned narrow build.
  if (narrow && !backward && !mul && elem_size == 2 && whole_packs(H, elem_size)) return wide / 2;
  if (whole_packs(H, elem_size)) {
    if (!trim || !mul || backward) return wide;
    const int64_t slots = slot_packs(H, elem_size), half = wide / 2;
    const int64_t at = row_lanes((slots + wide - 1) / wide), halved = row_lanes((slots + half - 1) / half);
    return at > 32 && 4 * slots < 3 * at * wide && halved <= kRowMinThreads && halved * half < at * wide ? int(half)
                                                                                                     : wide;
  }
  const int packs = std::min(wide, 4 * elem_size);
  if (!trim || (backward && mul)) return packs;  // 3 packs each of three tensors would not be a wide build
  const int64_t slots = slot_packs(H, elem_size);
  const int64_t at = row_lanes((slots + packs - 1) / packs), fewer = row_lanes((slots + packs - 2) / (packs - 1));
  return at > 32 && fewer <= kRowWideThreads && fewer * (packs - 1) < at * packs ? packs - 1 : packs;
}

// The smallest power-of-two G that covers the row's packs with packs_per_thread packs per
// thread, up to kMaxGroup (longer rows are walked tile by tile); kBlockThreads / G rows a block.
inline TiledPlan tiled_plan(int64_t H, int elem_size, int packs_per_thread) {
  const int64_t packs = (H * elem_size + 15) / 16;
  int G = 1;
  while (G < kMaxGroup && int64_t(G) * packs_per_thread < packs) G *= 2;
  return {G, G >= kBlockThreads ? 1 : kBlockThreads / G};
}

// The fused backward's rows of clusters on CTAs of kRowStageThreads threads (2- and 4-byte dtypes) stage
// their packs a row ahead when aligned (backward.cuh, kAlignedStaged): each thread copies its packs of x,
// grad_out and mul into its own shared-memory stage (cp.async, 48 KB a CTA) and issues the next row's copies
// as soon as this row's are back in registers, so the next row's bytes are in flight through this row's
// sums, cluster exchange and stores. The same packs and sums: the same bits. Only rows of whole packs whose every
// slot is in the row (the rows measured and tested; H = 65536 and 131072 in 2-byte dtypes, 32768 and 65536 in
// fp32; odd rows are never aligned, so they never took it).
// Measured on an H200 (bench/NOTES.md v32, h200-2026-12-04d/call3/tune_mul.log, M·H = 2^26, over an add plus a
// copy, staged against unstaged in one run): bf16 65536 (8 x 256) 1.066 / 1.105, 131072 (16 x 256) 1.107 /
// 1.257; fp16 1.087 / 1.090, 1.100 / 1.161; fp32 32768 (8 x 256) 1.063 / 1.044, 65536 (16 x 256) 1.073 /
// 1.143. Not PolyNorm's backward, two tensors of 8 packs (64 KB a CTA): at bf16 131072 / 262144 1.123 / 1.198
// unstaged, 1.365 / 1.401 staged (call1/tune.log). `tuned` (_tune_rows' stage_rows): -1 the table's, 0 never,
// 1 every row the staged build serves (today the table's).
constexpr int kRowStageThreads = 256;
inline bool row_staged(bool backward, bool mul, int64_t H, int elem_size, int packs, const RowPlan& row,
                       int tuned = -1) {
  const bool full = whole_packs(H, elem_size) && int64_t(row.G) * row.cluster * packs == slot_packs(H, elem_size);
  const bool serves =
      backward && mul && elem_size <= 4 && row.cluster > 1 && row.threads == kRowStageThreads && full;
  return serves && tuned != 0;
}

// The fused backward's odd rows (2- and 4-byte dtypes) hold only their whole packs in slots, and the 2 to
// kVec - 1 elements past them apart on the row's last lane (its tail: packs.cuh row_tail; the builds
// kSamePhaseTail and kRealignedTail), where that takes fewer lanes than the slot_packs plan, a slot for their
// partial pack, and still whole warps on CTAs of at most 256 threads: bf16 5125 (640 packs and 5 elements)
// takes one CTA of 160 threads, not two of 96 in a cluster (161 lanes of 4 packs); 4103 (512 and 7) 128, not
// 160. Rows one element past whole packs keep their plan (their tail is slot_packs' one element). Returns the
// tail's elements, 0 where the rule does not serve; `row` then becomes the tail plan. Measured on an H200
// (bench/NOTES.md v33, h200-2026-12-04e/call2/tune_mul.log, M·H = 2^26, over an add plus a copy, against the
// slot_packs plan in one run): bf16 5125 1.126 / 1.198, 2051 1.127 / 1.332, 4103 1.142 / 1.151, 16387 1.190 /
// 1.362, 65539 1.289 / 1.491; fp16 5125 1.112 / 1.178; fp32 8195 1.063 / 1.104, but 2051 / 4099 1.072 / 1.071
// against 1.057 / 1.059 (one rule for every dtype all the same). Other ops keep slot_packs' plans: their
// tail builds are not written (PolyNorm's backward at 2051 / 4103 / 16387 would take 32 / 64 / 256 lanes).
// `tuned` (_tune_rows' tail_rows): false, never (the plans of before).
inline int row_tail_plan(bool backward, bool mul, int64_t H, int elem_size, int packs, bool clusters, RowPlan& row,
                         bool tuned = true) {
  if (!tuned || !backward || !mul || elem_size > 4 || whole_packs(H, elem_size) || !row.ok) return 0;
  const RowPlan t = row_plan_for(backward, mul, H, elem_size, packs, clusters, true);
  const int64_t lanes = int64_t(t.G) * t.cluster;
  if (!t.ok || t.threads > kRowWideThreads || lanes < 32 || lanes >= int64_t(row.G) * row.cluster) return 0;
  const int64_t tail = H - lanes * packs * (16 / elem_size);
  if (tail < 2 || tail >= 16 / elem_size) return 0;  // never, by the rounding of whole packs; the kernels' bound
  row = t;
  return static_cast<int>(tail);
}

// The table above. `out_misaligned`: the output rows are not whole aligned packs; no choice
// depends on it (both families write such rows themselves; tests/test_launch_plan.py pins it).
// `clusters`: the device launches thread-block clusters (sm_90 and later). `forced` (a
// benchmark's or a test's choice, _force_kernel) picks the other family when that family can
// serve the row (the tiled kernels serve every row); otherwise the table's choice stands.
inline LaunchPlan plan_launch(bool backward, bool mul, int64_t H, int elem_size, [[maybe_unused]] bool out_misaligned,
                              KernelKind forced = KernelKind::kAuto, bool clusters = true) {
  LaunchPlan plan{};
  plan.packs = row_packs(backward, mul, H, elem_size, row_tuning().trim_packs, row_tuning().narrow_forward);
  plan.row = row_plan_for(backward, mul, H, elem_size, plan.packs, clusters);
  plan.tiled = tiled_plan(H, elem_size, backward ? kBwdPacks : kFwdPacks);
  if (forced == KernelKind::kTiled || !plan.row.ok) {
    plan.kind = KernelKind::kTiled;
  } else {
    plan.kind = KernelKind::kRow;
  }
  plan.staged = plan.kind == KernelKind::kRow &&
                row_staged(backward, mul, H, elem_size, plan.packs, plan.row, row_tuning().stage_rows);
  plan.tail = plan.kind == KernelKind::kRow
                  ? row_tail_plan(backward, mul, H, elem_size, plan.packs, clusters, plan.row, row_tuning().tail_rows)
                  : 0;
  return plan;
}

inline std::string describe(const LaunchPlan& p) {
  switch (p.kind) {
    case KernelKind::kRow:
      return "row G=" + std::to_string(p.row.G) + " threads=" + std::to_string(p.row.threads) +
             " packs=" + std::to_string(p.packs) + " cluster=" + std::to_string(p.row.cluster) +
             (p.row.cluster > 1 ? " policy=" + std::to_string(row_cluster_policy(p.row.cluster)) : "") +
             (p.staged ? " staged=1" : "") + (p.tail > 0 ? " tail=" + std::to_string(p.tail) : "");
    default:
      return "tiled G=" + std::to_string(p.tiled.G) + " rows=" + std::to_string(p.tiled.rows);
  }
}

// The kernel family a benchmark or test forces on every CUDA launch (kAuto: the table's
// choice). Set through torch.ops.polynorm._force_kernel; defined in polynorm.cpp.
KernelKind forced_kernel();

}  // namespace polynorm
