// Device-side random fill for benchmarks: uniform values in [lo, hi) from a counter-based hash,
// so multi-gigabyte caches are filled in milliseconds instead of on the host.
#pragma once

#include "primitives/types.cuh"

namespace flashkv {

__device__ __forceinline__ u32 hash_u32(u64 x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return (u32)x;
}

template <class T>
__global__ void fill_uniform_kernel(T* out, u64 n, u64 seed, float lo, float hi) {
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float u = (hash_u32(i * 0x9e3779b97f4a7c15ull + seed) >> 8) * (1.0f / 16777216.0f);
    out[i] = from_float<T>(lo + (hi - lo) * u);
  }
}

}  // namespace flashkv
