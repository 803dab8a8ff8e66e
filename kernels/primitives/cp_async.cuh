// cp.async (sm_80+): asynchronous 16-byte global -> shared copies, grouped and waited on.
#pragma once

#include "primitives/types.cuh"

namespace flashkv {

// Shared-memory address of a generic pointer, as cp.async and ldmatrix take it.
__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// Copies 16 bytes from global `src` to shared `dst`, bypassing L1 (.cg). When `valid` is false
// nothing is read and the 16 destination bytes are zero-filled (src-size 0).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}

// As above, to a shared-memory address (as smem_addr returns): no address conversion per copy.
__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}

// Copies 8 bytes (8-byte aligned at both ends) from global to shared memory through L1 (.ca).
__device__ __forceinline__ void cp_async_8(u32 dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Waits for every cp.async this thread issued, committed to a group or not.
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// An arrival on the shared-memory mbarrier `bar` once all of this thread's earlier cp.async have
// landed (.noinc: it counts as one of the barrier's expected arrivals).
__device__ __forceinline__ void cp_async_mbarrier_arrive(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

}  // namespace flashkv
