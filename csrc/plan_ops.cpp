// The launch plan's private ops (schemas in ops.cpp): what csrc/launch_plan.h gives a row, said in
// words (_launch_plan), the rows where it changes (_plan_space), the row kernels compiled
// (_row_kernels), the realigned rows' phase (_realign_phase), and the parsing of an explicit
// launch configuration (the CUDA ops _forward_config, ...). Host code: no GPU needed.
#include "launch_plan.h"
#include "polynorm.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <string>
#include <vector>

namespace polynorm {
namespace {

// An op of the plan: its direction, the fused multiply, the grouped builds.
struct PlanOp {
  bool backward;
  bool mul;
  bool grouped;
};

PlanOp plan_op(const char* who, const std::string& op) {
  if (op == "forward") return {false, false, false};
  if (op == "backward") return {true, false, false};
  if (op == "mul_forward") return {false, true, false};
  if (op == "mul_backward") return {true, true, false};
  if (op == "grouped_forward") return {false, false, true};
  if (op == "grouped_backward") return {true, false, true};
  TORCH_CHECK_VALUE(false, who,
                    ": expected op to be forward, backward, mul_forward, mul_backward, grouped_forward or "
                    "grouped_backward, got '",
                    op, "'");
}

void check_dtype(const char* who, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16, who,
                    ": expected dtype to be float32, float64, float16 or bfloat16, got ", dtype);
}

// The C++ names of the kernels' template arguments, as in their source.
const char* scalar_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16: return "c10::BFloat16";
    case at::kHalf: return "c10::Half";
    case at::kFloat: return "float";
    default: return "double";
  }
}
const char* build_name(RowBuild b) {
  static const char* const names[kRowBuilds] = {"kAligned", "kRealigned", "kSamePhase", "kPackRealigned",
                                                "kAlignedStaged", "kSamePhaseTail", "kRealignedTail"};
  return names[static_cast<int>(b)];
}
const char* layout_name(RowBuild b) {
  static const char* const names[4] = {"aligned", "realigned", "same-phase", "pack-realigned"};
  return names[static_cast<int>(b)];
}
const char* flag(bool b) { return b ? "true" : "false"; }
bool of_whole_packs(RowBuild layout) { return layout == RowBuild::kAligned || layout == RowBuild::kPackRealigned; }

std::string row_kernel_name(bool backward, at::ScalarType dtype, const RowKernel& k) {
  return std::string(backward ? "poly_norm_bwd_row_kernel<" : "poly_norm_fwd_row_kernel<") + scalar_name(dtype) +
         "," + std::to_string(k.packs) + "," + build_name(k.build) + "," + std::to_string(k.max_threads) + "," +
         flag(k.mul) + "," + flag(k.grouped) + "," + flag(k.whole_warps) + ">";
}

// The rows' layout by name: "" for contiguous rows' (aligned for rows of whole packs, same-phase
// for odd ones). Rows of whole packs are aligned or pack-realigned (the outputs are new tensors,
// aligned); odd rows same-phase or realigned.
RowBuild row_layout(const char* who, const std::string& layout, int64_t H, int elem_size) {
  const bool whole = whole_packs(H, elem_size);
  if (layout.empty()) return whole ? RowBuild::kAligned : RowBuild::kSamePhase;
  for (int l = 0; l < 4; ++l) {
    if (layout != layout_name(static_cast<RowBuild>(l))) continue;
    TORCH_CHECK_VALUE(of_whole_packs(static_cast<RowBuild>(l)) == whole, who, ": rows of ", num(H), " elements of ",
                      num(int64_t{elem_size}), " bytes are never ", layout, " (",
                      whole ? "rows of whole 16-byte packs are aligned or pack-realigned"
                            : "odd rows are same-phase or realigned",
                      ")");
    return static_cast<RowBuild>(l);
  }
  TORCH_CHECK_VALUE(false, who, ": expected layout to be aligned, same-phase, realigned or pack-realigned, got '",
                    layout, "'");
}

// Tiled rows of at most kMaxGroup * packs packs stay in registers (one pass), longer ones are
// walked twice.
int tiled_passes(bool backward, int64_t H, int elem_size) {
  return (H * elem_size + 15) / 16 <= int64_t(kMaxGroup) * (backward ? kBwdPacks : kFwdPacks) ? 1 : 2;
}

// One plan in words (_launch_plan's answer).
std::string describe(const PlanOp& op, at::ScalarType dtype, int64_t H, RowBuild layout, const LaunchPlan& p) {
  const int elem_size = static_cast<int>(c10::elementSize(dtype));
  if (p.family == Family::kTiled) {
    return std::string("tiled threads=") + std::to_string(kMaxGroup) +
           " rows=1 passes=" + std::to_string(tiled_passes(op.backward, H, elem_size)) + " kernel=" +
           (op.backward ? "poly_norm_bwd_tiled_kernel<" : "poly_norm_fwd_tiled_kernel<") + scalar_name(dtype) + "," +
           flag(op.mul) + ">";
  }
  const RowKernel k = row_kernel_for(op.backward, op.mul, op.grouped, p, layout);
  const char* build = k.build == RowBuild::kAlignedStaged                                   ? "staged"
                      : k.build == RowBuild::kSamePhaseTail || k.build == RowBuild::kRealignedTail ? "tail"
                      : wide_build(op.backward, op.mul, p.packs)                                  ? "wide"
                                                                                                   : "narrow";
  std::string out = std::string("row build=") + build + " layout=" + layout_name(layout) +
                    " packs=" + std::to_string(p.packs) + " G=" + std::to_string(p.row.G) +
                    " threads=" + std::to_string(p.row.threads) + " cluster=" + std::to_string(p.row.cluster);
  if (p.row.cluster > 1) out += row_cluster_policy(p.row.cluster) == 0 ? " policy=default" : " policy=load-balancing";
  if (p.tail > 0) out += " tail=" + std::to_string(p.tail);
  out += " kernel=" + row_kernel_name(op.backward, dtype, k);
  if (!op.backward && (layout == RowBuild::kSamePhase || layout == RowBuild::kRealigned) &&
      row_stage_may_not_fit(k)) {
    out += " fallback=" + row_kernel_name(false, dtype, row_kernel_for(false, op.mul, op.grouped, p,
                                                                       RowBuild::kPackRealigned));
  }
  const RowKernel sizing = row_sizing_kernel(op.mul, op.grouped, p);
  if (op.backward && !(sizing == k)) out += " sized_by=" + row_kernel_name(true, dtype, sizing);
  return out;
}

// The plan's key for _plan_space: what its description says but the tail's exact length (the
// kernel says whether the rows are staged or have a tail).
struct PlanKey {
  Family family;
  int packs, G, threads, cluster, passes;
  RowKernel kernel;
  bool operator==(const PlanKey& o) const {
    return family == o.family && packs == o.packs && G == o.G && threads == o.threads && cluster == o.cluster &&
           passes == o.passes && kernel == o.kernel;
  }
};

PlanKey plan_key(const PlanOp& op, int64_t H, int elem_size, RowBuild layout, const LaunchPlan& p) {
  if (p.family == Family::kTiled) return {Family::kTiled, 0, 0, 0, 0, tiled_passes(op.backward, H, elem_size), {}};
  return {Family::kRow, p.packs, p.row.G, p.row.threads, p.row.cluster, 0,
          row_kernel_for(op.backward, op.mul, op.grouped, p, layout)};
}

}  // namespace

LaunchConfig launch_config(const char* op, const std::string& family, bool clusters) {
  if (family == "auto") return {Family::kAuto, clusters};
  if (family == "row") return {Family::kRow, clusters};
  if (family == "tiled") return {Family::kTiled, clusters};
  TORCH_CHECK_VALUE(false, op, ": expected family to be one of auto, row, tiled, got '", family, "'");
}

std::string launch_plan_op(const std::string& op, int64_t H, at::ScalarType dtype, const std::string& layout,
                           bool clusters, const std::string& family) {
  constexpr const char* who = "polynorm._launch_plan";
  const PlanOp o = plan_op(who, op);
  TORCH_CHECK_VALUE(H >= 1, who, ": expected H >= 1, got ", num(H));
  check_dtype(who, dtype);
  const int elem_size = static_cast<int>(c10::elementSize(dtype));
  const RowBuild l = row_layout(who, layout, H, elem_size);
  const LaunchConfig config = launch_config(who, family, clusters);
  const LaunchPlan p = plan_launch(o.backward, o.mul, H, elem_size, clusters, config.family);
  TORCH_CHECK_VALUE(config.family != Family::kRow || p.family == Family::kRow, who, ": the row kernels do not serve ",
                    op, " rows of ", num(H), " elements of ", num(int64_t{elem_size}), " bytes",
                    clusters ? "" : " without clusters");
  return describe(o, dtype, H, l, p);
}

std::vector<int64_t> plan_space_op(const std::string& op, at::ScalarType dtype, const std::string& layout,
                                   bool clusters) {
  constexpr const char* who = "polynorm._plan_space";
  const PlanOp o = plan_op(who, op);
  check_dtype(who, dtype);
  const int elem_size = static_cast<int>(c10::elementSize(dtype));
  TORCH_CHECK_VALUE(!layout.empty(), who, ": expected layout to be aligned, same-phase, realigned or pack-realigned");
  const bool whole = layout == "aligned" || layout == "pack-realigned";
  const RowBuild l = row_layout(who, layout, whole ? 16 / elem_size : 1, elem_size);  // H: any row of the layout
  // Past twice the longest row the row kernels serve, every row is tiled (the plan needs more
  // threads than a cluster holds).
  std::vector<int64_t> starts;
  PlanKey last{};
  int64_t last_row = 0;
  for (int64_t H = 1; H <= 2 * last_row + 1024; ++H) {
    if (whole_packs(H, elem_size) != whole) continue;
    const LaunchPlan p = plan_launch(o.backward, o.mul, H, elem_size, clusters);
    if (p.family == Family::kRow) last_row = H;
    const PlanKey key = plan_key(o, H, elem_size, l, p);
    if (starts.empty() || !(key == last)) starts.push_back(H);
    last = key;
  }
  return starts;
}

std::vector<std::string> row_kernels_op(const std::string& op, at::ScalarType dtype) {
  constexpr const char* who = "polynorm._row_kernels";
  const PlanOp o = plan_op(who, op);
  check_dtype(who, dtype);
  const int elem_size = static_cast<int>(c10::elementSize(dtype));
  std::vector<std::string> names;
  for (const int packs : {4, 7, 8, 15, 16}) {
    for (int b = 0; b < kRowBuilds; ++b) {
      for (const int max_threads : {kRowWideThreads, kRowMaxThreads}) {
        for (const bool whole_warps : {false, true}) {
          const RowKernel k{packs, static_cast<RowBuild>(b), max_threads, o.mul, o.grouped, whole_warps};
          if (row_kernel_compiled(o.backward, elem_size, k)) names.push_back(row_kernel_name(o.backward, dtype, k));
        }
      }
    }
  }
  return names;
}

int64_t realign_phase_op(const std::string& op, c10::IntArrayRef classes) {
  constexpr const char* who = "polynorm._realign_phase";
  TORCH_CHECK_VALUE(op == "forward" || op == "backward" || op == "mul_forward" || op == "mul_backward", who,
                    ": expected op to be forward, backward, mul_forward or mul_backward, got '", op, "'");
  const bool backward = op == "backward" || op == "mul_backward";
  const bool mul = op.rfind("mul_", 0) == 0;
  const size_t n = (backward ? 3 : 2) + (mul ? (backward ? 2 : 1) : 0);
  TORCH_CHECK_VALUE(classes.size() == n, who, ": expected ", num(int64_t(n)), " classes for ", op, ", got ",
                    num(int64_t(classes.size())));
  int c[5] = {0, 0, 0, 0, 0};
  for (size_t t = 0; t < n; ++t) c[t] = static_cast<int>(classes[t]);
  return realign_phase(backward, mul, c);
}

}  // namespace polynorm
