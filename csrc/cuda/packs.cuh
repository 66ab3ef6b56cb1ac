// Rows as 16-byte packs, for every CUDA kernel: Pack, Elem and PackOf (raw elements and their
// conversion), ParamRef/load_param (parameters read on the device), and load_pack/store_pack (the
// tiled kernels' access, element-wise where a pack is not whole or aligned). The row kernels'
// lane layout and loads: row_lanes.cuh; their same-phase and one-phase rows: row_phase.cuh.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/core/ScalarType.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace polynorm {
namespace {

// A pack is 16 bytes of one row, kept as four raw 32-bit words. Elements are
// converted to opmath when used, not when loaded: the registers hold the row in its
// own (narrow) dtype, and keep_raw() stops the compiler from caching the converted
// values across the row reduction instead (twice the registers for fp16/bf16).
using Pack = uint4;

__device__ __forceinline__ uint32_t& word(Pack& p, int i) { return i == 0 ? p.x : i == 1 ? p.y : i == 2 ? p.z : p.w; }
__device__ __forceinline__ uint32_t word(const Pack& p, int i) {
  return i == 0 ? p.x : i == 1 ? p.y : i == 2 ? p.z : p.w;
}
__device__ __forceinline__ void keep_raw(Pack& p) {
  asm volatile("" : "+r"(p.x), "+r"(p.y), "+r"(p.z), "+r"(p.w));
}

// Element access and conversion by dtype. Raw bits travel as uint16/32/64.
template <typename scalar_t>
struct Elem;

template <>
struct Elem<float> {
  using raw_t = uint32_t;
  __device__ static float to_acc(raw_t r) { return __uint_as_float(r); }
  __device__ static raw_t from_acc(float v) { return __float_as_uint(v); }
};
template <>
struct Elem<double> {
  using raw_t = unsigned long long;
  __device__ static double to_acc(raw_t r) { return __longlong_as_double(static_cast<long long>(r)); }
  __device__ static raw_t from_acc(double v) { return static_cast<raw_t>(__double_as_longlong(v)); }
};
template <>
struct Elem<c10::Half> {
  using raw_t = unsigned short;
  __device__ static float to_acc(raw_t r) { return __half2float(__ushort_as_half(r)); }
  __device__ static raw_t from_acc(float v) { return __half_as_ushort(__float2half_rn(v)); }
};
template <>
struct Elem<c10::BFloat16> {
  using raw_t = unsigned short;
  __device__ static float to_acc(raw_t r) { return __uint_as_float(static_cast<uint32_t>(r) << 16); }
  __device__ static raw_t from_acc(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};

template <typename scalar_t>
struct PackOf {
  using raw_t = typename Elem<scalar_t>::raw_t;
  static constexpr int kVec = 16 / sizeof(scalar_t);

  __device__ static raw_t get(const Pack& p, int e) {
    if constexpr (sizeof(raw_t) == 2) {
      return static_cast<raw_t>(word(p, e / 2) >> (16 * (e % 2)));
    } else if constexpr (sizeof(raw_t) == 4) {
      return word(p, e);
    } else {
      return (static_cast<raw_t>(word(p, 2 * e + 1)) << 32) | word(p, 2 * e);
    }
  }
  __device__ static void set(Pack& p, int e, raw_t r) {
    if constexpr (sizeof(raw_t) == 2) {
      uint32_t& w = word(p, e / 2);
      w = e % 2 == 0 ? (w & 0xffff0000u) | r : (w & 0x0000ffffu) | (static_cast<uint32_t>(r) << 16);
    } else if constexpr (sizeof(raw_t) == 4) {
      word(p, e) = r;
    } else {
      word(p, 2 * e) = static_cast<uint32_t>(r);
      word(p, 2 * e + 1) = static_cast<uint32_t>(r >> 32);
    }
  }
  __device__ static at::opmath_type<scalar_t> value(const Pack& p, int e) { return Elem<scalar_t>::to_acc(get(p, e)); }
  // Rounds and stores element e of every pack from f(e): two 16-bit elements a word with
  // one paired conversion (cvt.rn.bf16x2.f32 / f16x2) instead of two and a merge.
  template <typename F>
  __device__ static Pack make(F f) {
    Pack out;
    if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(f(2 * w), f(2 * w + 1));
        word(out, w) = *reinterpret_cast<const uint32_t*>(&v);
      }
    } else if constexpr (std::is_same_v<scalar_t, c10::Half>) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const __half2 v = __floats2half2_rn(f(2 * w), f(2 * w + 1));
        word(out, w) = *reinterpret_cast<const uint32_t*>(&v);
      }
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) set(out, e, Elem<scalar_t>::from_acc(f(e)));
    }
    return out;
  }
};

// A weight or bias element of any float dtype, read on the device so that no host
// synchronisation (and no conversion kernel) is needed.
struct ParamRef {
  const void* ptr;
  int64_t stride;
  c10::ScalarType dtype;
};

template <typename acc_t>
__device__ __forceinline__ acc_t load_param(const ParamRef& p, int64_t i) {
  switch (p.dtype) {
    case c10::ScalarType::Double:
      return static_cast<acc_t>(static_cast<const double*>(p.ptr)[i * p.stride]);
    case c10::ScalarType::Half:
      return static_cast<acc_t>(static_cast<float>(static_cast<const c10::Half*>(p.ptr)[i * p.stride]));
    case c10::ScalarType::BFloat16:
      return static_cast<acc_t>(static_cast<float>(static_cast<const c10::BFloat16*>(p.ptr)[i * p.stride]));
    default:
      return static_cast<acc_t>(static_cast<const float*>(p.ptr)[i * p.stride]);
  }
}

// Loads pack `p` of a row (columns p*VEC .. p*VEC+VEC-1), zero past H. The
// element-wise path (misaligned rows, the tail of an odd H) gives the same values.
template <typename scalar_t>
__device__ __forceinline__ Pack load_pack(const scalar_t* row, int64_t p, int64_t H, bool vec_ok) {
  using P = PackOf<scalar_t>;
  const int64_t col = p * P::kVec;
  if (vec_ok && col + P::kVec <= H) return *reinterpret_cast<const Pack*>(row + col);
  const auto* raw = reinterpret_cast<const typename P::raw_t*>(row);
  Pack out = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int e = 0; e < P::kVec; ++e) {
    if (col + e < H) P::set(out, e, raw[col + e]);
  }
  return out;
}

template <typename scalar_t>
__device__ __forceinline__ void store_pack(scalar_t* row, int64_t p, int64_t H, bool vec_ok, const Pack& val) {
  using P = PackOf<scalar_t>;
  const int64_t col = p * P::kVec;
  if (vec_ok && col + P::kVec <= H) {
    *reinterpret_cast<Pack*>(row + col) = val;
    return;
  }
  auto* raw = reinterpret_cast<typename P::raw_t*>(row);
#pragma unroll
  for (int e = 0; e < P::kVec; ++e) {
    if (col + e < H) raw[col + e] = P::get(val, e);
  }
}

}  // namespace
}  // namespace polynorm
