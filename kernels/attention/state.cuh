// The online-softmax attention state of a query row over part of the KV: its math, in one place.
//
// Fields (logits in base 2, i.e. pre-multiplied by log2(e)):
//   m  running maximum logit seen (−inf before any key)
//   d  sum of 2^(logit − m) over the keys seen
//   o  sum of 2^(logit − m) · v over the keys seen (the elements of the row a thread holds)
// The normalized output is o / d and the log-sum-exp is m + log2(d). An empty state (m = −inf,
// d = 0) is the identity of ⊕: rows that see no key end as out = 0, lse = −inf
// (include/flashkv/attention.h).
//
// The kernels hold states in their own layouts and keep only the loops over them; the math on a
// row's statistics is the functions below. Layouts: SoftmaxState (a thread's N contiguous elements
// of one row: the CUDA-core decode), SoftmaxFragState (the rows of an mma.sync m16n8 C fragment,
// which wgmma's accumulators share: the prefill kernels; the tensor-core decode holds the same
// layout in plain arrays, decode_tc.cuh), and the split-KV merges' (m, d, o[4]) of normalized
// partial states (merge/split_merge.cuh, decode_merge_tile). Without softmax (sigmoid attention)
// a state is plain sums: m stays 0, d and o add the weights.
//
// A refactor here must leave the kernels' machine code as it is (scripts/compare_kernels.py):
// where a kernel writes one of these functions out instead of calling it, a comment there says
// so (the call changed the code ptxas made).
#pragma once

#include "primitives/types.cuh"

namespace flashkv {

// ---- One row's statistics ----

// One online-softmax step of a row to a tile of logits whose largest is `tile_max`. Branch-free
// (the warp-synchronous fragment kernels): a row that has seen only masked keys (m = −inf) takes
// its terms against 0, so they come out 0 (2^−inf), with no NaN from −inf − (−inf), and the row
// stays empty.
struct SoftmaxStep {
  float m;      // the new running maximum
  float m_exp;  // the tile's terms are p = 2^(x − m_exp): m, or 0 while the row is empty
  float scale;  // 2^(m_old − m_exp): the factor on the old d and o (0 until the first key)
};

__device__ __forceinline__ SoftmaxStep softmax_step(float m_old, float tile_max) {
  const float m_new = fmaxf(m_old, tile_max);
  const float m_exp = m_new == neg_inf() ? 0.f : m_new;
  return SoftmaxStep{m_new, m_exp, fast_exp2(m_old - m_exp)};
}

// A term of the step: 2^(x − m_exp) for a base-2 logit x, or for x = s · scale_log2 with s not
// yet scaled (one FFMA per logit).
__device__ __forceinline__ float softmax_p(float x, float m_exp) { return fast_exp2(x - m_exp); }
__device__ __forceinline__ float softmax_p(float s, float scale_log2, float m_exp) {
  return fast_exp2(fmaf(s, scale_log2, -m_exp));
}

// d after a step: the old d rescaled, plus the sum of the tile's terms.
__device__ __forceinline__ float softmax_d(float d, float scale, float tile_sum) {
  return d * scale + tile_sum;
}

// The factor that normalizes o: 1 / d, times f (a factor o still needs: a sink's, fold_sink2);
// 0 for an empty row (whose o is 0).
__device__ __forceinline__ float softmax_inv(float d, float f = 1.f) {
  return d > 0.f ? f / d : 0.f;
}

// The row's base-2 log-sum-exp; −inf for an empty row.
__device__ __forceinline__ float softmax_lse2(float m, float d) {
  return d > 0.f ? m + log2f(d) : neg_inf();
}

// Folds a sink (a base-2 logit with a zero value: variants/variant.cuh) into a state (m, d) whose
// o is still unnormalized: returns the factor o must be multiplied by. −inf sink: no change.
__device__ __forceinline__ float fold_sink2(float sink2, float& m, float& d) {
  if (sink2 == neg_inf()) return 1.f;
  const float m_new = fmaxf(m, sink2);
  const float scale = m == neg_inf() ? 0.f : fast_exp2(m - m_new);
  d = d * scale + fast_exp2(sink2 - m_new);
  m = m_new;
  return scale;
}

// ⊕ of several states of a row whose largest m is m_all (finite; an all-empty row skips the ⊕):
// the weight of the state with maximum m, 2^(m − m_all), 0 when it is empty. The state joins the
// sums as d_all += weight · d, o_all += weight · o (the kernel's loop over its staged o).
__device__ __forceinline__ float softmax_merge_scale(float m, float m_all) {
  return m == neg_inf() ? 0.f : fast_exp2(m - m_all);
}

// The same for a normalized state (o / d, lse2), as split-KV partial states are stored: weight
// 2^(lse2 − m_all), which is 0 for an empty state (lse2 = −inf).
template <int N>
__device__ __forceinline__ void softmax_merge_add_normalized(float m_all, float lse2,
                                                             const float* o, float& d_all,
                                                             float (&o_all)[N]) {
  const float w = fast_exp2(lse2 - m_all);
  d_all += w;
#pragma unroll
  for (int e = 0; e < N; ++e) o_all[e] += w * o[e];
}

// The same for the 4 columns of a float4.
__device__ __forceinline__ void softmax_merge_add_normalized(float m_all, float lse2,
                                                             const float4& o, float& d_all,
                                                             float (&o_all)[4]) {
  const float w = fast_exp2(lse2 - m_all);
  d_all += w;
  o_all[0] += w * o.x;
  o_all[1] += w * o.y;
  o_all[2] += w * o.z;
  o_all[3] += w * o.w;
}

// ---- A thread's N contiguous elements of one row ----

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
  // While every logit seen is −inf nothing changes (a per-thread branch: the state stays empty).
  __device__ __forceinline__ void rescale_for(const float* s, int n) {
    float m_new = m;
    for (int i = 0; i < n; ++i) m_new = fmaxf(m_new, s[i]);
    if (m_new == neg_inf()) return;            // still nothing seen
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

  // Folds a sink (fold_sink2) into the unnormalized state.
  __device__ __forceinline__ void add_sink2(float sink2) {
    const float f = fold_sink2(sink2, m, d);
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] *= f;
  }

  __device__ __forceinline__ void normalized(float* out) const {
    const float inv = softmax_inv(d);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = o[i] * inv;
  }

  // Base-2 log-sum-exp of the logits seen; −inf when none.
  __device__ __forceinline__ float lse2() const { return softmax_lse2(m, d); }
};

// ---- The rows of an mma.sync m16n8 C fragment (primitives/mma.cuh) ----
//
// A thread holds rows lane/4 (half h = 0: elements 0, 1 of each 8-column n-tile) and lane/4 + 8
// (h = 1: elements 2, 3) of each of R 16-row tiles, the 4 threads of a quad 2 columns each of
// every n-tile; wgmma's accumulators give each warp the same layout for its 16 rows. m is the
// row's; d is this thread's part of it (quad-partial: softmax_quad_sum at the end).

// o of the thread's row half h of one row tile (DT n-tiles) times `scale`.
template <int DT>
__device__ __forceinline__ void softmax_rescale_rows(float (&o)[DT][4], int h, float scale) {
#pragma unroll
  for (int n = 0; n < DT; ++n) {
    o[n][h * 2] *= scale;
    o[n][h * 2 + 1] *= scale;
  }
}

// A row's statistic over the quad that holds it.
__device__ __forceinline__ float softmax_quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}
__device__ __forceinline__ float softmax_quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

template <int R, int DT>
struct SoftmaxFragState {
  float o[R][DT][4];  // DT n-tiles of 8 columns
  float m[R][2];
  float d[R][2];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m[r][h] = neg_inf();
        d[r][h] = 0.f;
      }
#pragma unroll
      for (int n = 0; n < DT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[r][n][e] = 0.f;
    }
  }

  // The step of row half (r, h) to a tile whose largest logit is tile_max (quad-reduced): m moves
  // on; the caller takes the tile's terms against step.m_exp and ends the step with add().
  __device__ __forceinline__ SoftmaxStep step(int r, int h, float tile_max) {
    const SoftmaxStep s = softmax_step(m[r][h], tile_max);
    m[r][h] = s.m;
    return s;
  }

  // d of row half (r, h) after a step whose terms (this thread's) sum to tile_sum.
  __device__ __forceinline__ void add(int r, int h, const SoftmaxStep& s, float tile_sum) {
    d[r][h] = softmax_d(d[r][h], s.scale, tile_sum);
  }

  // o of row half (r, h) times `scale`.
  __device__ __forceinline__ void rescale(int r, int h, float scale) {
    softmax_rescale_rows(o[r], h, scale);
  }
};

}  // namespace flashkv
