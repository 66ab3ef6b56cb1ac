#include "cuda/forward.cuh"
#include <c10/util/BFloat16.h>
#define FW(T, A, P, L, MT, M, G, W) template __global__ void poly_norm_fwd_row_kernel<T, P, L, MT, M, G, W>( \
    const T*, int64_t, bool, T*, bool, A*, ParamRef, ParamRef, MulArgs<T>, GroupArgs<A>, int64_t, int64_t, double, int, int, RowStagger);
namespace polynorm { namespace {
FW(c10::BFloat16, float, 16, kRealigned, 256, false, false, true)
FW(c10::BFloat16, float, 7, kRealigned, 256, false, false, true)
FW(c10::BFloat16, float, 8, kSamePhase, 1024, false, false, true)
FW(c10::BFloat16, float, 8, kRealigned, 256, true, false, true)
FW(float, float, 16, kAligned, 256, false, false, false)
FW(c10::BFloat16, float, 16, kRealigned, 256, false, true, false)
}}
