// The memory read ceiling: stream a large buffer with 16-byte loads, write one word per block.
#pragma once

#include "primitives/types.cuh"

namespace flashkv {

__global__ void read_sum_kernel(const uint4* __restrict__ data, u64 num_vecs, u32* out) {
  u32 acc = 0;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  // Four independent loads in flight per thread per iteration.
  for (; i + 3 * stride < num_vecs; i += 4 * stride) {
    const uint4 a = __ldcs(data + i), b = __ldcs(data + i + stride);
    const uint4 c = __ldcs(data + i + 2 * stride), d = __ldcs(data + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^
           d.w;
  }
  for (; i < num_vecs; i += stride) {
    const uint4 a = __ldcs(data + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  // Written only if it is a value no real data produces, so the loads cannot be elided.
  if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;
}

}  // namespace flashkv
