#include "cuda/backward.cuh"
#include <c10/util/BFloat16.h>
#define BW(T, A, P, L, M, G, W) template __global__ void poly_norm_bwd_row_kernel<T, P, L, 256, M, G, W>( \
    const T*, int64_t, bool, const T*, int64_t, bool, const A*, ParamRef, T*, bool, \
    ParamGrads<A>, MulArgs<T>, GroupArgs<A>, int64_t, int64_t, int, int, RowStagger);
namespace polynorm { namespace {
BW(c10::BFloat16, float, 7, kRealigned, false, false, true)
BW(c10::BFloat16, float, 8, kRealigned, false, false, true)
BW(c10::BFloat16, float, 7, kSamePhase, false, false, true)
BW(c10::BFloat16, float, 4, kRealigned, true, false, true)
BW(c10::BFloat16, float, 8, kRealigned, false, true, false)
BW(c10::BFloat16, float, 8, kRealigned, false, false, false)
BW(float, float, 8, kRealigned, false, false, true)
BW(double, double, 8, kRealigned, false, false, true)
}}
