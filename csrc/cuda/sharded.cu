// The sharded ops on CUDA devices (tensor parallelism, docs/MATH.md (12)-(15)):
// polynorm::sharded_forward_stats, sharded_forward_apply, sharded_backward_stats and
// sharded_backward_apply. Kernels: sharded.cuh.
#include "polynorm.h"
#include "sharded.cuh"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace polynorm {
namespace {

// Threads a row (G) and rows a block, from H_shard and the pack width only, never from M:
//
//   packs a row (H_shard / kVec)   G                         rows a block
//   <= 256                         32 (one warp)             8 (256 threads)
//   > 256                          packs / 4, rounded up to  1
//                                  a power of 2, 64..1024
//
// Up to 8 packs a lane for a warp's row, about 4 a thread for a block's: several 16-byte loads
// in flight per thread, and blocks of 64 threads or more, so that an SM's 32-block limit still
// fills its 2048 threads.
struct ShardGeometry {
  int G;
  int rows_per_block;
};

ShardGeometry shard_geometry(int64_t H, int vec) {
  const int64_t packs = (H + vec - 1) / vec;
  if (packs <= 256) return {32, 8};
  int G = 64;
  while (G < 1024 && int64_t(G) * 4 < packs) G *= 2;
  return {G, 1};
}

// A [M, H_shard] view of t: its data and row stride (as_rows's one copy for other layouts).
struct ShardRows {
  at::Tensor tensor;
  int64_t row_stride;
};

ShardRows shard_rows_of(const at::Tensor& t) {
  if (t.size(-1) == 0) return {t, 0};
  const Rows r = as_rows(t);
  return {r.tensor, r.row_stride};
}

// 16-byte packs serve the row when every tensor's rows start 16-byte aligned and H_shard is a
// multiple of the pack: the base pointer and the row stride of each.
bool packs_aligned(int64_t H, int vec, int elem_size, std::initializer_list<std::pair<const void*, int64_t>> rows) {
  if (H % vec != 0) return false;
  for (const auto& [ptr, stride] : rows) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0 || (stride * elem_size) % 16 != 0) return false;
  }
  return true;
}

// A parameter read in place by the kernels (numel 1 or 3; a flat view's stride steps between
// elements): no conversion kernel before the launch.
ParamRef shard_param(const at::Tensor& t) {
  const at::Tensor flat = t.reshape({t.numel()});
  return {flat.const_data_ptr(), flat.stride(0), t.scalar_type()};
}

void check_cuda(const char* op, const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda(), op, ": expected x on a CUDA device, got ", x.device());
}

// Calls f(std::integral_constant<int, kVec>) with the pack width: 16 bytes, or 1 element.
template <typename scalar_t, typename F>
void with_vec(bool aligned, const F& f) {
  if (aligned) {
    f(std::integral_constant<int, int(16 / sizeof(scalar_t))>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

at::Tensor sharded_forward_stats_cuda(const at::Tensor& x) {
  constexpr const char* op = "polynorm.sharded_forward_stats";
  const int64_t M = check_sharded_forward_stats_args(x);
  check_cuda(op, x);
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const int64_t H = x.size(-1);
  at::Tensor sums = at::empty({M, 3}, x.options().dtype(opmath_dtype(x.scalar_type())));
  if (M == 0) return sums;
  const ShardRows xr = shard_rows_of(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    constexpr int kVecMax = 16 / sizeof(scalar_t);
    const bool aligned = packs_aligned(H, kVecMax, sizeof(scalar_t), {{xr.tensor.const_data_ptr(), xr.row_stride}});
    const ShardGeometry geo = shard_geometry(H, aligned ? kVecMax : 1);
    const int64_t blocks = (M + geo.rows_per_block - 1) / geo.rows_per_block;
    const int threads = geo.G * geo.rows_per_block;
    auto stream = c10::cuda::getCurrentCUDAStream();
    with_vec<scalar_t>(aligned, [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      poly_norm_sharded_fwd_stats_kernel<scalar_t, acc_t, kVec><<<blocks, threads, 0, stream>>>(
          xr.tensor.const_data_ptr<scalar_t>(), xr.row_stride, sums.mutable_data_ptr<acc_t>(), M, H, geo.G);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return sums;
}

std::tuple<at::Tensor, at::Tensor> sharded_forward_apply_cuda(const at::Tensor& x, const std::optional<at::Tensor>& mul,
                                                              const at::Tensor& sums, const at::Tensor& weight,
                                                              const at::Tensor& bias, int64_t hidden_size,
                                                              double eps) {
  constexpr const char* op = "polynorm.sharded_forward_apply";
  const int64_t M = check_sharded_forward_apply_args(x, mul, sums, weight, bias, hidden_size, eps);
  check_cuda(op, x);
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const int64_t H = x.size(-1);
  const auto acc_dtype = opmath_dtype(x.scalar_type());
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor rstd = at::empty({M, 3}, x.options().dtype(acc_dtype));
  if (M == 0) return {out, rstd};
  const ShardRows xr = shard_rows_of(x);
  const ShardRows mr = mul.has_value() ? shard_rows_of(*mul) : xr;
  const at::Tensor sums_c = sums.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    constexpr int kVecMax = 16 / sizeof(scalar_t);
    const bool aligned = packs_aligned(H, kVecMax, sizeof(scalar_t),
                                       {{xr.tensor.const_data_ptr(), xr.row_stride},
                                        {mr.tensor.const_data_ptr(), mr.row_stride},
                                        {out.const_data_ptr(), H}});
    const ShardGeometry geo = shard_geometry(H, aligned ? kVecMax : 1);
    const int64_t blocks = (M + geo.rows_per_block - 1) / geo.rows_per_block;
    const int threads = geo.G * geo.rows_per_block;
    const acc_t inv_h = acc_t(1) / static_cast<acc_t>(hidden_size);  // the unsharded H: MATH.md (1)
    auto stream = c10::cuda::getCurrentCUDAStream();
    with_vec<scalar_t>(aligned, [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      const auto launch = [&](auto kernel) {
        kernel<<<blocks, threads, 0, stream>>>(xr.tensor.const_data_ptr<scalar_t>(), xr.row_stride,
                                               mr.tensor.const_data_ptr<scalar_t>(), mr.row_stride,
                                               sums_c.const_data_ptr<acc_t>(), shard_param(weight), shard_param(bias),
                                               out.mutable_data_ptr<scalar_t>(), rstd.mutable_data_ptr<acc_t>(), M,
                                               H, inv_h, static_cast<acc_t>(eps), geo.G);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      if (mul.has_value()) {
        launch(poly_norm_sharded_fwd_apply_kernel<scalar_t, acc_t, kVec, true>);
      } else {
        launch(poly_norm_sharded_fwd_apply_kernel<scalar_t, acc_t, kVec, false>);
      }
    });
  });
  return {out, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sharded_backward_stats_cuda(const at::Tensor& grad_out,
                                                                           const at::Tensor& x,
                                                                           const std::optional<at::Tensor>& mul,
                                                                           const at::Tensor& rstd) {
  constexpr const char* op = "polynorm.sharded_backward_stats";
  const int64_t M = check_sharded_backward_stats_args(grad_out, x, mul, rstd);
  check_cuda(op, x);
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const int64_t H = x.size(-1);
  const auto acc_dtype = opmath_dtype(x.scalar_type());
  at::Tensor sums = at::empty({M, 3}, x.options().dtype(acc_dtype));
  // Each row's [r_3 S_3, r_2 S_2, r_1 S_1, G] (MATH.md (14)): summed over the rows by at::sum,
  // whose order is fixed by M (no atomics), so dw and db are the same on every run.
  at::Tensor terms = at::empty({M, 4}, x.options().dtype(acc_dtype));
  if (M > 0) {
    const ShardRows xr = shard_rows_of(x);
    const ShardRows gr = shard_rows_of(grad_out);
    const ShardRows mr = mul.has_value() ? shard_rows_of(*mul) : xr;
    const at::Tensor rstd_c = rstd.contiguous();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), op, [&] {
      using acc_t = at::opmath_type<scalar_t>;
      constexpr int kVecMax = 16 / sizeof(scalar_t);
      const bool aligned = packs_aligned(H, kVecMax, sizeof(scalar_t),
                                         {{xr.tensor.const_data_ptr(), xr.row_stride},
                                          {gr.tensor.const_data_ptr(), gr.row_stride},
                                          {mr.tensor.const_data_ptr(), mr.row_stride}});
      const ShardGeometry geo = shard_geometry(H, aligned ? kVecMax : 1);
      const int64_t blocks = (M + geo.rows_per_block - 1) / geo.rows_per_block;
      const int threads = geo.G * geo.rows_per_block;
      auto stream = c10::cuda::getCurrentCUDAStream();
      with_vec<scalar_t>(aligned, [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
        const auto launch = [&](auto kernel) {
          kernel<<<blocks, threads, 0, stream>>>(gr.tensor.const_data_ptr<scalar_t>(), gr.row_stride,
                                                 xr.tensor.const_data_ptr<scalar_t>(), xr.row_stride,
                                                 mr.tensor.const_data_ptr<scalar_t>(), mr.row_stride,
                                                 rstd_c.const_data_ptr<acc_t>(), sums.mutable_data_ptr<acc_t>(),
                                                 terms.mutable_data_ptr<acc_t>(), M, H, geo.G);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        };
        if (mul.has_value()) {
          launch(poly_norm_sharded_bwd_stats_kernel<scalar_t, acc_t, kVec, true>);
        } else {
          launch(poly_norm_sharded_bwd_stats_kernel<scalar_t, acc_t, kVec, false>);
        }
      });
    });
  }
  return {sums, at::sum(terms.narrow(1, 0, 3), {0}), at::sum(terms.narrow(1, 3, 1), {0})};
}

std::tuple<at::Tensor, at::Tensor> sharded_backward_apply_cuda(const at::Tensor& grad_out, const at::Tensor& x,
                                                               const std::optional<at::Tensor>& mul,
                                                               const at::Tensor& weight, const at::Tensor& bias,
                                                               const at::Tensor& rstd, const at::Tensor& sums,
                                                               int64_t hidden_size) {
  constexpr const char* op = "polynorm.sharded_backward_apply";
  const int64_t M = check_sharded_backward_apply_args(grad_out, x, mul, weight, bias, rstd, sums, hidden_size);
  check_cuda(op, x);
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const int64_t H = x.size(-1);
  const auto like_x = x.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor grad_x = at::empty(x.sizes(), like_x);
  at::Tensor grad_mul = mul.has_value() ? at::empty(x.sizes(), like_x) : at::empty({0}, x.options());
  if (M == 0 || H == 0) return {grad_x, grad_mul};
  const ShardRows xr = shard_rows_of(x);
  const ShardRows gr = shard_rows_of(grad_out);
  const ShardRows mr = mul.has_value() ? shard_rows_of(*mul) : xr;
  const at::Tensor rstd_c = rstd.contiguous();
  const at::Tensor sums_c = sums.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    constexpr int kVecMax = 16 / sizeof(scalar_t);
    const bool aligned = packs_aligned(H, kVecMax, sizeof(scalar_t),
                                       {{xr.tensor.const_data_ptr(), xr.row_stride},
                                        {gr.tensor.const_data_ptr(), gr.row_stride},
                                        {mr.tensor.const_data_ptr(), mr.row_stride},
                                        {grad_x.const_data_ptr(), H},
                                        {mul.has_value() ? grad_mul.const_data_ptr() : grad_x.const_data_ptr(), H}});
    const ShardGeometry geo = shard_geometry(H, aligned ? kVecMax : 1);
    const int64_t blocks = (M + geo.rows_per_block - 1) / geo.rows_per_block;
    const int threads = geo.G * geo.rows_per_block;
    const acc_t inv_h = acc_t(1) / static_cast<acc_t>(hidden_size);
    auto stream = c10::cuda::getCurrentCUDAStream();
    with_vec<scalar_t>(aligned, [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      const auto launch = [&](auto kernel) {
        kernel<<<blocks, threads, 0, stream>>>(
            gr.tensor.const_data_ptr<scalar_t>(), gr.row_stride, xr.tensor.const_data_ptr<scalar_t>(), xr.row_stride,
            mr.tensor.const_data_ptr<scalar_t>(), mr.row_stride, rstd_c.const_data_ptr<acc_t>(),
            sums_c.const_data_ptr<acc_t>(), shard_param(weight), shard_param(bias), grad_x.mutable_data_ptr<scalar_t>(),
            mul.has_value() ? grad_mul.mutable_data_ptr<scalar_t>() : nullptr, M, H, inv_h, geo.G);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      if (mul.has_value()) {
        launch(poly_norm_sharded_bwd_apply_kernel<scalar_t, acc_t, kVec, true>);
      } else {
        launch(poly_norm_sharded_bwd_apply_kernel<scalar_t, acc_t, kVec, false>);
      }
    });
  });
  return {grad_x, grad_mul};
}

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, CUDA, m) {
  m.impl("sharded_forward_stats", &sharded_forward_stats_cuda);
  m.impl("sharded_forward_apply", &sharded_forward_apply_cuda);
  m.impl("sharded_backward_stats", &sharded_backward_stats_cuda);
  m.impl("sharded_backward_apply", &sharded_backward_apply_cuda);
}

}  // namespace polynorm
