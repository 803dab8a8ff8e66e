// The two small kernels of a multi-level cascade (src/ops/cascade/multi_level_cascade.cpp) around
// its per-level attention passes: the gather of q into cascade row order (requests of a group made
// consecutive), and the ⊕ of the levels' states, written straight to the caller's row order.
// One launch each; counts are read from device memory so a captured graph replays any later plan.
#pragma once

#include "attention/cascade/cascade_params.cuh"
#include "attention/state.cuh"
#include "primitives/types.cuh"

namespace flashkv {

// dst[j] = src[rows[j]] for each cascade row j: [H, D] rows, 16-byte vectors.
template <class T>
__global__ void cascade_gather_kernel(const CascadeRowsParams p, const T* __restrict__ src,
                                      long long src_stride_n, long long src_stride_h, T* dst) {
  constexpr int N = Vec16<T>::N;
  const int vecs = p.num_heads * p.head_dim / N;
  const long long n = (long long)(*p.num_rows) * vecs;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const long long j = i / vecs;
    const int e = (int)(i % vecs) * N, h = e / p.head_dim, d = e % p.head_dim;
    *reinterpret_cast<uint4*>(dst + j * p.num_heads * p.head_dim + e) =
        *reinterpret_cast<const uint4*>(src + (long long)p.rows[j] * src_stride_n +
                                        (long long)h * src_stride_h + d);
  }
}

// out[rows[j], h] = ⊕ over the levels of (o_l[j, h], lse_l[j, h]); 8 elements per thread (f32
// accumulation, one rounding). All levels empty: zeros and lse = -inf, as plain attention.
template <class T>
__global__ void cascade_merge_kernel(const CascadeMergeParams p) {
  constexpr int N = Vec16<T>::N;
  const int vecs = p.r.head_dim / N;
  const long long n = (long long)(*p.r.num_rows) * p.r.num_heads * vecs;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const long long jh = i / vecs;  // (cascade row, head)
    const int col = (int)(i % vecs) * N;
    float m = neg_inf();
    for (int l = 0; l < p.num_levels; ++l) m = fmaxf(m, p.lse[l][jh] * kLog2e);
    float acc[N];
#pragma unroll
    for (int e = 0; e < N; ++e) acc[e] = 0.f;
    float sum = 0.f;
    if (m != neg_inf()) {
      for (int l = 0; l < p.num_levels; ++l) {
        const float w = exp2f(p.lse[l][jh] * kLog2e - m);  // 0 for an empty level (-inf)
        float x[N];
        Vec16<T>::to_floats(*reinterpret_cast<const uint4*>(static_cast<const T*>(p.o[l]) +
                                                            jh * p.r.head_dim + col),
                            x);
#pragma unroll
        for (int e = 0; e < N; ++e) acc[e] += w * x[e];
        sum += w;
      }
    }
    const float inv = softmax_inv(sum);
#pragma unroll
    for (int e = 0; e < N; ++e) acc[e] *= inv;
    const long long j = jh / p.r.num_heads;
    const int h = (int)(jh % p.r.num_heads);
    const long long row = p.r.rows[j];
    *reinterpret_cast<uint4*>(static_cast<T*>(p.out) + row * p.o_stride_n + h * p.o_stride_h +
                              col) = Vec16<T>::from_floats(acc);
    if (p.out_lse != nullptr && col == 0) {
      p.out_lse[row * p.lse_stride_n + h] = sum > 0.f ? (m + log2f(sum)) * kLn2 : neg_inf();
    }
  }
}

}  // namespace flashkv
