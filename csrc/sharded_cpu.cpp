// CPU kernels of the sharded ops (tensor parallelism, docs/MATH.md (12)-(15)): x holds a shard of
// each row's columns. A statistics pass gives the shard's per-row sums; the caller sums them over
// the shards; an apply pass finishes the shard's columns. The row sums are cpu_rows.h's pairwise
// sums and every formula is polynorm_math.h's, so on one shard holding the whole row (hidden_size
// = H) each result is bit for bit polynorm::forward's, backward's, mul_forward's or mul_backward's
// on the CPU.
#include "cpu_rows.h"
#include "polynorm.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace polynorm {
namespace {

// x seen as M rows of H_shard columns (H_shard may be 0: as_rows then counts no rows).
Rows shard_as_rows(const at::Tensor& x, int64_t M) {
  if (x.size(-1) == 0) return {x, M, 0, 0};
  Rows rows = as_rows(x);
  rows.M = M;
  return rows;
}

at::Tensor sharded_forward_stats_cpu(const at::Tensor& x) {
  const int64_t M = check_sharded_forward_stats_args(x);
  const Rows xr = shard_as_rows(x, M);
  at::Tensor sums = at::empty({M, 3}, x.options().dtype(opmath_dtype(x.scalar_type())));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "polynorm.sharded_forward_stats", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* x_data = xr.H > 0 ? xr.tensor.const_data_ptr<scalar_t>() : nullptr;  // [M, H_shard]
    acc_t* out = sums.mutable_data_ptr<acc_t>();                                            // [M, 3]
    at::parallel_for(0, M, row_grain(std::max<int64_t>(xr.H, 1)), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const scalar_t* x_row = x_data + row * xr.row_stride;
        // MATH.md (12): this shard's sum x^2, x^4, x^6, in the unsharded op's order.
        const auto s = pairwise_sum<3, acc_t>(0, xr.H, [&](int64_t j, acc_t* acc) {
          add_row_sums(acc, static_cast<acc_t>(x_row[j]));
        });
        for (int k = 0; k < 3; ++k) out[row * 3 + k] = s[k];
      }
    });
  });
  return sums;
}

std::tuple<at::Tensor, at::Tensor> sharded_forward_apply_cpu(const at::Tensor& x, const std::optional<at::Tensor>& mul,
                                                             const at::Tensor& sums, const at::Tensor& weight,
                                                             const at::Tensor& bias, int64_t hidden_size, double eps) {
  const int64_t M = check_sharded_forward_apply_args(x, mul, sums, weight, bias, hidden_size, eps);
  const Rows xr = shard_as_rows(x, M);
  const Rows mr = mul.has_value() ? shard_as_rows(*mul, M) : xr;
  const at::Tensor sums_c = sums.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor rstd = at::empty({M, 3}, x.options().dtype(opmath_dtype(x.scalar_type())));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "polynorm.sharded_forward_apply", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto [w0, w1, w2, b] = read_params<acc_t>(weight, &bias);
    const bool has_mul = mul.has_value();
    const scalar_t* x_data = xr.H > 0 ? xr.tensor.const_data_ptr<scalar_t>() : nullptr;    // [M, H_shard]
    const scalar_t* mul_data = has_mul && mr.H > 0 ? mr.tensor.const_data_ptr<scalar_t>() : nullptr;
    const acc_t* s = sums_c.const_data_ptr<acc_t>();                                          // [M, 3] summed
    scalar_t* out_data = out.mutable_data_ptr<scalar_t>();                                    // [M, H_shard]
    acc_t* rstd_data = rstd.mutable_data_ptr<acc_t>();                                        // [M, 3]
    const acc_t inv_h = acc_t(1) / static_cast<acc_t>(hidden_size);  // the unsharded H: MATH.md (1)
    const acc_t e = static_cast<acc_t>(eps);
    const int64_t H = xr.H;
    at::parallel_for(0, M, row_grain(std::max<int64_t>(H, 1)), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const acc_t r1 = rstd_of(s[row * 3 + 0], inv_h, e);
        const acc_t r2 = rstd_of(s[row * 3 + 1], inv_h, e);
        const acc_t r3 = rstd_of(s[row * 3 + 2], inv_h, e);
        rstd_data[row * 3 + 0] = r3;
        rstd_data[row * 3 + 1] = r2;
        rstd_data[row * 3 + 2] = r1;
        const HornerCoeffs<acc_t> a = forward_coeffs(w0, w1, w2, r3, r2, r1);
        const scalar_t* x_row = x_data + row * xr.row_stride;
        scalar_t* out_row = out_data + row * H;
        if (has_mul) {  // MATH.md (8): y unrounded, times mul, rounded once
          const scalar_t* mul_row = mul_data + row * mr.row_stride;
          for (int64_t j = 0; j < H; ++j) {
            out_row[j] = static_cast<scalar_t>(poly_value(static_cast<acc_t>(x_row[j]), a, b) *
                                               static_cast<acc_t>(mul_row[j]));
          }
        } else {
          for (int64_t j = 0; j < H; ++j) out_row[j] = static_cast<scalar_t>(poly_value(static_cast<acc_t>(x_row[j]), a, b));
        }
      }
    });
  });
  return {out, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sharded_backward_stats_cpu(const at::Tensor& grad_out,
                                                                          const at::Tensor& x,
                                                                          const std::optional<at::Tensor>& mul,
                                                                          const at::Tensor& rstd) {
  const int64_t M = check_sharded_backward_stats_args(grad_out, x, mul, rstd);
  const Rows xr = shard_as_rows(x, M);
  const Rows gr = shard_as_rows(grad_out, M);
  const Rows mr = mul.has_value() ? shard_as_rows(*mul, M) : xr;
  const at::Tensor rstd_c = rstd.contiguous();
  const auto acc_dtype = opmath_dtype(x.scalar_type());
  at::Tensor sums = at::empty({M, 3}, x.options().dtype(acc_dtype));
  at::Tensor grad_weight = at::empty({3}, x.options().dtype(acc_dtype));
  at::Tensor grad_bias = at::empty({1}, x.options().dtype(acc_dtype));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "polynorm.sharded_backward_stats", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const bool has_mul = mul.has_value();
    const scalar_t* x_data = xr.H > 0 ? xr.tensor.const_data_ptr<scalar_t>() : nullptr;  // [M, H_shard]
    const scalar_t* g_data = xr.H > 0 ? gr.tensor.const_data_ptr<scalar_t>() : nullptr;  // [M, H_shard] grad_out
    const scalar_t* mul_data = has_mul && xr.H > 0 ? mr.tensor.const_data_ptr<scalar_t>() : nullptr;
    const acc_t* r = rstd_c.const_data_ptr<acc_t>();  // [M, 3]: r_3, r_2, r_1
    acc_t* out = sums.mutable_data_ptr<acc_t>();      // [M, 3]: S_1, S_2, S_3 of this shard
    // Each row's share of dw0, dw1, dw2, db (MATH.md (14)), summed below in a fixed pairwise order.
    at::Tensor row_partials = at::empty({M, 4}, x.options().dtype(acc_dtype));
    acc_t* part = row_partials.mutable_data_ptr<acc_t>();
    at::parallel_for(0, M, row_grain(std::max<int64_t>(xr.H, 1)), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const scalar_t* x_row = x_data + row * xr.row_stride;
        const scalar_t* g_row = g_data + row * gr.row_stride;
        const scalar_t* mul_row = has_mul ? mul_data + row * mr.row_stride : nullptr;
        // MATH.md (13): S_p = sum g x^p and G = sum g over the shard (g: MATH.md (9) with mul).
        const auto s = pairwise_sum<4, acc_t>(0, xr.H, [&](int64_t j, acc_t* acc) {
          const acc_t g = has_mul ? static_cast<acc_t>(g_row[j]) * static_cast<acc_t>(mul_row[j])
                                  : static_cast<acc_t>(g_row[j]);
          add_row_grad_sums(acc, static_cast<acc_t>(x_row[j]), g);
        });
        for (int k = 0; k < 3; ++k) out[row * 3 + k] = s[k];
        part[row * 4 + 0] = r[row * 3 + 0] * s[2];
        part[row * 4 + 1] = r[row * 3 + 1] * s[1];
        part[row * 4 + 2] = r[row * 3 + 2] * s[0];
        part[row * 4 + 3] = s[3];
      }
    });
    const auto total = sum_partials<acc_t>(part, 0, M);
    for (int k = 0; k < 3; ++k) grad_weight.mutable_data_ptr<acc_t>()[k] = total[k];
    grad_bias.mutable_data_ptr<acc_t>()[0] = total[3];
  });
  return {sums, grad_weight, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> sharded_backward_apply_cpu(const at::Tensor& grad_out, const at::Tensor& x,
                                                              const std::optional<at::Tensor>& mul,
                                                              const at::Tensor& weight, const at::Tensor& bias,
                                                              const at::Tensor& rstd, const at::Tensor& sums,
                                                              int64_t hidden_size) {
  const int64_t M = check_sharded_backward_apply_args(grad_out, x, mul, weight, bias, rstd, sums, hidden_size);
  const Rows xr = shard_as_rows(x, M);
  const Rows gr = shard_as_rows(grad_out, M);
  const Rows mr = mul.has_value() ? shard_as_rows(*mul, M) : xr;
  const at::Tensor rstd_c = rstd.contiguous();
  const at::Tensor sums_c = sums.contiguous();
  const auto like_x = x.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor grad_x = at::empty(x.sizes(), like_x);
  at::Tensor grad_mul = mul.has_value() ? at::empty(x.sizes(), like_x) : at::empty({0}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "polynorm.sharded_backward_apply", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto [w0, w1, w2, b] = read_params<acc_t>(weight, &bias);
    const bool has_mul = mul.has_value();
    const int64_t H = xr.H;
    const scalar_t* x_data = H > 0 ? xr.tensor.const_data_ptr<scalar_t>() : nullptr;  // [M, H_shard]
    const scalar_t* g_data = H > 0 ? gr.tensor.const_data_ptr<scalar_t>() : nullptr;  // [M, H_shard] grad_out
    const scalar_t* mul_data = has_mul && H > 0 ? mr.tensor.const_data_ptr<scalar_t>() : nullptr;
    const acc_t* r = rstd_c.const_data_ptr<acc_t>();   // [M, 3]: r_3, r_2, r_1
    const acc_t* s = sums_c.const_data_ptr<acc_t>();   // [M, 3]: S_1, S_2, S_3 summed over the shards
    scalar_t* dx = grad_x.mutable_data_ptr<scalar_t>();
    scalar_t* dmul = has_mul ? grad_mul.mutable_data_ptr<scalar_t>() : nullptr;
    const acc_t inv_h = acc_t(1) / static_cast<acc_t>(hidden_size);
    at::parallel_for(0, M, row_grain(std::max<int64_t>(H, 1)), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const acc_t r3 = r[row * 3 + 0], r2 = r[row * 3 + 1], r1 = r[row * 3 + 2];
        const GradCoeffs<acc_t> k =
            backward_coeffs(w0, w1, w2, r3, r2, r1, s[row * 3 + 0], s[row * 3 + 1], s[row * 3 + 2], inv_h);
        const scalar_t* x_row = x_data + row * xr.row_stride;
        const scalar_t* g_row = g_data + row * gr.row_stride;
        scalar_t* dx_row = dx + row * H;
        if (has_mul) {
          const scalar_t* mul_row = mul_data + row * mr.row_stride;
          scalar_t* dmul_row = dmul + row * H;
          const HornerCoeffs<acc_t> a = forward_coeffs(w0, w1, w2, r3, r2, r1);
          for (int64_t j = 0; j < H; ++j) {
            const acc_t xj = static_cast<acc_t>(x_row[j]), go = static_cast<acc_t>(g_row[j]);
            dx_row[j] = static_cast<scalar_t>(grad_x_value(xj, go * static_cast<acc_t>(mul_row[j]), k));  // MATH.md (9)
            dmul_row[j] = static_cast<scalar_t>(go * poly_value(xj, a, b));                               // MATH.md (10)
          }
        } else {
          for (int64_t j = 0; j < H; ++j) {
            dx_row[j] = static_cast<scalar_t>(grad_x_value(static_cast<acc_t>(x_row[j]), static_cast<acc_t>(g_row[j]), k));
          }
        }
      }
    });
  });
  return {grad_x, grad_mul};
}

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, CPU, m) {
  m.impl("sharded_forward_stats", &sharded_forward_stats_cpu);
  m.impl("sharded_forward_apply", &sharded_forward_apply_cpu);
  m.impl("sharded_backward_stats", &sharded_backward_stats_cpu);
  m.impl("sharded_backward_apply", &sharded_backward_apply_cpu);
}

}  // namespace polynorm
