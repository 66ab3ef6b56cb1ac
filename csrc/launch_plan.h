// Which CUDA kernel serves a PolyNorm row, and with what geometry: host code only, so that
// the choice is a value that the CPU machine can compute and test
// (torch.ops.polynorm._launch_plan) and that a benchmark can force (_force_kernel).
//
// The table (bf16/fp16 figures; fp32 rows hold half as many elements, fp64 a quarter):
//
//   direction          | rows up to (bf16)   | kernel | why
//   -------------------+---------------------+--------+----------------------------------------
//   forward            | H <= 65536          | row    | the row in registers (8 packs of x a
//                      |                     |        | thread, G <= 1024): read once, one
//                      |                     |        | reduction, no barrier but its own
//   forward            | longer, stage fits  | staged | cp.async stages in shared memory
//   forward            | longer still        | tiled  | the row walked twice (2nd pass in L2)
//   backward           | H <= 32768          | row    | x and grad_y in registers (4 packs each)
//   backward           | longer, stage fits  | staged | as forward
//   backward           | longer still        | tiled  | as forward
//   mul_forward        | H <= 32768          | row    | x and mul (4 packs each)
//   mul_forward        | longer              | tiled  | (no staged build of the fused op)
//   mul_backward       | H <= 16384          | row    | x, grad_out and mul (2 packs each)
//   mul_backward       | longer              | tiled  |
//   grouped_*          | as forward/backward | row    | the same kernels, a per-row expert;
//                      |                     | tiled  | where the table says staged (no
//                      |                     |        | per-row expert there)
//
// Every choice depends on H, the dtype and the device's shared-memory limit, never on M
// (nor on E), so a row's bits do not depend on the batch it comes in. Misaligned rows (odd
// H, a view that starts off a 16-byte boundary) take the same kernel in a realigning build
// (RowLayout: realigned, or same-phase when every tensor's rows start alike).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

namespace polynorm {

// Row kernels: a row held in registers by G threads (a power of two), kPacks 16-byte
// packs per thread and tensor.
constexpr int kRowFwdPacks = 8;      // 128 bytes of x per thread
constexpr int kRowBwdPacks = 4;      // 64 bytes each of x and grad_y per thread
constexpr int kRowMulFwdPacks = 4;   // x and mul
constexpr int kRowMulBwdPacks = 2;   // x, grad_out and mul
constexpr int kRowMinThreads = 128;  // block size when G < 128: R = 128 / G rows a block
constexpr int kRowMaxThreads = 1024;
// Clusters (sm_90): a row that needs more threads than kRowFwdSplit (forward, mul_forward) or
// kRowBwdSplit (backward, mul_backward) is split over a cluster of CTAs of at most
// kRowClusterCtaThreads threads, up to kRowMaxCluster CTAs (8: the portable cluster size,
// which every sm_90 device launches). Measured on an H200 (bench/NOTES.md, v6,
// call1/tune_clusters.log): one CTA of 512 threads beats two of 256 in the forward (H = 32768
// bf16: 1.21 against 1.31 of a copy), two CTAs of 256 beat one of 512 in the backward
// (16384: 1.26 against 1.34 of an add), and CTAs of 512 threads beat CTAs of 1024 (64
// registers, spills) and mostly those of 256 for longer rows.
constexpr int kRowFwdSplit = 512;
constexpr int kRowBwdSplit = 256;
constexpr int kRowClusterCtaThreads = 512;
constexpr int kRowMaxCluster = 8;

// Bench-only tuning of the row kernels (torch.ops.polynorm._tune_rows): packs a thread for
// PolyNorm's forward and backward (bf16 and fp16 only; 0 = the table's), and the forward's
// grid: 0 = one block per R rows (the hardware schedules them), k > 0 = at most k blocks per
// resident slot, each walking rows k * slots apart, -1 = the table's (launch_forward_row).
// Defined in polynorm.cpp.
struct RowTuning {
  int fwd_packs;
  int bwd_packs;
  int grid_waves;
  bool prefetch;    // forward, aligned 2-byte rows: the next row's loads in flight (kPrefetch)
  bool same_phase;  // misaligned rows that start alike in every tensor: the same-phase path
  int cta_threads;  // the most threads of a row in one CTA before it is split over a cluster (0 = the table's)
  int max_cluster;  // the most CTAs a row (0 = the table's, kRowMaxCluster)
};
RowTuning row_tuning();

// Tiled kernels: up to kMaxGroup threads a row, R = kBlockThreads / G rows a block, and
// kFwdPacks (kBwdPacks) packs per thread and tensor in registers per tile. With
// 1024-thread groups the register cap is 64 a thread, which these counts fit.
constexpr int kBlockThreads = 256;
constexpr int kMaxGroup = 1024;
constexpr int kFwdPacks = 4;
constexpr int kBwdPacks = 2;

// Staged kernels: R rows a stage whose inputs stay within kStageBytes (32 KB), three
// buffers when they fit (two stages of copies in flight while the third is computed).
constexpr int64_t kStageBytes = 32 * 1024;

enum class KernelKind { kAuto, kRow, kStaged, kTiled };

struct RowPlan {
  bool ok;
  int G;        // threads a row in one CTA
  int threads;  // threads a block: R * G
  int cluster;  // CTAs a row: 1, or a thread-block cluster of 2-16 CTAs of G threads each
};

struct StagedGeometry {
  int rows;         // R rows per stage, one group of G = blockDim.x / R threads each
  int pitch;        // 16-byte chunks per staged row: packs + 1 (room for a misaligned start)
  int buffers;      // 1..3: stages in flight + 1; 1: the next stage loads after this one is done
  bool out_staged;  // the output rows are misaligned or H * size is not a multiple of 16
};

struct StagedPlan {
  bool ok;
  int threads;
  size_t smem;
  StagedGeometry geo;
};

struct TiledPlan {
  int G;     // threads a row (blockDim.x)
  int rows;  // rows a block (blockDim.y)
};

struct LaunchPlan {
  KernelKind kind;  // kRow, kStaged or kTiled
  int packs;        // row kernels: packs per thread and tensor
  RowPlan row;
  StagedPlan staged;
  TiledPlan tiled;
};

// G threads a row, the fewest with G * packs_per_thread >= the row's packs, so the row is
// read once: a power of two up to 32 (several rows a warp), then a multiple of 32 (H = 5125
// bf16 forward takes 96 threads, 16385 takes 288: not 128 and 512). Blocks of R = 128 / G
// rows when G divides 128 (128-thread blocks keep up to 16 blocks an SM resident when rows
// are short), else of one row.
// A row that needs more than `split` threads (and max_cluster > 1) is split over a
// thread-block cluster: the fewest CTAs (a power of two from 2 to max_cluster) of at most
// `cta_threads` threads each (a multiple of 32), which add their partial sums through
// distributed shared memory. Not ok past kRowMaxThreads threads in one CTA, or past
// max_cluster CTAs of cta_threads.
inline RowPlan row_plan(int64_t H, int elem_size, int packs_per_thread, int split = kRowMaxThreads,
                        int cta_threads = kRowMaxThreads, int max_cluster = 1) {
  const int64_t packs = (H * elem_size + 15) / 16;
  const int64_t need = (packs + packs_per_thread - 1) / packs_per_thread;
  int64_t G = 1;
  while (G < need && G < 32) G *= 2;
  if (G < need) G = (need + 31) / 32 * 32;
  if (G > split && max_cluster > 1) {
    int64_t C = 2;
    while (C < max_cluster && (need + C - 1) / C > cta_threads) C *= 2;
    const int64_t per_cta = ((need + C - 1) / C + 31) / 32 * 32;
    if (per_cta > cta_threads) return {false, 0, 0, 0};
    return {true, static_cast<int>(per_cta), static_cast<int>(per_cta), static_cast<int>(C)};
  }
  if (G > kRowMaxThreads) return {false, 0, 0, 0};
  const int64_t rows = G < kRowMinThreads && kRowMinThreads % G == 0 ? kRowMinThreads / G : 1;
  return {true, static_cast<int>(G), static_cast<int>(rows * G), 1};
}

// The row kernels' split point and CTA size for rows of clusters, and the largest cluster
// (all tunable: _tune_rows' cta_threads sets both the split and the CTA size). `clusters`:
// the device launches clusters (sm_90 and later).
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

// The row plan of one launch: the table's (or the tuning's) split, CTA size and cluster cap.
inline RowPlan row_plan_for(bool backward, int64_t H, int elem_size, int packs_per_thread, bool clusters) {
  return row_plan(H, elem_size, packs_per_thread, row_split_threads(backward), row_cta_threads(),
                  row_max_cluster(clusters));
}

// Packs a thread of the row kernels for one op and element size (the tuning applies to
// PolyNorm's own 2-byte builds, the only ones built with other counts).
inline int row_packs(bool backward, bool mul, int64_t H, int elem_size) {
  if (mul) return backward ? kRowMulBwdPacks : kRowMulFwdPacks;
  const RowTuning t = row_tuning();
  const int tuned = backward ? t.bwd_packs : t.fwd_packs;
  if (elem_size == 2 && tuned > 0) return tuned;
  // 8 packs a thread forward (4 for the backward's two tensors): 4 packs forward measured
  // 1-4% slower than 8 at H = 4096 once 8 packs stopped spilling (bench/NOTES.md, v5).
  return backward ? kRowBwdPacks : kRowFwdPacks;
}

// R rows per stage: the most (a power of two, <= 256) whose inputs stay within
// kStageBytes. 256 threads, G = 256 / R a row; a one-row stage of 16 KB or more gets 512
// threads, so that the arithmetic of a long row is spread over more warps. Fewer buffers
// when three do not fit the limit; not ok when even one does not.
inline StagedPlan staged_plan(int64_t H, int elem_size, int inputs, bool out_staged, int64_t smem_limit) {
  const int64_t packs = (H * elem_size + 15) / 16;
  const int64_t pitch = packs + 1;
  const int64_t row_bytes = pitch * 16 * inputs;
  int R = 1;
  while (R < 256 && 2 * R * row_bytes <= kStageBytes) R *= 2;
  const int threads = (R == 1 && row_bytes >= 16 * 1024) ? 512 : 256;
  const int64_t out_bytes = out_staged ? R * pitch * 16 : 0;
  for (int buffers = 3; buffers >= 1; --buffers) {
    const int64_t smem = buffers * R * row_bytes + out_bytes;
    if (smem <= smem_limit && pitch < (int64_t(1) << 30)) {
      return {true, threads, static_cast<size_t>(smem),
              StagedGeometry{R, static_cast<int>(pitch), buffers, out_staged}};
    }
  }
  return {false, 0, 0, StagedGeometry{}};
}

// The smallest power-of-two G that covers the row's packs with packs_per_thread packs per
// thread, up to kMaxGroup (longer rows are walked tile by tile); kBlockThreads / G rows a block.
inline TiledPlan tiled_plan(int64_t H, int elem_size, int packs_per_thread) {
  const int64_t packs = (H * elem_size + 15) / 16;
  int G = 1;
  while (G < kMaxGroup && int64_t(G) * packs_per_thread < packs) G *= 2;
  return {G, G >= kBlockThreads ? 1 : kBlockThreads / G};
}

// The table above. `out_misaligned`: the output rows are not whole aligned packs (the staged
// kernels then stage the output too); `smem_limit`: dynamic shared memory a block may use.
// `forced` (a benchmark's or a test's choice, _force_kernel) picks another family when
// that family can serve the row; otherwise the table's choice stands.
inline LaunchPlan plan_launch(bool backward, bool mul, int64_t H, int elem_size, bool out_misaligned,
                              int64_t smem_limit, KernelKind forced = KernelKind::kAuto, bool clusters = true) {
  LaunchPlan plan{};
  plan.packs = row_packs(backward, mul, H, elem_size);
  plan.row = row_plan_for(backward, H, elem_size, plan.packs, clusters);
  plan.staged = mul ? StagedPlan{} : staged_plan(H, elem_size, backward ? 2 : 1, out_misaligned, smem_limit);
  plan.tiled = tiled_plan(H, elem_size, backward ? kBwdPacks : kFwdPacks);
  if (forced == KernelKind::kRow && plan.row.ok) {
    plan.kind = KernelKind::kRow;
  } else if (forced == KernelKind::kStaged && plan.staged.ok) {
    plan.kind = KernelKind::kStaged;
  } else if (forced == KernelKind::kTiled) {
    plan.kind = KernelKind::kTiled;
  } else {
    plan.kind = plan.row.ok ? KernelKind::kRow : plan.staged.ok ? KernelKind::kStaged : KernelKind::kTiled;
  }
  return plan;
}

inline std::string describe(const LaunchPlan& p) {
  switch (p.kind) {
    case KernelKind::kRow:
      return "row G=" + std::to_string(p.row.G) + " threads=" + std::to_string(p.row.threads) +
             " packs=" + std::to_string(p.packs) +
             " cluster=" + std::to_string(p.row.cluster);
    case KernelKind::kStaged:
      return "staged R=" + std::to_string(p.staged.geo.rows) + " threads=" + std::to_string(p.staged.threads) +
             " buffers=" + std::to_string(p.staged.geo.buffers) + " smem=" + std::to_string(p.staged.smem);
    default:
      return "tiled G=" + std::to_string(p.tiled.G) + " rows=" + std::to_string(p.tiled.rows);
  }
}

// The kernel family a benchmark or test forces on every CUDA launch (kAuto: the table's
// choice). Set through torch.ops.polynorm._force_kernel; defined in polynorm.cpp.
KernelKind forced_kernel();

}  // namespace polynorm
