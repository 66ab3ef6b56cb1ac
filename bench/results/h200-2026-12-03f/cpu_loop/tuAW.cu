#include "cuda/backward.cuh"
#include <c10/util/BFloat16.h>
namespace polynorm { namespace {
template __global__ void poly_norm_bwd_row_kernel<c10::BFloat16, 8, kAligned, 256, false, false, true>(
    const c10::BFloat16*, int64_t, bool, const c10::BFloat16*, int64_t, bool, const float*, ParamRef, c10::BFloat16*, bool,
    ParamGrads<float>, MulArgs<c10::BFloat16>, GroupArgs<float>, int64_t, int64_t, int, int, RowStagger);
template __global__ void poly_norm_bwd_row_kernel<c10::BFloat16, 7, kAligned, 256, false, false, true>(
    const c10::BFloat16*, int64_t, bool, const c10::BFloat16*, int64_t, bool, const float*, ParamRef, c10::BFloat16*, bool,
    ParamGrads<float>, MulArgs<c10::BFloat16>, GroupArgs<float>, int64_t, int64_t, int, int, RowStagger);
template __global__ void poly_norm_bwd_row_kernel<c10::BFloat16, 8, kAligned, 256, false, false, false>(
    const c10::BFloat16*, int64_t, bool, const c10::BFloat16*, int64_t, bool, const float*, ParamRef, c10::BFloat16*, bool,
    ParamGrads<float>, MulArgs<c10::BFloat16>, GroupArgs<float>, int64_t, int64_t, int, int, RowStagger);
}}
