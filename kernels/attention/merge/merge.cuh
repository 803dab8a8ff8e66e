// ⊕ of attention states (docs/design.md "Kernel families") on the GPU: one pass, 16-byte vector
// loads. Values T (f16/bf16/f32) are [rows, D] contiguous; LSEs are f32, NATURAL log (the public
// convention); -inf marks an empty state (the identity of ⊕).
#pragma once

#include "primitives/types.cuh"

namespace flashkv {

// One thread per 16-byte vector of one row. rows = n * H.
template <class T>
__global__ void merge_state_kernel(const T* __restrict__ v_a, const float* __restrict__ s_a,
                                   const T* __restrict__ v_b, const float* __restrict__ s_b,
                                   T* v_out, float* s_out, i64 rows, int head_dim) {
  constexpr int N = Vec16<T>::N;
  const int vecs_per_row = head_dim / N;
  const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= rows * vecs_per_row) return;
  const i64 row = idx / vecs_per_row;
  const int col = (int)(idx % vecs_per_row) * N;
  const float la = s_a[row] * kLog2e, lb = s_b[row] * kLog2e;
  const float m = fmaxf(la, lb);
  float out[N];
  float lse;
  if (m == neg_inf()) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = 0.f;
    lse = neg_inf();
  } else {
    const float wa = exp2f(la - m), wb = exp2f(lb - m);
    const float inv = 1.f / (wa + wb);
    float fa[N], fb[N];
    Vec16<T>::to_floats(*reinterpret_cast<const uint4*>(v_a + row * head_dim + col), fa);
    Vec16<T>::to_floats(*reinterpret_cast<const uint4*>(v_b + row * head_dim + col), fb);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = (wa * fa[i] + wb * fb[i]) * inv;
    lse = (m + log2f(wa + wb)) * kLn2;
  }
  // For an in-place merge s_out is nullptr: other threads of this row may still read s_a, so
  // the LSEs are updated afterwards by merge_lse_kernel.
  *reinterpret_cast<uint4*>(v_out + row * head_dim + col) = Vec16<T>::from_floats(out);
  if (s_out != nullptr && col == 0) s_out[row] = lse;
}

// The LSE half of ⊕, for in-place merges: run after merge_state_kernel wrote the values with
// s_out == nullptr, so no value thread reads an LSE that was already overwritten.
__global__ void merge_lse_kernel(float* s_a, const float* __restrict__ s_b, i64 rows) {
  const i64 row = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const float la = s_a[row] * kLog2e, lb = s_b[row] * kLog2e;
  const float m = fmaxf(la, lb);
  s_a[row] = m == neg_inf() ? neg_inf() : (m + log2f(exp2f(la - m) + exp2f(lb - m))) * kLn2;
}

// ⊕ over S states: v[n, S, H, D], s[n, S, H] -> v_out[n, H, D], s_out[n, H].
// One thread per 16-byte vector of one (n, h) row; reads each state's vector once.
template <class T>
__global__ void merge_states_kernel(const T* __restrict__ v, const float* __restrict__ s,
                                    T* __restrict__ v_out, float* __restrict__ s_out, i64 n,
                                    int num_states, int num_heads, int head_dim) {
  constexpr int N = Vec16<T>::N;
  const int vecs_per_row = head_dim / N;
  const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const i64 rows = n * num_heads;
  if (idx >= rows * vecs_per_row) return;
  const i64 row = idx / vecs_per_row;  // = token * H + head
  const i64 tok = row / num_heads;
  const int head = (int)(row % num_heads);
  const int col = (int)(idx % vecs_per_row) * N;
  float m = neg_inf();
  for (int k = 0; k < num_states; ++k)
    m = fmaxf(m, s[(tok * num_states + k) * num_heads + head] * kLog2e);
  float acc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = 0.f;
  float denom = 0.f;
  if (m != neg_inf()) {
    for (int k = 0; k < num_states; ++k) {
      const i64 srow = (tok * num_states + k) * num_heads + head;
      const float w = exp2f(s[srow] * kLog2e - m);
      float f[N];
      Vec16<T>::to_floats(*reinterpret_cast<const uint4*>(v + srow * head_dim + col), f);
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] += w * f[i];
      denom += w;
    }
    const float inv = 1.f / denom;
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] *= inv;
  }
  *reinterpret_cast<uint4*>(v_out + row * head_dim + col) = Vec16<T>::from_floats(acc);
  if (col == 0) s_out[row] = m == neg_inf() ? neg_inf() : (m + log2f(denom)) * kLn2;
}

}  // namespace flashkv
