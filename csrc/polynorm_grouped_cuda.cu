// CUDA kernels for polynorm::grouped_forward and polynorm::grouped_backward: PolyNorm with one
// [w0, w1, w2, b] per expert, for mixture-of-experts layers whose rows arrive sorted by expert
// (expert e owns rows [offsets[e-1], offsets[e]), offsets[-1] := 0; docs/MATH.md, "Grouped
// PolyNorm").
//
// A plain, correct first version; the single-expert kernels (polynorm_cuda.cu) are the fast ones.
// - A group of G threads per row (a power of two, 1..512, from H and the dtype only, never M),
//   R = max(1, 256 / G) rows per block. Lane t of a group owns the row's 16-byte packs t, t + G,
//   ...; its first kPacks stay in registers between the row reduction and the output, and a
//   longer row's other packs are read a second time.
// - Each thread finds its row's expert by a binary search of offsets, read on the device: no
//   host synchronisation; int32 or int64 offsets are widened to 64 bits, and all row offsets are
//   64-bit. The search only yields experts in [0, E], so offsets that decrease or exceed M
//   (undefined results) never make a kernel read or write out of bounds.
// - Rows at or past offsets[E-1] belong to no expert: not read; y, rstd, grad_x and the row's
//   parameter-gradient share are 0.
// - 16-byte vector loads and stores only where a row's base is 16-byte aligned (data pointer
//   aligned, row stride a multiple of the pack); element-wise otherwise, with the same values.
// - Accumulation in at::opmath_type (fp32, fp64 for fp64 x). Each thread sums its packs in
//   order, then a group reduction of fixed shape (xor shuffles, then warps in order): a row's
//   results depend only on its data, its expert's parameters, H and the dtype.
// - Backward: each row writes [r_3 S_3, r_2 S_2, r_1 S_1, G] to an [M, 4] buffer; a second
//   kernel, one block per expert, sums each expert's segment: thread t takes rows begin + t,
//   begin + t + 256, ... in order, then a fixed tree. That order depends only on the segment's
//   length, so an expert's dW and dB are the same bits on every run and the same bits as this
//   op gives for that expert's rows alone. No atomics.
#include "polynorm.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <string>
#include <tuple>

namespace polynorm {
namespace {

constexpr int kBlockThreads = 256;  // threads of a block when G <= 256: R = 256 / G rows per block
// Largest row group: one block per row. 512 rather than 1024 threads lets ptxas use up to 128
// registers a thread (64 at 1024: `nvcc -Xptxas -v` showed the fp16/bf16 backward and the fp64
// forward spilling there, and none at 512).
constexpr int kMaxGroup = 512;
// Packs a thread keeps in registers: 4 of x in forward, 2 each of x and grad_y in backward
// (the single-expert tiled kernels' counts). Rows up to kMaxGroup * packs 16-byte packs (bf16:
// 16384 forward, 8192 backward) are read from device memory once; longer rows read the rest
// twice, the second time mostly from L2.
constexpr int kFwdPacks = 4;
constexpr int kBwdPacks = 2;
constexpr int kParamThreads = 256;  // threads of a parameter-gradient block (one per expert)

// 16 bytes of one row.
template <typename scalar_t>
struct alignas(16) Pack {
  static constexpr int kVec = 16 / sizeof(scalar_t);
  scalar_t v[kVec];
};

// Columns p * kVec .. p * kVec + kVec - 1 of a row, zero past H. One 16-byte load where
// vec_ok (the row is 16-byte aligned) and the pack lies inside the row; element-wise otherwise.
template <typename scalar_t>
__device__ __forceinline__ Pack<scalar_t> load_pack(const scalar_t* row, int64_t p, int64_t H, bool vec_ok) {
  using P = Pack<scalar_t>;
  const int64_t col = p * P::kVec;
  if (vec_ok && col + P::kVec <= H) return *reinterpret_cast<const P*>(row + col);
  P out;
#pragma unroll
  for (int e = 0; e < P::kVec; ++e) out.v[e] = col + e < H ? row[col + e] : scalar_t(0);
  return out;
}

template <typename scalar_t>
__device__ __forceinline__ void store_pack(scalar_t* row, int64_t p, int64_t H, bool vec_ok, const Pack<scalar_t>& val) {
  using P = Pack<scalar_t>;
  const int64_t col = p * P::kVec;
  if (vec_ok && col + P::kVec <= H) {
    *reinterpret_cast<P*>(row + col) = val;
    return;
  }
#pragma unroll
  for (int e = 0; e < P::kVec; ++e) {
    if (col + e < H) row[col + e] = val.v[e];
  }
}

// The experts' parameters and boundaries, read on the device in their own dtypes.
struct Experts {
  const void* weight;  // [E, 3], any float dtype: [w0, w1, w2] per expert
  int64_t w_stride0;
  int64_t w_stride1;
  c10::ScalarType w_dtype;
  const void* bias;  // [E] or [E, 1], any float dtype (unused by the backward)
  int64_t b_stride;
  c10::ScalarType b_dtype;
  const void* offsets;  // [E] int32 or int64: cumulative end offsets
  int64_t o_stride;
  bool offsets64;
  int64_t E;
};

template <typename acc_t>
__device__ __forceinline__ acc_t load_float(const void* ptr, int64_t i, c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Double:
      return static_cast<acc_t>(static_cast<const double*>(ptr)[i]);
    case c10::ScalarType::Half:
      return static_cast<acc_t>(static_cast<float>(static_cast<const c10::Half*>(ptr)[i]));
    case c10::ScalarType::BFloat16:
      return static_cast<acc_t>(static_cast<float>(static_cast<const c10::BFloat16*>(ptr)[i]));
    default:
      return static_cast<acc_t>(static_cast<const float*>(ptr)[i]);
  }
}

__device__ __forceinline__ int64_t offset_at(const Experts& ex, int64_t e) {
  return ex.offsets64 ? static_cast<const int64_t*>(ex.offsets)[e * ex.o_stride]
                      : static_cast<int64_t>(static_cast<const int32_t*>(ex.offsets)[e * ex.o_stride]);
}

// The first e with offsets[e] > row: the row's expert, or E for a row of no expert.
__device__ __forceinline__ int64_t expert_of(const Experts& ex, int64_t row) {
  int64_t lo = 0, hi = ex.E;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (offset_at(ex, mid) <= row) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

__device__ __forceinline__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Sums N values over each row's group of G = blockDim.x threads (threadIdx.y is the row of the
// block); every thread of the group gets the total. Inside a warp: xor shuffles over offsets
// < min(G, 32) (a warp holds 32 / G whole groups when G < 32). Across the G / 32 warps of a
// larger group: each warp's lane 0 writes its total to shared memory and every thread adds the
// warp totals in warp order. The tree's shape depends only on G. Every thread of the block
// calls it, once per kernel.
template <int N, typename acc_t>
__device__ __forceinline__ void group_reduce(acc_t (&v)[N]) {
  __shared__ acc_t red[kMaxGroup / 32][N];  // a slot per warp of the block
  const int G = blockDim.x;
  const int width = G < 32 ? G : 32;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    for (int off = width / 2; off > 0; off /= 2) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
  }
  if (G > 32) {
    const int warps = G / 32;
    acc_t(*group_red)[N] = red + threadIdx.y * warps;
    if (threadIdx.x % 32 == 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) group_red[threadIdx.x / 32][k] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < N; ++k) {
      acc_t total = group_red[0][k];
      for (int w = 1; w < warps; ++w) total += group_red[w][k];
      v[k] = total;
    }
  }
}

// Forward (docs/MATH.md): one pass sums x^2, x^4, x^6 in opmath; one group reduction combines
// them; then rstd = [r_3, r_2, r_1] and y = x (w2 r_1 + x (w1 r_2 + x w0 r_3)) + b, with the
// row's expert's parameters.
template <typename scalar_t>
__global__ void __launch_bounds__(kMaxGroup) poly_norm_grouped_fwd_kernel(
    const scalar_t* __restrict__ x,  // [M, H], rows x_row_stride apart
    int64_t x_row_stride,
    bool x_vec,                                    // x's rows are 16-byte aligned
    scalar_t* __restrict__ y,                      // [M, H] contiguous
    bool y_vec,                                    // y's rows are 16-byte aligned
    at::opmath_type<scalar_t>* __restrict__ rstd,  // [M, 3] opmath: r_3, r_2, r_1 (0 on rows of no expert)
    Experts ex, int64_t M, int64_t H, double eps) {
  using acc_t = at::opmath_type<scalar_t>;
  using P = Pack<scalar_t>;
  const int G = blockDim.x;
  const int lane = threadIdx.x;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const int64_t n_packs = (H + P::kVec - 1) / P::kVec;
  const int64_t e = row < M ? expert_of(ex, row) : ex.E;  // E: no expert (or past the last row)
  const bool owned = e < ex.E;
  const scalar_t* x_row = x + row * x_row_stride;

  acc_t s[3] = {acc_t(0), acc_t(0), acc_t(0)};  // sum x^2, x^4, x^6
  const auto add = [&](const P& pk) {
#pragma unroll
    for (int j = 0; j < P::kVec; ++j) {
      const acc_t v = static_cast<acc_t>(pk.v[j]);
      const acc_t v2 = v * v;
      s[0] += v2;
      s[1] += v2 * v2;
      s[2] += v2 * v2 * v2;
    }
  };
  P cache[kFwdPacks];
#pragma unroll
  for (int i = 0; i < kFwdPacks; ++i) {
    const int64_t p = lane + static_cast<int64_t>(i) * G;
    if (owned && p < n_packs) {
      cache[i] = load_pack(x_row, p, H, x_vec);
      add(cache[i]);
    }
  }
  if (owned) {
    for (int64_t p = lane + static_cast<int64_t>(kFwdPacks) * G; p < n_packs; p += G) add(load_pack(x_row, p, H, x_vec));
  }
  group_reduce<3>(s);
  if (row >= M) return;

  scalar_t* y_row = y + row * H;
  if (!owned) {
    P zero;
#pragma unroll
    for (int j = 0; j < P::kVec; ++j) zero.v[j] = scalar_t(0);
    for (int64_t p = lane; p < n_packs; p += G) store_pack(y_row, p, H, y_vec, zero);
    if (lane == 0) {
      for (int k = 0; k < 3; ++k) rstd[row * 3 + k] = acc_t(0);
    }
    return;
  }
  const acc_t inv_h = acc_t(1) / static_cast<acc_t>(H);
  const acc_t r1 = acc_t(1) / sqrt(s[0] * inv_h + static_cast<acc_t>(eps));
  const acc_t r2 = acc_t(1) / sqrt(s[1] * inv_h + static_cast<acc_t>(eps));
  const acc_t r3 = acc_t(1) / sqrt(s[2] * inv_h + static_cast<acc_t>(eps));
  if (lane == 0) {
    rstd[row * 3 + 0] = r3;
    rstd[row * 3 + 1] = r2;
    rstd[row * 3 + 2] = r1;
  }
  const acc_t a3 = load_float<acc_t>(ex.weight, e * ex.w_stride0, ex.w_dtype) * r3;
  const acc_t a2 = load_float<acc_t>(ex.weight, e * ex.w_stride0 + ex.w_stride1, ex.w_dtype) * r2;
  const acc_t a1 = load_float<acc_t>(ex.weight, e * ex.w_stride0 + 2 * ex.w_stride1, ex.w_dtype) * r1;
  const acc_t b = load_float<acc_t>(ex.bias, e * ex.b_stride, ex.b_dtype);
  const auto out = [&](const P& pk) {
    P o;
#pragma unroll
    for (int j = 0; j < P::kVec; ++j) {
      const acc_t v = static_cast<acc_t>(pk.v[j]);
      o.v[j] = static_cast<scalar_t>(v * (a1 + v * (a2 + v * a3)) + b);  // Horner form
    }
    return o;
  };
#pragma unroll
  for (int i = 0; i < kFwdPacks; ++i) {
    const int64_t p = lane + static_cast<int64_t>(i) * G;
    if (p < n_packs) store_pack(y_row, p, H, y_vec, out(cache[i]));
  }
  for (int64_t p = lane + static_cast<int64_t>(kFwdPacks) * G; p < n_packs; p += G) {
    store_pack(y_row, p, H, y_vec, out(load_pack(x_row, p, H, x_vec)));
  }
}

// Backward (docs/MATH.md): S_p = sum g x^p and G = sum g in one pass and one group reduction;
// c_p = w(p) p r_p, d_p = c_p r_p^2 S_p / H; dx = g (c_1 + x (c_2 + x c_3)) - x (d_1 + x^2 (d_2
// + x^2 d_3)); the row's share of its expert's [dw0, dw1, dw2, db] goes to row_partials.
template <typename scalar_t>
__global__ void __launch_bounds__(kMaxGroup) poly_norm_grouped_bwd_kernel(
    const scalar_t* __restrict__ g,  // [M, H] grad_y, rows g_row_stride apart (0 for an expand)
    int64_t g_row_stride,
    bool g_vec,
    const scalar_t* __restrict__ x,  // [M, H], rows x_row_stride apart
    int64_t x_row_stride,
    bool x_vec,
    const at::opmath_type<scalar_t>* __restrict__ rstd,  // [M, 3] opmath: r_3, r_2, r_1
    scalar_t* __restrict__ dx,                           // [M, H] contiguous
    bool dx_vec,
    at::opmath_type<scalar_t>* __restrict__ row_partials,  // [M, 4] opmath: r_3 S_3, r_2 S_2, r_1 S_1, G
    Experts ex, int64_t M, int64_t H) {
  using acc_t = at::opmath_type<scalar_t>;
  using P = Pack<scalar_t>;
  const int G = blockDim.x;
  const int lane = threadIdx.x;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const int64_t n_packs = (H + P::kVec - 1) / P::kVec;
  const int64_t e = row < M ? expert_of(ex, row) : ex.E;  // E: no expert (or past the last row)
  const bool owned = e < ex.E;
  const scalar_t* x_row = x + row * x_row_stride;
  const scalar_t* g_row = g + row * g_row_stride;

  acc_t s[4] = {acc_t(0), acc_t(0), acc_t(0), acc_t(0)};  // S_1, S_2, S_3, G
  const auto add = [&](const P& xp, const P& gp) {
#pragma unroll
    for (int j = 0; j < P::kVec; ++j) {
      const acc_t gv = static_cast<acc_t>(gp.v[j]);
      const acc_t v = static_cast<acc_t>(xp.v[j]);
      const acc_t gx = gv * v;
      s[0] += gx;
      s[1] += gx * v;
      s[2] += gx * v * v;
      s[3] += gv;
    }
  };
  P x_cache[kBwdPacks];
  P g_cache[kBwdPacks];
#pragma unroll
  for (int i = 0; i < kBwdPacks; ++i) {
    const int64_t p = lane + static_cast<int64_t>(i) * G;
    if (owned && p < n_packs) {
      x_cache[i] = load_pack(x_row, p, H, x_vec);
      g_cache[i] = load_pack(g_row, p, H, g_vec);
      add(x_cache[i], g_cache[i]);
    }
  }
  if (owned) {
    for (int64_t p = lane + static_cast<int64_t>(kBwdPacks) * G; p < n_packs; p += G) {
      add(load_pack(x_row, p, H, x_vec), load_pack(g_row, p, H, g_vec));
    }
  }
  group_reduce<4>(s);
  if (row >= M) return;

  scalar_t* dx_row = dx + row * H;
  if (!owned) {
    P zero;
#pragma unroll
    for (int j = 0; j < P::kVec; ++j) zero.v[j] = scalar_t(0);
    for (int64_t p = lane; p < n_packs; p += G) store_pack(dx_row, p, H, dx_vec, zero);
    if (lane == 0) {
      for (int k = 0; k < 4; ++k) row_partials[row * 4 + k] = acc_t(0);
    }
    return;
  }
  const acc_t r3 = rstd[row * 3 + 0], r2 = rstd[row * 3 + 1], r1 = rstd[row * 3 + 2];
  const acc_t w0 = load_float<acc_t>(ex.weight, e * ex.w_stride0, ex.w_dtype);
  const acc_t w1 = load_float<acc_t>(ex.weight, e * ex.w_stride0 + ex.w_stride1, ex.w_dtype);
  const acc_t w2 = load_float<acc_t>(ex.weight, e * ex.w_stride0 + 2 * ex.w_stride1, ex.w_dtype);
  const acc_t inv_h = acc_t(1) / static_cast<acc_t>(H);
  // d_p as c_p ((r_p S_p / H) r_p): r_p^3 alone leaves fp32's range for |x| >~ 3e4 or tiny rows.
  const acc_t c1 = w2 * r1, c2 = acc_t(2) * w1 * r2, c3 = acc_t(3) * w0 * r3;
  const acc_t d1 = c1 * ((r1 * s[0] * inv_h) * r1);
  const acc_t d2 = c2 * ((r2 * s[1] * inv_h) * r2);
  const acc_t d3 = c3 * ((r3 * s[2] * inv_h) * r3);
  const auto grad = [&](const P& xp, const P& gp) {
    P o;
#pragma unroll
    for (int j = 0; j < P::kVec; ++j) {
      const acc_t gv = static_cast<acc_t>(gp.v[j]);
      const acc_t v = static_cast<acc_t>(xp.v[j]);
      const acc_t v2 = v * v;
      o.v[j] = static_cast<scalar_t>(gv * (c1 + v * (c2 + v * c3)) - v * (d1 + v2 * (d2 + v2 * d3)));
    }
    return o;
  };
#pragma unroll
  for (int i = 0; i < kBwdPacks; ++i) {
    const int64_t p = lane + static_cast<int64_t>(i) * G;
    if (p < n_packs) store_pack(dx_row, p, H, dx_vec, grad(x_cache[i], g_cache[i]));
  }
  for (int64_t p = lane + static_cast<int64_t>(kBwdPacks) * G; p < n_packs; p += G) {
    store_pack(dx_row, p, H, dx_vec, grad(load_pack(x_row, p, H, x_vec), load_pack(g_row, p, H, g_vec)));
  }
  if (lane == 0) {
    row_partials[row * 4 + 0] = r3 * s[2];
    row_partials[row * 4 + 1] = r2 * s[1];
    row_partials[row * 4 + 2] = r1 * s[0];
    row_partials[row * 4 + 3] = s[3];
  }
}

// One block per expert: the sums of the expert's rows' partials, [dw0, dw1, dw2, db]. Thread t
// adds rows begin + t, begin + t + kParamThreads, ... in order; then xor shuffles inside each
// warp and warp totals added in warp order. The order depends only on the segment's length.
// The segment is clamped to [0, M] (empty where offsets decrease): never out of bounds.
template <typename acc_t>
__global__ void __launch_bounds__(kParamThreads) poly_norm_grouped_param_kernel(
    const acc_t* __restrict__ row_partials,  // [M, 4] opmath
    Experts ex, int64_t M,
    acc_t* __restrict__ grad_weight,  // [E, 3] opmath
    acc_t* __restrict__ grad_bias) {  // [E] opmath
  __shared__ acc_t red[kParamThreads / 32][4];
  const int64_t e = blockIdx.x;
  const int64_t begin = e == 0 ? 0 : clamp64(offset_at(ex, e - 1), 0, M);
  const int64_t end = clamp64(offset_at(ex, e), begin, M);
  acc_t v[4] = {acc_t(0), acc_t(0), acc_t(0), acc_t(0)};
  for (int64_t r = begin + threadIdx.x; r < end; r += kParamThreads) {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] += row_partials[r * 4 + k];
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    for (int off = 16; off > 0; off /= 2) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
  }
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int k = 0; k < 4; ++k) red[threadIdx.x / 32][k] = v[k];
  }
  __syncthreads();
  if (threadIdx.x < 4) {
    const int k = threadIdx.x;
    acc_t total = red[0][k];
    for (int w = 1; w < kParamThreads / 32; ++w) total += red[w][k];
    if (k < 3) {
      grad_weight[e * 3 + k] = total;
    } else {
      grad_bias[e] = total;
    }
  }
}

// Threads per row: the fewest (a power of two, at most kMaxGroup) that hold the row's packs
// `packs` to a thread, so that a row up to kMaxGroup * packs packs is read once. From H and the
// element size only, never M: a row's bits do not depend on its batch.
int group_size(int64_t H, int64_t elem_size, int packs) {
  const int64_t n_packs = (H * elem_size + 15) / 16;
  const int64_t need = (n_packs + packs - 1) / packs;
  int G = 1;
  while (G < need && G < kMaxGroup) G *= 2;
  return G;
}

// Rows per block: 256 threads a block when rows are short (several rows each), one row a block
// otherwise.
dim3 block_shape(int G) { return dim3(G, G < kBlockThreads ? kBlockThreads / G : 1); }

unsigned grid_for(int64_t M, const dim3& block, const char* op) {
  const int64_t grid = (M + block.y - 1) / block.y;
  TORCH_CHECK(grid <= std::numeric_limits<int32_t>::max(), op, ": expected at most ",
              std::to_string(static_cast<int64_t>(std::numeric_limits<int32_t>::max()) * block.y), " rows, got ",
              std::to_string(M));
  return static_cast<unsigned>(grid);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

Experts experts_of(const at::Tensor& weight, const at::Tensor* bias, const at::Tensor& offsets) {
  return Experts{weight.const_data_ptr(),
                 weight.stride(0),
                 weight.stride(1),
                 weight.scalar_type(),
                 bias != nullptr ? bias->const_data_ptr() : nullptr,
                 bias != nullptr ? bias->stride(0) : 0,
                 bias != nullptr ? bias->scalar_type() : weight.scalar_type(),
                 offsets.const_data_ptr(),
                 offsets.stride(0),
                 offsets.scalar_type() == at::kLong,
                 weight.size(0)};
}

std::tuple<at::Tensor, at::Tensor> poly_norm_grouped_forward_cuda(const at::Tensor& x, const at::Tensor& weight,
                                                                  const at::Tensor& bias, const at::Tensor& offsets,
                                                                  double eps) {
  constexpr const char* op = "polynorm.grouped_forward";
  check_grouped_forward_args(x, weight, bias, offsets, eps);
  TORCH_CHECK(x.is_cuda(), op, ": expected x on a CUDA device, got ", x.device());
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const Rows rows = as_rows(x);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor rstd = at::empty({rows.M, 3}, x.options().dtype(opmath_dtype(x.scalar_type())));
  if (rows.M == 0) return {y, rstd};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const Experts ex = experts_of(weight, &bias, offsets);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    constexpr int kVec = Pack<scalar_t>::kVec;
    const scalar_t* x_ptr = rows.tensor.const_data_ptr<scalar_t>();
    scalar_t* y_ptr = y.mutable_data_ptr<scalar_t>();
    const bool x_vec = aligned16(x_ptr) && rows.row_stride % kVec == 0;
    const bool y_vec = aligned16(y_ptr) && rows.H % kVec == 0;
    const dim3 block = block_shape(group_size(rows.H, sizeof(scalar_t), kFwdPacks));
    poly_norm_grouped_fwd_kernel<scalar_t><<<grid_for(rows.M, block, op), block, 0, stream>>>(
        x_ptr, rows.row_stride, x_vec, y_ptr, y_vec, rstd.mutable_data_ptr<acc_t>(), ex, rows.M, rows.H, eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> poly_norm_grouped_backward_cuda(const at::Tensor& grad_y,
                                                                               const at::Tensor& x,
                                                                               const at::Tensor& weight,
                                                                               const at::Tensor& offsets,
                                                                               const at::Tensor& rstd) {
  constexpr const char* op = "polynorm.grouped_backward";
  check_grouped_backward_args(grad_y, x, weight, offsets, rstd);
  TORCH_CHECK(x.is_cuda(), op, ": expected x on a CUDA device, got ", x.device());
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const Rows x_rows = as_rows(x);
  const Rows g_rows = as_rows(grad_y);
  const at::Tensor rstd_c = rstd.contiguous();  // [M, 3]: at most a small copy
  const auto acc_dtype = opmath_dtype(x.scalar_type());
  const int64_t E = weight.size(0);
  at::Tensor grad_x = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (x_rows.M == 0) {
    return {grad_x, at::zeros({E, 3}, x.options().dtype(acc_dtype)), at::zeros({E}, x.options().dtype(acc_dtype))};
  }
  // In the accumulation dtype: autograd rounds each to its own parameter's dtype, once.
  at::Tensor grad_weight = at::empty({E, 3}, x.options().dtype(acc_dtype));
  at::Tensor grad_bias = at::empty({E}, x.options().dtype(acc_dtype));
  at::Tensor row_partials = at::empty({x_rows.M, 4}, x.options().dtype(acc_dtype));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const Experts ex = experts_of(weight, nullptr, offsets);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    constexpr int kVec = Pack<scalar_t>::kVec;
    const scalar_t* g_ptr = g_rows.tensor.const_data_ptr<scalar_t>();
    const scalar_t* x_ptr = x_rows.tensor.const_data_ptr<scalar_t>();
    scalar_t* dx_ptr = grad_x.mutable_data_ptr<scalar_t>();
    const bool g_vec = aligned16(g_ptr) && g_rows.row_stride % kVec == 0;
    const bool x_vec = aligned16(x_ptr) && x_rows.row_stride % kVec == 0;
    const bool dx_vec = aligned16(dx_ptr) && x_rows.H % kVec == 0;
    const dim3 block = block_shape(group_size(x_rows.H, sizeof(scalar_t), kBwdPacks));
    acc_t* part = row_partials.mutable_data_ptr<acc_t>();
    poly_norm_grouped_bwd_kernel<scalar_t><<<grid_for(x_rows.M, block, op), block, 0, stream>>>(
        g_ptr, g_rows.row_stride, g_vec, x_ptr, x_rows.row_stride, x_vec, rstd_c.const_data_ptr<acc_t>(), dx_ptr,
        dx_vec, part, ex, x_rows.M, x_rows.H);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    poly_norm_grouped_param_kernel<acc_t><<<static_cast<unsigned>(E), kParamThreads, 0, stream>>>(
        part, ex, x_rows.M, grad_weight.mutable_data_ptr<acc_t>(), grad_bias.mutable_data_ptr<acc_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {grad_x, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, CUDA, m) {
  m.impl("grouped_forward", &poly_norm_grouped_forward_cuda);
  m.impl("grouped_backward", &poly_norm_grouped_backward_cuda);
}

}  // namespace polynorm
