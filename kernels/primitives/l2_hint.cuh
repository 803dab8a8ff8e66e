// Loads that ask L2 to keep their lines (evict_last): for the small arrays every decode run reads
// on its critical path before its first KV load (the plan's work items, the page table), which the
// KV stream of the run before, read once and much larger than L2, would otherwise have evicted.
#pragma once

#include "primitives/types.cuh"

namespace flashkv {

__device__ __forceinline__ u64 l2_evict_last_policy() {
  u64 policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ int ld_evict_last(const int* p, u64 policy) {
  int v;
  asm volatile("ld.global.L2::cache_hint.s32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(policy));
  return v;
}

__device__ __forceinline__ int4 ld_evict_last(const int4* p, u64 policy) {
  int4 v;
  asm volatile("ld.global.L2::cache_hint.v4.s32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}

}  // namespace flashkv
