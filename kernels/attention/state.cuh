// The online-softmax attention state of one query row over part of the KV, and ⊕ on it.
//
// Fields (logits in base 2, i.e. pre-multiplied by log2(e)):
//   m     running maximum logit seen (−inf before any key)
//   d     sum of 2^(logit − m) over the keys seen
//   o[N]  sum of 2^(logit − m) · v over the keys seen: this thread's N elements of the row
// The normalized output is o / d and the log-sum-exp is m + log2(d). An empty state (m = −inf,
// d = 0) is the identity of merge(): rows that see no key end as out = 0, lse = −inf.
#pragma once

#include "primitives/types.cuh"

namespace flashkv {

template <int N>
struct SoftmaxState {
  float m;
  float d;
  float o[N];

  __device__ __forceinline__ void init() {
    m = neg_inf();
    d = 0.f;
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = 0.f;
  }

  // Raises m to cover the next `n` logits (before they are accumulated), rescaling d and o.
  __device__ __forceinline__ void rescale_for(const float* s, int n) {
    float m_new = m;
    for (int i = 0; i < n; ++i) m_new = fmaxf(m_new, s[i]);
    if (m_new == neg_inf()) return;  // still nothing seen
    const float scale = fast_exp2(m - m_new);  // 2^-inf = 0 on the first keys
    d *= scale;
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] *= scale;
    m = m_new;
  }

  // Adds one key with logit s (already covered by rescale_for) and value elements v.
  __device__ __forceinline__ void accumulate(float s, const float* v) {
    const float p = s == neg_inf() ? 0.f : fast_exp2(s - m);
    d += p;
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = fmaf(p, v[i], o[i]);
  }

  // Adds one key with weight w (attention without softmax: m stays 0, o and d are plain sums).
  __device__ __forceinline__ void accumulate_weight(float w, const float* v) {
    d += w;
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = fmaf(w, v[i], o[i]);
  }

  // this = this ⊕ other (both unnormalized).
  __device__ __forceinline__ void merge(const SoftmaxState& other) {
    const float m_new = fmaxf(m, other.m);
    if (m_new == neg_inf()) return;
    const float sa = fast_exp2(m - m_new), sb = fast_exp2(other.m - m_new);
    d = d * sa + other.d * sb;
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = o[i] * sa + other.o[i] * sb;
    m = m_new;
  }

  __device__ __forceinline__ void normalized(float* out) const {
    const float inv = d > 0.f ? 1.f / d : 0.f;
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = o[i] * inv;
  }

  // Base-2 log-sum-exp of the logits seen; −inf when none.
  __device__ __forceinline__ float lse2() const { return d > 0.f ? m + log2f(d) : neg_inf(); }
};

}  // namespace flashkv
