// Hopper warpgroup MMA (wgmma, sm_90a): shared-memory matrix descriptors, the 128-byte swizzled
// tile layout they describe, and the fences that order wgmma against ordinary code. The
// instruction wrappers themselves are generated (wgmma_ops.cuh, scripts/gen_wgmma.py).
//
// Layout (PTX ISA "Shared Memory Matrix Layout", 128-byte swizzle): a tile of R rows of 16-bit
// elements is stored as column blocks of 64 elements (128 bytes); block b holds the rows'
// elements [64 b, 64 b + 64) at b * R * 128 bytes, a row every 128 bytes, and its 16-byte chunk c
// at chunk position c ^ (row % 8). Eight rows form one 1024-byte swizzle atom, so every tile and
// column block starts 1024-byte aligned. Read by wgmma as:
//   K-major (rows = M or N, the contraction dim along the row: Q and K for S = Q Kᵀ): the
//     descriptor of k-step s (16 elements) starts at block s / 4, byte (s % 4) * 32; SBO = 1024
//     (next 8 rows), LBO unused.
//   MN-major (rows = K, N along the row: V for O = P V): the descriptor of k-step s starts at
//     row 16 s; SBO = 1024 (next 8 rows of K), LBO = R * 128 (next 64 columns of N).
#pragma once

#include "primitives/types.cuh"
#include "primitives/wgmma_ops.cuh"

namespace flashkv {

// Byte offset of 16-byte chunk `chunk` of row `row` in a 128-byte-swizzled tile of kRows rows.
template <int kRows>
__device__ __forceinline__ u32 sw128_offset(int row, int chunk) {
  return (u32)((chunk / 8) * (kRows * 128) + row * 128 + (((chunk % 8) ^ (row % 8)) * 16));
}

// A 128-byte-swizzle matrix descriptor for the shared-memory address `addr` (bits 0-13: address
// >> 4; 16-29: LBO >> 4; 32-45: SBO >> 4; 62-63: swizzle mode, 1 = 128 bytes).
__device__ __forceinline__ u64 sw128_desc(u32 addr, u32 lbo_bytes, u32 sbo_bytes) {
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)((lbo_bytes >> 4) & 0x3FFF) << 16) |
         ((u64)((sbo_bytes >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

// Orders this warpgroup's register accesses before the wgmma that follow (needed before the first
// wgmma and whenever the accumulators were touched by ordinary code in between).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most N committed wgmma groups of this warpgroup are in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Pins accumulator registers at this point of the program: the compiler sees wgmma's writes only
// at its issue, so reads after wgmma_wait must not be moved above it.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared memory written through the generic proxy (cp.async, st.shared) and read next by wgmma
// (the async proxy): each writing thread fences before the barrier that publishes the data.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace flashkv
