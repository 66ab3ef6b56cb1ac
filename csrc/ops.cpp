// Operator schemas (one TORCH_LIBRARY block for every backend, the private ones too) and the
// argument checks that all backends share.
#include "polynorm.h"

#include <ATen/MemoryOverlap.h>
#include <c10/core/ScalarType.h>
#include <torch/library.h>

#include <cmath>
#include <cstdio>
#include <optional>
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
// crashes (a worker of the GPU suite, torch 2.11: SIGSEGV in an error's message); strings and
// torch's own types are not formatted through a facet.
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
  // The README's shape, exactly: a (3, 1) weight would get a (3, 1) gradient, not the (3,) that
  // optimizers and checkpoints of the modules expect.
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == 3, op, ": expected weight of shape [3] ([w0, w1, w2]), got ",
              shape(weight.sizes()));
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
  // [1] as the modules hold it, [] as Liger's does.
  TORCH_CHECK(bias.dim() == 0 || (bias.dim() == 1 && bias.size(0) == 1), op,
              ": expected bias of shape [1] or [] (one number), got ", shape(bias.sizes()));
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

namespace {

void check_grouped_forward_args_of(const char* op, const at::Tensor& x, const at::Tensor& weight,
                                   const at::Tensor& bias, const at::Tensor& offsets, double eps) {
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

void check_grouped_mul_options(const char* op, std::optional<double> hidden_clamp, double output_scale) {
  TORCH_CHECK_VALUE(!hidden_clamp.has_value() || *hidden_clamp > 0.0, op,
                    ": expected hidden_clamp to be None or > 0, got ", num(hidden_clamp.value_or(0.0)));
  TORCH_CHECK_VALUE(std::isfinite(output_scale), op, ": expected output_scale to be finite, got ", num(output_scale));
}

}  // namespace

void check_grouped_forward_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                const at::Tensor& offsets, double eps) {
  check_grouped_forward_args_of("polynorm.grouped_forward", x, weight, bias, offsets, eps);
}

void check_grouped_mul_forward_args(const at::Tensor& x, const at::Tensor& mul, const at::Tensor& weight,
                                    const at::Tensor& bias, const at::Tensor& offsets, double eps,
                                    std::optional<double> hidden_clamp, double output_scale) {
  constexpr const char* op = "polynorm.grouped_mul_forward";
  check_grouped_forward_args_of(op, x, weight, bias, offsets, eps);
  check_like_x(op, "mul", mul, x);
  check_grouped_mul_options(op, hidden_clamp, output_scale);
}

void check_grouped_mul_backward_args(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& mul,
                                     const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& offsets,
                                     const at::Tensor& rstd, std::optional<double> hidden_clamp,
                                     double output_scale) {
  constexpr const char* op = "polynorm.grouped_mul_backward";
  check_grouped_forward_args_of(op, x, weight, bias, offsets, 0.0);
  check_like_x(op, "grad_out", grad_out, x);
  check_like_x(op, "mul", mul, x);
  check_rstd(op, x, rstd);
  check_grouped_mul_options(op, hidden_clamp, output_scale);
}

void check_grouped_mul_topk_args(const at::Tensor& x, const at::Tensor& mul, const at::Tensor& weight,
                                 const at::Tensor& bias, const at::Tensor& topk_ids,
                                 const std::optional<at::Tensor>& expert_map, double eps,
                                 std::optional<double> hidden_clamp, double output_scale, const at::Tensor& out) {
  constexpr const char* op = "polynorm.grouped_mul_topk_forward";
  check_x(op, "x", x);
  check_defined(op, "weight", weight);
  TORCH_CHECK(is_supported_float(weight.scalar_type()), op,
              ": expected weight to be float32, float64, float16 or bfloat16, got ", weight.scalar_type());
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == 3 && weight.size(0) >= 1, op,
              ": expected weight of shape [E, 3] with E >= 1 (local experts), got ", shape(weight.sizes()));
  TORCH_CHECK(weight.device() == x.device(), op, ": expected weight on x's device ", x.device(), ", got ",
              weight.device());
  const int64_t E = weight.size(0);
  check_defined(op, "bias", bias);
  TORCH_CHECK(is_supported_float(bias.scalar_type()), op,
              ": expected bias to be float32, float64, float16 or bfloat16, got ", bias.scalar_type());
  TORCH_CHECK((bias.dim() == 1 && bias.size(0) == E) || (bias.dim() == 2 && bias.size(0) == E && bias.size(1) == 1),
              op, ": expected bias of shape [", num(E), "] or [", num(E), ", 1] (weight's E experts), got ",
              shape(bias.sizes()));
  TORCH_CHECK(bias.device() == x.device(), op, ": expected bias on x's device ", x.device(), ", got ",
              bias.device());
  check_eps(op, eps);
  check_like_x(op, "mul", mul, x);
  check_like_x(op, "out", out, x);
  // out is written row by row in place: two of its elements at one address (an expanded tensor)
  // would be written by several rows at once, a race with an arbitrary winner.
  TORCH_CHECK(at::has_internal_overlap(out) != at::MemOverlap::Yes, op,
              ": expected out without internal overlap (it is written in place, each element at its own "
              "address), got strides ", shape(out.strides()));
  check_grouped_mul_options(op, hidden_clamp, output_scale);
  check_defined(op, "topk_ids", topk_ids);
  TORCH_CHECK(topk_ids.scalar_type() == at::kInt || topk_ids.scalar_type() == at::kLong, op,
              ": expected topk_ids to be int32 or int64, got ", topk_ids.scalar_type());
  const int64_t M = x.numel() / x.size(-1);
  TORCH_CHECK(topk_ids.dim() == 2 && topk_ids.size(0) * topk_ids.size(1) == M, op,
              ": expected topk_ids of shape [T, K] with T * K = ", num(M), " (x's rows), got ",
              shape(topk_ids.sizes()));
  TORCH_CHECK(topk_ids.device() == x.device(), op, ": expected topk_ids on x's device ", x.device(), ", got ",
              topk_ids.device());
  if (expert_map.has_value() && expert_map->defined()) {
    TORCH_CHECK((expert_map->scalar_type() == at::kInt || expert_map->scalar_type() == at::kLong) &&
                    expert_map->dim() == 1,
                op, ": expected expert_map to be a 1-D int32 or int64 tensor, got ", expert_map->scalar_type(),
                " of shape ", shape(expert_map->sizes()));
    TORCH_CHECK(expert_map->device() == x.device(), op, ": expected expert_map on x's device ", x.device(),
                ", got ", expert_map->device());
  }
}

void check_grouped_backward_args(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight,
                                 const at::Tensor& offsets, const at::Tensor& rstd) {
  constexpr const char* op = "polynorm.grouped_backward";
  check_x(op, "x", x);
  check_grouped_params(op, x, weight, offsets);
  check_like_x(op, "grad_y", grad_y, x);
  check_rstd(op, x, rstd);
}

namespace {

// Sharded ops: x holds a shard of each row's columns, possibly none (H = 0 on this rank).
int64_t check_shard(const char* op, const char* name, const at::Tensor& x) {
  check_defined(op, name, x);
  TORCH_CHECK(is_supported_float(x.scalar_type()), op, ": expected ", name,
              " to be float32, float64, float16 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 1, op, ": expected ", name, " to have at least 1 dimension (..., H_shard), got a 0-d tensor");
  return shard_rows(x);
}

void check_sums(const char* op, const at::Tensor& x, int64_t M, const at::Tensor& sums) {
  check_defined(op, "sums", sums);
  TORCH_CHECK(sums.dim() == 2 && sums.size(0) == M && sums.size(1) == 3, op, ": expected sums of shape [",
              num(M), ", 3] (rows of x, then the three row sums), got ", shape(sums.sizes()));
  TORCH_CHECK(sums.scalar_type() == opmath_dtype(x.scalar_type()), op, ": expected sums of dtype ",
              opmath_dtype(x.scalar_type()), " for x of dtype ", x.scalar_type(), ", got ", sums.scalar_type());
  TORCH_CHECK(sums.device() == x.device(), op, ": expected sums on x's device ", x.device(), ", got ",
              sums.device());
}

void check_hidden_size(const char* op, const at::Tensor& x, int64_t hidden_size) {
  TORCH_CHECK(hidden_size >= 1 && hidden_size >= x.size(-1), op,
              ": expected hidden_size (the unsharded H) >= 1 and >= x's shard width ", num(x.size(-1)), ", got ",
              num(hidden_size));
}

void check_shard_rstd(const char* op, const at::Tensor& x, int64_t M, const at::Tensor& rstd) {
  check_defined(op, "rstd", rstd);
  TORCH_CHECK(rstd.dim() == 2 && rstd.size(0) == M && rstd.size(1) == 3, op, ": expected rstd of shape [", num(M),
              ", 3] (rows of x, then r_3, r_2, r_1), got ", shape(rstd.sizes()));
  TORCH_CHECK(rstd.scalar_type() == opmath_dtype(x.scalar_type()), op, ": expected rstd of dtype ",
              opmath_dtype(x.scalar_type()), " for x of dtype ", x.scalar_type(), ", got ", rstd.scalar_type());
  TORCH_CHECK(rstd.device() == x.device(), op, ": expected rstd on x's device ", x.device(), ", got ",
              rstd.device());
}

void check_like_shard(const char* op, const char* name, const std::optional<at::Tensor>& other, const at::Tensor& x) {
  if (other.has_value()) check_like_x(op, name, *other, x);
}

}  // namespace

int64_t shard_rows(const at::Tensor& x) {
  int64_t M = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) M *= x.size(d);
  return M;
}

int64_t check_sharded_forward_stats_args(const at::Tensor& x) {
  return check_shard("polynorm.sharded_forward_stats", "x", x);
}

int64_t check_sharded_forward_apply_args(const at::Tensor& x, const std::optional<at::Tensor>& mul,
                                         const at::Tensor& sums, const at::Tensor& weight, const at::Tensor& bias,
                                         int64_t hidden_size, double eps) {
  constexpr const char* op = "polynorm.sharded_forward_apply";
  const int64_t M = check_shard(op, "x", x);
  check_like_shard(op, "mul", mul, x);
  check_sums(op, x, M, sums);
  check_params(op, x, weight);
  check_bias(op, x, bias);
  check_hidden_size(op, x, hidden_size);
  check_eps(op, eps);
  return M;
}

int64_t check_sharded_backward_stats_args(const at::Tensor& grad_out, const at::Tensor& x,
                                          const std::optional<at::Tensor>& mul, const at::Tensor& rstd) {
  constexpr const char* op = "polynorm.sharded_backward_stats";
  const int64_t M = check_shard(op, "x", x);
  check_like_x(op, "grad_out", grad_out, x);
  check_like_shard(op, "mul", mul, x);
  check_shard_rstd(op, x, M, rstd);
  return M;
}

int64_t check_sharded_backward_apply_args(const at::Tensor& grad_out, const at::Tensor& x,
                                          const std::optional<at::Tensor>& mul, const at::Tensor& weight,
                                          const at::Tensor& bias, const at::Tensor& rstd, const at::Tensor& sums,
                                          int64_t hidden_size) {
  constexpr const char* op = "polynorm.sharded_backward_apply";
  const int64_t M = check_shard(op, "x", x);
  check_like_x(op, "grad_out", grad_out, x);
  check_like_shard(op, "mul", mul, x);
  check_params(op, x, weight);
  check_bias(op, x, bias);
  check_shard_rstd(op, x, M, rstd);
  check_sums(op, x, M, sums);
  check_hidden_size(op, x, hidden_size);
  return M;
}

}  // namespace polynorm

TORCH_LIBRARY(polynorm, m) {
  // The CUDA launch plan (csrc/launch_plan.h), computed on the host: no tensors, no GPU
  // (csrc/plan_ops.cpp). _launch_plan: the kernel and geometry that serve rows of H elements of
  // `dtype` in `layout` ("" for contiguous rows; aligned, same-phase, realigned, pack-realigned),
  // on a device with clusters or not, for a family ("auto", the table's; "row"; "tiled").
  m.def("_launch_plan(str op, int H, ScalarType dtype, str layout=\"\", bool clusters=True, str family=\"auto\") -> str",
        &polynorm::launch_plan_op);
  // The first H of every run of rows (of the layout) that the plan serves alike: its whole space.
  m.def("_plan_space(str op, ScalarType dtype, str layout, bool clusters=True) -> int[]", &polynorm::plan_space_op);
  // The row kernels compiled for an op and dtype (launch_plan.h, row_kernel_compiled).
  m.def("_row_kernels(str op, ScalarType dtype) -> str[]", &polynorm::row_kernels_op);
  // Which tensor's phase a realigned row takes, for tensors of the given phase classes.
  m.def("_realign_phase(str op, int[] classes) -> int", &polynorm::realign_phase_op);
  // The CUDA ops with an explicit launch configuration (polynorm.h, LaunchConfig): `family` as in
  // _launch_plan ("row" an error where the row kernels cannot serve the row), `clusters` false for
  // the plan of a device without clusters. For tests, which reach every configuration so.
  m.def("_forward_config(Tensor x, Tensor weight, Tensor bias, float eps, str family, bool clusters) -> "
        "(Tensor y, Tensor rstd)");
  m.def("_backward_config(Tensor grad_y, Tensor x, Tensor weight, Tensor rstd, str family, bool clusters) -> "
        "(Tensor grad_x, Tensor grad_weight, Tensor grad_bias)");
  m.def("_mul_forward_config(Tensor x, Tensor mul, Tensor weight, Tensor bias, float eps, str family, "
        "bool clusters) -> (Tensor out, Tensor rstd)");
  m.def("_mul_backward_config(Tensor grad_out, Tensor x, Tensor mul, Tensor weight, Tensor bias, Tensor rstd, "
        "str family, bool clusters) -> (Tensor grad_x, Tensor grad_mul, Tensor grad_weight, Tensor grad_bias)");
  m.def("_grouped_forward_config(Tensor x, Tensor weight, Tensor bias, Tensor offsets, float eps, str family, "
        "bool clusters) -> (Tensor y, Tensor rstd)");
  m.def("_grouped_backward_config(Tensor grad_y, Tensor x, Tensor weight, Tensor offsets, Tensor rstd, "
        "str family, bool clusters) -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias)");
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
  // Tensor parallelism (docs/MATH.md (12)-(15)): x [..., H_shard] holds a shard of each row's H
  // columns (H_shard may be 0); mul, when given, is the fused op's, sharded like x. A statistics
  // pass gives this shard's per-row sums, [M, 3] fp32 (fp64 for fp64 x); the caller sums them
  // over the shards (one all-reduce); the apply pass finishes this shard's columns from the
  // summed sums and the unsharded hidden_size.
  // Forward sums: [sum x^2, sum x^4, sum x^6] of the shard's columns.
  m.def("sharded_forward_stats(Tensor x) -> Tensor sums");
  // out: x's shape and dtype (y, or y * mul); rstd [M, 3] = [r_3, r_2, r_1] from the summed sums.
  m.def("sharded_forward_apply(Tensor x, Tensor? mul, Tensor sums, Tensor weight, Tensor bias, int hidden_size, "
        "float eps=1e-6) -> (Tensor out, Tensor rstd)");
  // Backward sums: [S_1, S_2, S_3] of the shard's columns (g = grad_out, or grad_out * mul), and
  // this shard's share of grad_weight (3,) and grad_bias (1,) in rstd's dtype: summed over the
  // shards (as DTensor's Partial()), they are the gradients.
  m.def("sharded_backward_stats(Tensor grad_out, Tensor x, Tensor? mul, Tensor rstd) -> "
        "(Tensor sums, Tensor grad_weight, Tensor grad_bias)");
  // grad_x in x's dtype from the summed sums; grad_mul likewise when mul is given, else a
  // tensor of 0 elements.
  m.def("sharded_backward_apply(Tensor grad_out, Tensor x, Tensor? mul, Tensor weight, Tensor bias, Tensor rstd, "
        "Tensor sums, int hidden_size) -> (Tensor grad_x, Tensor grad_mul)");
  // Motif-3's MoE activation (docs/MATH.md (16)-(22)), grouped as grouped_forward: for a row of
  // expert e, out = round(output_scale * clamp_c(PolyNorm_e(clamp_c(x)) * clamp_c(mul))), c =
  // hidden_clamp (None: no clamp), weight [E, 3] and bias [E] or [E, 1] PolyNorm's coefficients as
  // given (any sigmoid or bias clamp is the caller's). x and mul may have any strides (the halves of
  // one gate_up projection); rstd is that of clamp_c(x).
  m.def("grouped_mul_forward(Tensor x, Tensor mul, Tensor weight, Tensor bias, Tensor offsets, float eps=1e-6, "
        "float? hidden_clamp=None, float output_scale=1.0) -> (Tensor out, Tensor rstd)");
  // grad_x, grad_mul in x's dtype (0 where the clamp moved the input); grad_weight [E, 3] and
  // grad_bias [E] in rstd's dtype, each expert's summed over its rows in a fixed order.
  m.def("grouped_mul_backward(Tensor grad_out, Tensor x, Tensor mul, Tensor weight, Tensor bias, Tensor offsets, "
        "Tensor rstd, float? hidden_clamp=None, float output_scale=1.0) -> "
        "(Tensor grad_x, Tensor grad_mul, Tensor grad_weight, Tensor grad_bias)");
  // Its forward in the token-major layout of a fused MoE: row r of x and mul (T * K rows) is token
  // r / K's slot r % K, of local expert expert_map[topk_ids[r / K][r % K]] (the id itself without a
  // map); a row whose map entry is -1 (another rank's expert) is neither read nor written in out.
  m.def("grouped_mul_topk_forward(Tensor x, Tensor mul, Tensor weight, Tensor bias, Tensor topk_ids, "
        "Tensor? expert_map, float eps, float? hidden_clamp, float output_scale, Tensor(a!) out) -> ()");
}
