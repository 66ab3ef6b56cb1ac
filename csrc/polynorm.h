// Shared host-side declarations for the polynorm operators.
//
// PolyNorm (Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884):
//   y = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b,
//   norm(u) = u / sqrt(mean(u^2, last dim) + eps).
// The closed-form backward is written out in docs/MATH.md and in the kernels.
#pragma once

#include "launch_plan.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace polynorm {

// An integer for an error message: formatted with std::to_string, never streamed into
// TORCH_CHECK's message (why: csrc/ops.cpp, above its num(double)).
inline std::string num(int64_t v) { return std::to_string(v); }

// A tensor seen as M rows of H elements: element (row, col) lives at
// data + row * row_stride + col. `tensor` is the input itself when its layout
// allows that (last-dim stride 1, leading dims collapsible into one row stride),
// otherwise a contiguous copy of it: the one documented copy.
struct Rows {
  at::Tensor tensor;
  int64_t M;
  int64_t H;
  int64_t row_stride;
};

Rows as_rows(const at::Tensor& t);

// Argument checks shared by every backend. Each failure names the operator and the
// argument, and gives both the expected and the actual value.
void check_forward_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);
void check_backward_args(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight,
                         const at::Tensor& rstd);
// The fused PolyNorm x mul ops (out = poly_norm(x) * mul): mul has x's shape, dtype and
// device; bias is in the backward too, which recomputes y = poly_norm(x) for grad_mul.
void check_mul_forward_args(const at::Tensor& x, const at::Tensor& mul, const at::Tensor& weight,
                            const at::Tensor& bias, double eps);
void check_mul_backward_args(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& mul,
                             const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& rstd);

// Tensor parallelism, the sharded ops (docs/MATH.md (12)-(15)): x [..., H_shard] with H_shard >= 0.
// Each check returns M, the rows of x (its leading dimensions' product, also when H_shard = 0).
int64_t shard_rows(const at::Tensor& x);
int64_t check_sharded_forward_stats_args(const at::Tensor& x);
int64_t check_sharded_forward_apply_args(const at::Tensor& x, const std::optional<at::Tensor>& mul,
                                         const at::Tensor& sums, const at::Tensor& weight, const at::Tensor& bias,
                                         int64_t hidden_size, double eps);
int64_t check_sharded_backward_stats_args(const at::Tensor& grad_out, const at::Tensor& x,
                                          const std::optional<at::Tensor>& mul, const at::Tensor& rstd);
int64_t check_sharded_backward_apply_args(const at::Tensor& grad_out, const at::Tensor& x,
                                          const std::optional<at::Tensor>& mul, const at::Tensor& weight,
                                          const at::Tensor& bias, const at::Tensor& rstd, const at::Tensor& sums,
                                          int64_t hidden_size);

// dtype of the rstd cache and of every accumulator: fp64 for fp64 inputs, fp32 otherwise.
at::ScalarType opmath_dtype(at::ScalarType x_dtype);

// Grouped PolyNorm (mixture of experts): x's rows sorted by expert, weight [E, 3], bias [E]
// or [E, 1], offsets [E] int32/int64 on x's device (cumulative end offsets, as
// torch._grouped_mm's `offs`: expert e owns rows [offsets[e-1], offsets[e]), offsets[-1] := 0).
void check_grouped_forward_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                const at::Tensor& offsets, double eps);
void check_grouped_backward_args(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight,
                                 const at::Tensor& offsets, const at::Tensor& rstd);
// Motif-3's MoE activation (grouped fused-mul PolyNorm): mul has x's shape, dtype and device (any
// strides); hidden_clamp None or > 0; output_scale finite.
void check_grouped_mul_forward_args(const at::Tensor& x, const at::Tensor& mul, const at::Tensor& weight,
                                    const at::Tensor& bias, const at::Tensor& offsets, double eps,
                                    std::optional<double> hidden_clamp, double output_scale);
void check_grouped_mul_backward_args(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& mul,
                                     const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& offsets,
                                     const at::Tensor& rstd, std::optional<double> hidden_clamp,
                                     double output_scale);
// Its token-major forward: topk_ids [T, K] int32/int64 with T * K = x's rows, expert_map None or
// 1-D int32/int64, out of x's shape, dtype and device (written in place).
void check_grouped_mul_topk_args(const at::Tensor& x, const at::Tensor& mul, const at::Tensor& weight,
                                 const at::Tensor& bias, const at::Tensor& topk_ids,
                                 const std::optional<at::Tensor>& expert_map, double eps,
                                 std::optional<double> hidden_clamp, double output_scale, const at::Tensor& out);

// An explicit launch configuration, which the private CUDA ops take (_forward_config, ...; the
// public ops take the table's): the kernel family (kAuto, the table's; kRow, the table's where the
// row kernels serve the row, else an error; kTiled, the tiled kernels for every row), and whether
// clusters may be launched (false: the plan of a device without clusters, on any device).
struct LaunchConfig {
  Family family = Family::kAuto;
  bool clusters = true;
};
// Parses the private ops' `family` ("auto", "row" or "tiled"); an error names `op` (plan_ops.cpp).
LaunchConfig launch_config(const char* op, const std::string& family, bool clusters);

// The launch plan's private ops (plan_ops.cpp; schemas in ops.cpp).
std::string launch_plan_op(const std::string& op, int64_t H, at::ScalarType dtype, const std::string& layout,
                           bool clusters, const std::string& family);
std::vector<int64_t> plan_space_op(const std::string& op, at::ScalarType dtype, const std::string& layout,
                                   bool clusters);
std::vector<std::string> row_kernels_op(const std::string& op, at::ScalarType dtype);
int64_t realign_phase_op(const std::string& op, c10::IntArrayRef classes);

}  // namespace polynorm
