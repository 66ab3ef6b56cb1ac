// Operator schemas (one TORCH_LIBRARY block for every backend) and the argument
// checks that all backends share.
#include "polynorm.h"

#include "launch_plan.h"

#include <c10/core/ScalarType.h>
#include <torch/library.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <string>

namespace polynorm {

at::ScalarType opmath_dtype(at::ScalarType x_dtype) {
  return x_dtype == at::kDouble ? at::kDouble : at::kFloat;
}

Rows as_rows(const at::Tensor& t) {
  const int64_t H = t.size(-1);
  const int64_t M = H == 0 ? 0 : t.numel() / H;
  // The leading dims collapse into one row stride when each is nested in the next:
  // stride[d] == stride[d + 1] * size[d + 1] for every leading dim of size > 1.
  bool strided_rows = H == 1 || t.stride(-1) == 1;
  int64_t row_stride = H;
  int64_t expected = -1;  // the stride the next-outer non-trivial dim must have
  for (int64_t d = t.dim() - 2; d >= 0 && strided_rows; --d) {
    if (t.size(d) == 1) continue;
    if (expected < 0) {
      row_stride = t.stride(d);
    } else if (t.stride(d) != expected) {
      strided_rows = false;
    }
    expected = t.stride(d) * t.size(d);
  }
  if (strided_rows && row_stride >= 0) return {t, M, H, row_stride};
  // Any other layout (a transposed x, a last dim with stride != 1, an expand over
  // the last dim) is copied once into contiguous rows.
  return {t.contiguous(), M, H, H};
}

namespace {

// Numbers and shapes are formatted here (to_string, snprintf), never streamed into a
// std::ostream, the bounds in a message too: integer insertion looks its num_put facet up by
// a process-wide id (a GNU unique symbol), which a second copy of the C++ runtime in the
// process can number for its own locale. The stream then fails (the message is cut) or
// crashes (the H200 suite's worker, torch 2.11: SIGSEGV in _tune_rows' error); strings and
// torch's own types are not formatted through a facet. _tune_rows' messages are pinned whole
// by tests/test_launch_plan.py (TUNE_ROWS_ERRORS).
using ::polynorm::num;  // num(int64_t), polynorm.h: also for the CUDA launchers' messages
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}
std::string shape(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

void check_defined(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": expected ", name, " to be a Tensor, got None");
}

void check_params(const char* op, const at::Tensor& x, const at::Tensor& weight) {
  check_defined(op, "weight", weight);
  TORCH_CHECK(is_supported_float(weight.scalar_type()), op,
              ": expected weight to be float32, float64, float16 or bfloat16, got ", weight.scalar_type());
  TORCH_CHECK(weight.numel() == 3, op, ": expected weight to have 3 elements [w0, w1, w2], got ",
              num(weight.numel()), " (shape ", shape(weight.sizes()), ")");
  TORCH_CHECK(weight.device() == x.device(), op, ": expected weight on x's device ", x.device(),
              ", got ", weight.device());
}

void check_x(const char* op, const char* name, const at::Tensor& x) {
  check_defined(op, name, x);
  TORCH_CHECK(is_supported_float(x.scalar_type()), op, ": expected ", name,
              " to be float32, float64, float16 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 1, op, ": expected ", name, " to have at least 1 dimension (..., H), got a 0-d tensor");
  TORCH_CHECK(x.size(-1) >= 1, op, ": expected ", name, " to have a last dimension H >= 1, got shape ",
              shape(x.sizes()));
}

}  // namespace

namespace {

void check_bias(const char* op, const at::Tensor& x, const at::Tensor& bias) {
  check_defined(op, "bias", bias);
  TORCH_CHECK(is_supported_float(bias.scalar_type()), op,
              ": expected bias to be float32, float64, float16 or bfloat16, got ", bias.scalar_type());
  TORCH_CHECK(bias.numel() == 1, op, ": expected bias to have 1 element (shape (1,) or ()), got ",
              num(bias.numel()), " (shape ", shape(bias.sizes()), ")");
  TORCH_CHECK(bias.device() == x.device(), op, ": expected bias on x's device ", x.device(), ", got ",
              bias.device());
}

void check_eps(const char* op, double eps) {
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0.0, op, ": expected eps to be finite and >= 0, got ", num(eps));
}

// `other` (grad_y, mul, grad_out) has x's shape, dtype and device.
void check_like_x(const char* op, const char* name, const at::Tensor& other, const at::Tensor& x) {
  check_defined(op, name, other);
  TORCH_CHECK(other.sizes() == x.sizes(), op, ": expected ", name, " to have x's shape ", shape(x.sizes()),
              ", got ", shape(other.sizes()));
  TORCH_CHECK(other.scalar_type() == x.scalar_type(), op, ": expected ", name, " to have x's dtype ",
              x.scalar_type(), ", got ", other.scalar_type());
  TORCH_CHECK(other.device() == x.device(), op, ": expected ", name, " on x's device ", x.device(), ", got ",
              other.device());
}

void check_rstd(const char* op, const at::Tensor& x, const at::Tensor& rstd) {
  check_defined(op, "rstd", rstd);
  const int64_t M = x.numel() / x.size(-1);
  TORCH_CHECK(rstd.dim() == 2 && rstd.size(0) == M && rstd.size(1) == 3, op,
              ": expected rstd of shape [", num(M), ", 3] (rows of x, then r_3, r_2, r_1), got ", shape(rstd.sizes()));
  TORCH_CHECK(rstd.scalar_type() == opmath_dtype(x.scalar_type()), op, ": expected rstd of dtype ",
              opmath_dtype(x.scalar_type()), " for x of dtype ", x.scalar_type(), ", got ", rstd.scalar_type());
  TORCH_CHECK(rstd.device() == x.device(), op, ": expected rstd on x's device ", x.device(), ", got ",
              rstd.device());
}

}  // namespace

void check_forward_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  constexpr const char* op = "polynorm.forward";
  check_x(op, "x", x);
  check_params(op, x, weight);
  check_bias(op, x, bias);
  check_eps(op, eps);
}

void check_mul_forward_args(const at::Tensor& x, const at::Tensor& mul, const at::Tensor& weight,
                            const at::Tensor& bias, double eps) {
  constexpr const char* op = "polynorm.mul_forward";
  check_x(op, "x", x);
  check_like_x(op, "mul", mul, x);
  check_params(op, x, weight);
  check_bias(op, x, bias);
  check_eps(op, eps);
}

void check_backward_args(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight,
                         const at::Tensor& rstd) {
  constexpr const char* op = "polynorm.backward";
  check_x(op, "x", x);
  check_params(op, x, weight);
  check_like_x(op, "grad_y", grad_y, x);
  check_rstd(op, x, rstd);
}

void check_mul_backward_args(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& mul,
                             const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& rstd) {
  constexpr const char* op = "polynorm.mul_backward";
  check_x(op, "x", x);
  check_params(op, x, weight);
  check_bias(op, x, bias);
  check_like_x(op, "grad_out", grad_out, x);
  check_like_x(op, "mul", mul, x);
  check_rstd(op, x, rstd);
}

namespace {

std::atomic<int> g_forced_kernel{static_cast<int>(KernelKind::kAuto)};

KernelKind kernel_kind(const std::string& name) {
  if (name == "auto") return KernelKind::kAuto;
  if (name == "row") return KernelKind::kRow;
  if (name == "tiled") return KernelKind::kTiled;
  TORCH_CHECK_VALUE(false, "polynorm._force_kernel: expected kind to be one of auto, row, tiled, got '", name,
                    "'");
}

// Bench and test hook: every later CUDA launch takes this kernel family where it can serve
// the row (launch_plan.h). Process-wide; "auto" restores the table's choice.
void force_kernel(const std::string& kind) { g_forced_kernel.store(static_cast<int>(kernel_kind(kind))); }

std::atomic<int> g_grid_waves{-1};
std::atomic<bool> g_same_phase{true};
std::atomic<int> g_cta_threads{0};
std::atomic<int> g_max_cluster{0};
std::atomic<bool> g_trim_packs{true};
std::atomic<int> g_stagger{-1};
std::atomic<int> g_sum_apart{-1};
std::atomic<int> g_cluster_policy{-1};
std::atomic<int> g_stage_rows{-1};
std::atomic<bool> g_tail_rows{true};
std::atomic<bool> g_narrow_forward{false};
std::atomic<int> g_forward_regs{0};

// Bench hook: the row kernels' grid (0 = a block per R rows, k > 0 = at most k blocks per
// resident slot, -1 = the table's), the same-phase path of misaligned rows, the most threads
// of a row in one CTA before the row is split over a thread-block cluster of CTAs of that size
// (0 = the table's, whose split rows take CTAs of 128 first; a size set here takes one tier, so
// 512 gives the table of before the fourteenth session; the wide builds cap it at 256), the largest cluster (0 = the table's; past 8 CTAs, not portable: a
// device that cannot place the row's cluster takes the tiled kernels), whether half-idle odd rows take a pack fewer (row_packs),
// the clock cycles between the quarters of a row grid's first wave (-1 = the table's; launch.cuh, row_stagger),
// who sums the backward's dW / dB partials (-1 = the table's, 0 the row kernel's last block, 1 a kernel of their
// own; launch_plan.h, row_sum_apart), and the cluster scheduling policy preference of rows of clusters (-1 = the
// table's, 0 the default, 1 spread, 2 load balancing; launch_plan.h, row_cluster_policy), and whether the fused
// backward's aligned rows of clusters are staged a row ahead (-1 = the table's, 0 never, 1 wherever the staged
// build serves; launch_plan.h, row_staged), and whether the fused backward's odd rows take fewer lanes with a wide
// tail where that serves (true, the table's; false, never: the plans of before the thirtieth session;
// launch_plan.h, row_tail_plan), and whether PolyNorm's forward of 2-byte rows of whole packs takes the narrow
// build's count (false, the table's; launch_plan.h, row_packs), and the registers a thread of PolyNorm's aligned
// forward of the wide build (0 = the table's build, 96 or 80 = a build capped so; launch_plan.h, RowTuning).
// Process-wide; _tune_rows() restores the defaults.
void tune_rows(int64_t grid_waves, bool same_phase, int64_t cta_threads, int64_t max_cluster, bool trim_packs,
               int64_t stagger, int64_t sum_apart, int64_t cluster_policy, int64_t stage_rows, bool tail_rows,
               bool narrow_forward, int64_t forward_regs) {
  TORCH_CHECK_VALUE(grid_waves >= -1 && grid_waves <= 64, "polynorm._tune_rows: expected -1 <= grid_waves <= 64, got ",
                    num(grid_waves));
  TORCH_CHECK_VALUE(cta_threads == 0 || (cta_threads >= 32 && cta_threads <= kRowMaxThreads && cta_threads % 32 == 0),
                    "polynorm._tune_rows: expected cta_threads to be 0 or a multiple of 32 in [32, ",
                    num(int64_t{kRowMaxThreads}), "], got ", num(cta_threads));
  TORCH_CHECK_VALUE(max_cluster == 0 || max_cluster == 1 || max_cluster == 2 || max_cluster == 4 ||
                        max_cluster == 8 || max_cluster == 16,
                    "polynorm._tune_rows: expected max_cluster to be 0, 1, 2, 4, 8 or 16, got ", num(max_cluster));
  TORCH_CHECK_VALUE(stagger >= -1 && stagger <= 100000, "polynorm._tune_rows: expected -1 <= stagger <= 100000, got ",
                    num(stagger));
  TORCH_CHECK_VALUE(sum_apart >= -1 && sum_apart <= 1, "polynorm._tune_rows: expected -1 <= sum_apart <= 1, got ",
                    num(sum_apart));
  TORCH_CHECK_VALUE(cluster_policy >= -1 && cluster_policy <= 2,
                    "polynorm._tune_rows: expected -1 <= cluster_policy <= 2, got ", num(cluster_policy));
  TORCH_CHECK_VALUE(stage_rows >= -1 && stage_rows <= 1, "polynorm._tune_rows: expected -1 <= stage_rows <= 1, got ",
                    num(stage_rows));
  TORCH_CHECK_VALUE(forward_regs == 0 || forward_regs == 80 || forward_regs == 96,
                    "polynorm._tune_rows: expected forward_regs to be 0, 80 or 96, got ", num(forward_regs));
  // Every check before any store: a rejected call changes nothing.
  g_grid_waves.store(static_cast<int>(grid_waves));
  g_same_phase.store(same_phase);
  g_cta_threads.store(static_cast<int>(cta_threads));
  g_max_cluster.store(static_cast<int>(max_cluster));
  g_trim_packs.store(trim_packs);
  g_stagger.store(static_cast<int>(stagger));
  g_sum_apart.store(static_cast<int>(sum_apart));
  g_cluster_policy.store(static_cast<int>(cluster_policy));
  g_stage_rows.store(static_cast<int>(stage_rows));
  g_tail_rows.store(tail_rows);
  g_narrow_forward.store(narrow_forward);
  g_forward_regs.store(static_cast<int>(forward_regs));
}

// The plan a CUDA launch would take: "row G=... threads=... packs=... cluster=..." (and, for rows of
// clusters, " policy=...": row_cluster_policy) or "tiled G=... rows=...". Computed on the host (no GPU
// needed).
std::string launch_plan_op(const std::string& op, int64_t H, at::ScalarType dtype, bool out_misaligned,
                           bool clusters) {
  TORCH_CHECK_VALUE(op == "forward" || op == "backward" || op == "mul_forward" || op == "mul_backward",
                    "polynorm._launch_plan: expected op to be forward, backward, mul_forward or mul_backward, got '",
                    op, "'");
  TORCH_CHECK_VALUE(H >= 1, "polynorm._launch_plan: expected H >= 1, got ", num(H));
  TORCH_CHECK_VALUE(is_supported_float(dtype), "polynorm._launch_plan: expected a float dtype, got ", dtype);
  const bool backward = op == "backward" || op == "mul_backward";
  const bool mul = op.rfind("mul_", 0) == 0;
  return describe(plan_launch(backward, mul, H, static_cast<int>(c10::elementSize(dtype)), out_misaligned,
                              forced_kernel(), clusters));
}

// The realigned row builds' phase (launch_plan.h, realign_phase) for tensors of the given phase
// classes: x, y (, mul) forward; x, grad_y, grad_x (, mul, grad_mul) backward.
int64_t realign_phase_op(const std::string& op, c10::IntArrayRef classes) {
  TORCH_CHECK_VALUE(op == "forward" || op == "backward" || op == "mul_forward" || op == "mul_backward",
                    "polynorm._realign_phase: expected op to be forward, backward, mul_forward or mul_backward, got '",
                    op, "'");
  const bool backward = op == "backward" || op == "mul_backward";
  const bool mul = op.rfind("mul_", 0) == 0;
  const size_t n = (backward ? 3 : 2) + (mul ? (backward ? 2 : 1) : 0);
  TORCH_CHECK_VALUE(classes.size() == n, "polynorm._realign_phase: expected ", num(int64_t(n)), " classes for ", op,
                    ", got ", num(int64_t(classes.size())));
  int c[5] = {0, 0, 0, 0, 0};
  for (size_t t = 0; t < n; ++t) c[t] = static_cast<int>(classes[t]);
  return realign_phase(backward, mul, c);
}

// Grouped ops: weight [E, 3] with E >= 1, offsets [E] of int32 or int64. Returns E.
int64_t check_grouped_params(const char* op, const at::Tensor& x, const at::Tensor& weight,
                             const at::Tensor& offsets) {
  check_defined(op, "weight", weight);
  TORCH_CHECK(is_supported_float(weight.scalar_type()), op,
              ": expected weight to be float32, float64, float16 or bfloat16, got ", weight.scalar_type());
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == 3, op,
              ": expected weight of shape [E, 3] (one [w0, w1, w2] row per expert), got ", shape(weight.sizes()));
  const int64_t E = weight.size(0);
  TORCH_CHECK(E >= 1, op, ": expected weight to have at least one expert (E >= 1), got shape ",
              shape(weight.sizes()));
  TORCH_CHECK(weight.device() == x.device(), op, ": expected weight on x's device ", x.device(), ", got ",
              weight.device());
  check_defined(op, "offsets", offsets);
  TORCH_CHECK(offsets.scalar_type() == at::kInt || offsets.scalar_type() == at::kLong, op,
              ": expected offsets to be int32 or int64, got ", offsets.scalar_type());
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) == E, op, ": expected offsets of shape [", num(E),
              "] (one cumulative end offset per expert of weight), got ", shape(offsets.sizes()));
  TORCH_CHECK(offsets.device() == x.device(), op, ": expected offsets on x's device ", x.device(), ", got ",
              offsets.device());
  return E;
}

}  // namespace

KernelKind forced_kernel() { return static_cast<KernelKind>(g_forced_kernel.load(std::memory_order_relaxed)); }
RowTuning row_tuning() {
  return {g_grid_waves.load(std::memory_order_relaxed), g_same_phase.load(std::memory_order_relaxed),
          g_cta_threads.load(std::memory_order_relaxed), g_max_cluster.load(std::memory_order_relaxed),
          g_trim_packs.load(std::memory_order_relaxed), g_stagger.load(std::memory_order_relaxed),
          g_sum_apart.load(std::memory_order_relaxed), g_cluster_policy.load(std::memory_order_relaxed),
          g_stage_rows.load(std::memory_order_relaxed), g_tail_rows.load(std::memory_order_relaxed),
          g_narrow_forward.load(std::memory_order_relaxed), g_forward_regs.load(std::memory_order_relaxed)};
}

void check_grouped_forward_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                const at::Tensor& offsets, double eps) {
  constexpr const char* op = "polynorm.grouped_forward";
  check_x(op, "x", x);
  const int64_t E = check_grouped_params(op, x, weight, offsets);
  check_defined(op, "bias", bias);
  TORCH_CHECK(is_supported_float(bias.scalar_type()), op,
              ": expected bias to be float32, float64, float16 or bfloat16, got ", bias.scalar_type());
  TORCH_CHECK((bias.dim() == 1 && bias.size(0) == E) || (bias.dim() == 2 && bias.size(0) == E && bias.size(1) == 1),
              op, ": expected bias of shape [", num(E), "] or [", num(E), ", 1] (weight's E experts), got ",
              shape(bias.sizes()));
  TORCH_CHECK(bias.device() == x.device(), op, ": expected bias on x's device ", x.device(), ", got ",
              bias.device());
  check_eps(op, eps);
}

void check_grouped_backward_args(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight,
                                 const at::Tensor& offsets, const at::Tensor& rstd) {
  constexpr const char* op = "polynorm.grouped_backward";
  check_x(op, "x", x);
  check_grouped_params(op, x, weight, offsets);
  check_like_x(op, "grad_y", grad_y, x);
  check_rstd(op, x, rstd);
}

}  // namespace polynorm

TORCH_LIBRARY(polynorm, m) {
  // Bench and test hooks for the CUDA launch plan (csrc/launch_plan.h); no tensors.
  m.def("_force_kernel(str kind) -> ()", &polynorm::force_kernel);
  m.def("_tune_rows(int grid_waves=-1, bool same_phase=True, int cta_threads=0, int max_cluster=0, "
        "bool trim_packs=True, int stagger=-1, int sum_apart=-1, int cluster_policy=-1, int stage_rows=-1, "
        "bool tail_rows=True, bool narrow_forward=False, int forward_regs=0) -> ()",
        &polynorm::tune_rows);
  // `clusters`: the device launches thread-block clusters (sm_90 and later), as an H200 does.
  m.def("_launch_plan(str op, int H, ScalarType dtype, bool out_misaligned=False, bool clusters=True) -> str",
        &polynorm::launch_plan_op);
  // Which tensor's phase a realigned row takes, for tensors of the given phase classes.
  m.def("_realign_phase(str op, int[] classes) -> int", &polynorm::realign_phase_op);
  // y has x's shape and dtype; rstd is [M, 3] = [r_3, r_2, r_1] per row, fp32 (fp64 for fp64 x).
  m.def("forward(Tensor x, Tensor weight, Tensor bias, float eps=1e-6) -> (Tensor y, Tensor rstd)");
  // grad_weight (3,) and grad_bias (1,) are accumulated and returned in fp32 (fp64 for fp64 x), the
  // dtype of rstd, whatever the parameters' dtypes: autograd rounds each to its own parameter's dtype.
  m.def("backward(Tensor grad_y, Tensor x, Tensor weight, Tensor rstd) -> (Tensor grad_x, Tensor grad_weight, "
        "Tensor grad_bias)");
  // Fused PolyNorm x mul (the gated MLP's down(PolyNorm(gate(x)) * up(x))): out = poly_norm(x) * mul,
  // formed in fp32 and rounded once to x's dtype; mul has x's shape and dtype. rstd as in forward.
  m.def("mul_forward(Tensor x, Tensor mul, Tensor weight, Tensor bias, float eps=1e-6) -> (Tensor out, Tensor rstd)");
  // grad_x, grad_mul in x's dtype; grad_weight (3,), grad_bias (1,) in rstd's dtype, as in backward.
  // bias is an input because grad_mul = grad_out * y recomputes y = poly_norm(x) from x and rstd.
  m.def("mul_backward(Tensor grad_out, Tensor x, Tensor mul, Tensor weight, Tensor bias, Tensor rstd) -> "
        "(Tensor grad_x, Tensor grad_mul, Tensor grad_weight, Tensor grad_bias)");
  // Grouped PolyNorm for mixture-of-experts layers: x's rows are sorted by expert; weight [E, 3],
  // bias [E] or [E, 1]; offsets [E] int32/int64 on x's device, cumulative END offsets (expert e
  // owns rows [offsets[e-1], offsets[e]), offsets[-1] := 0), read on the device. Rows at or past
  // offsets[E-1] belong to no expert: they are not read, y = 0 and rstd = 0 there.
  m.def("grouped_forward(Tensor x, Tensor weight, Tensor bias, Tensor offsets, float eps=1e-6) -> "
        "(Tensor y, Tensor rstd)");
  // grad_x in x's dtype (0 on rows of no expert); grad_weight [E, 3] and grad_bias [E] in rstd's
  // dtype, each expert's summed over its rows in a fixed order (docs/MATH.md, "Grouped PolyNorm").
  m.def("grouped_backward(Tensor grad_y, Tensor x, Tensor weight, Tensor offsets, Tensor rstd) -> "
        "(Tensor grad_x, Tensor grad_weight, Tensor grad_bias)");
}
