// Bulk copies from device memory into shared memory (sm_90: cp.async.bulk, the TMA unit's
// non-tensor form) completed on an mbarrier, for the staged rows of backward.cuh's row kernel.
// One thread issues a row's copies; every lane of the row waits on the row's barrier for the
// bytes to land. Bench only until measured (POLYNORM_STAGED_ROWS=1, bench/NOTES.md v12; the
// staged forward lost: h200-2026-12-01f/call2_t.patch).
#pragma once

#include <cstdint>

#ifndef POLYNORM_STAGED_ROWS
#define POLYNORM_STAGED_ROWS 0
#endif

namespace polynorm {
namespace {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// An mbarrier that completes a phase when `count` threads have arrived and every byte they
// announced has landed.
__device__ __forceinline__ void barrier_init(uint64_t* bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
#endif
}

// Makes barrier_init visible to the async proxy (the copies' completion), as CUTLASS does.
__device__ __forceinline__ void barrier_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// This thread's arrival, announcing `bytes` of copies that complete the phase.
__device__ __forceinline__ void barrier_arrive_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
#endif
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global `src` to shared `dst`,
// counted against `bar`'s announced bytes.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(dst)),
               "l"(src), "r"(bytes), "r"(shared_address(bar))
               : "memory");
#endif
}

// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
#endif
}

}  // namespace
}  // namespace polynorm
