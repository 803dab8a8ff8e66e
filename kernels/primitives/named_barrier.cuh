// Named barriers (bar.sync id, n): a sync of n threads (whole warps) of the CTA. 0 is
// __syncthreads'; a warp-specialized kernel syncs its consumer warps with another id, since the
// producer warps never reach it.
#pragma once

namespace flashkv {

__device__ __forceinline__ void named_barrier(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// Arrives at barrier `id` (of n threads) without waiting for it.
__device__ __forceinline__ void named_barrier_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

}  // namespace flashkv
