// RoPE on ragged q [nnz, H_qo, D] and k [nnz, H_kv, D] (rope.h): one kernel for every entry point
// (Llama / Llama 3.1 frequencies or a cos/sin cache, positions from pos_ids or indptr + offsets).
//
// Memory-bound: each element is read once and written once. The threads of one token
//   1. find the token's position (pos_ids[t], or a binary search of t in indptr + offsets[i]),
//   2. compute cos/sin of each rotary pair once, into shared memory (the angle math of
//      rope_math.cuh costs a double multiply and sincosf: doing it per head would cost more than
//      the data movement),
//   3. rotate every q and k head: thread (unit u, head lane) holds the cos/sin of unit u's V pairs
//      in registers and walks the heads of its lane. A unit is two V-element vectors, 16 bytes
//      each when the layout allows (else single elements), holding V pairs:
//        NeoX        a = x[uV, uV + V),   b = x[R/2 + uV, ...)    pair uV + j = (a[j], b[j])
//        interleave  a = x[2uV, 2uV + V), b = x[2uV + V, ...)     pair uV + j = (ab[2j], ab[2j+1])
//      so both pairings move whole vectors (R = rotary_dim must be a multiple of 2V),
//   4. out of place, copy dims [R, D) unchanged (in place they are already there).
// Each element is read and written by the same thread, so in place (q_out == q) is safe.
// A token whose position is invalid (negative, past the cos/sin cache, not covered by indptr) is
// reported to the device error record and not written at all.
#pragma once

#include "common/device_error.cuh"
#include "kv/rope_math.cuh"
#include "kv/rope_params.cuh"
#include "primitives/types.cuh"

namespace flashkv {

// V elements at p as floats (one 16-byte load when V * sizeof(T) == 16).
template <class T, int V>
__device__ __forceinline__ void rope_load(const T* p, float (&f)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    Vec16<T>::to_floats(*reinterpret_cast<const uint4*>(p), f);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) f[i] = to_float(p[i]);
  }
}

template <class T, int V>
__device__ __forceinline__ void rope_store(T* p, const float (&f)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    *reinterpret_cast<uint4*>(p) = Vec16<T>::from_floats(f);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = from_float<T>(f[i]);
  }
}

template <class T, int V>
__device__ __forceinline__ void rope_copy(const T* src, T* dst) {
  if constexpr (V * sizeof(T) == 16) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) dst[i] = src[i];
  }
}

// The position of token t, or -1 when it is invalid; `reporter` (one thread per token) records
// why. With indptr: the request is the last i with indptr[i] <= t, and t must lie in
// [indptr[i], indptr[i+1]) (this also catches a decreasing or short indptr, for this token).
__device__ __forceinline__ long long rope_token_position(const RopeKernelParams& p, i64 t,
                                                         bool reporter) {
  long long pos;
  long long request = -1, row = -1;
  if (p.pos_ids != nullptr) {
    pos = p.pos_ids[t];
  } else {
    int lo = 0, hi = p.batch;  // search indptr[0 .. batch]
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (p.indptr[mid] <= t)
        lo = mid;
      else
        hi = mid - 1;
    }
    if (lo >= p.batch || p.indptr[lo] > t || t >= p.indptr[lo + 1]) {
      if (reporter) {
        report_device_error(p.error, kDeviceErrorIndptr, p.op, t, p.indptr[p.batch], p.nnz,
                            p.batch);
      }
      return -1;
    }
    request = lo;
    row = t - p.indptr[lo];
    pos = (long long)p.offsets[lo] + row;
  }
  const bool cached = p.rope.cos_sin_cache != nullptr;
  if (pos < 0 || (cached && pos >= p.rope.max_position)) {
    if (reporter) {
      report_device_error(p.error, kDeviceErrorRopePosition, p.op, t, pos,
                          cached ? p.rope.max_position : -1, row, request);
    }
    return -1;
  }
  return pos;
}

// Grid: ceil(nnz / tokens_per_cta) CTAs of tokens_per_cta * threads_per_token threads; dynamic
// shared memory: tokens_per_cta * rotary_dim / 2 float2 (the cos/sin of each token's pairs).
template <class T, int V, bool kInterleave>
__global__ void __launch_bounds__(kRopeThreads)
    rope_kernel(const __grid_constant__ RopeKernelParams p) {
  extern __shared__ float2 rope_cs[];  // [tokens_per_cta][rotary_dim / 2] (cos, sin)
  const int tpt = p.threads_per_token;
  const int slot = threadIdx.x / tpt, local = threadIdx.x % tpt;
  const i64 t = (i64)blockIdx.x * (blockDim.x / tpt) + slot;
  const int R = p.rope.rotary_dim, half = R / 2;
  float2* cs = rope_cs + slot * half;

  if (p.pos_ids == nullptr && t == 0 && local == 0) {  // the ends of indptr, checked once
    if (p.indptr[0] != 0) {
      report_device_error(p.error, kDeviceErrorIndptr, p.op, -1, p.indptr[0], 0, 0);
    } else if (p.indptr[p.batch] != p.nnz) {
      report_device_error(p.error, kDeviceErrorIndptr, p.op, -1, p.indptr[p.batch], p.nnz, p.batch);
    }
  }
  const long long pos = t < p.nnz ? rope_token_position(p, t, local == 0) : -1;
  if (pos >= 0) {
    for (int i = local; i < half; i += tpt) {
      float c, s;
      rope_cos_sin(p.rope, pos, i, c, s);
      cs[i] = make_float2(c, s);
    }
  }
  __syncthreads();
  if (pos < 0) return;

  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  T* qo = static_cast<T*>(p.q_out);
  T* ko = static_cast<T*>(p.k_out);
  const int heads = p.num_qo_heads + p.num_kv_heads;
  const int units = R / (2 * V);
  const int u = local % units, lane = local / units;
  const int off_a = kInterleave ? 2 * u * V : u * V;
  const int off_b = kInterleave ? 2 * u * V + V : half + u * V;
  float c[V], s[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float2 v = cs[u * V + j];
    c[j] = v.x;
    s[j] = v.y;
  }
  for (int h = lane; h < heads; h += p.head_lanes) {
    const bool is_q = h < p.num_qo_heads;
    const int hh = is_q ? h : h - p.num_qo_heads;
    const T* src =
        is_q ? q + t * p.q_stride_n + hh * p.q_stride_h : k + t * p.k_stride_n + hh * p.k_stride_h;
    T* dst = is_q ? qo + t * p.qo_stride_n + hh * p.qo_stride_h
                  : ko + t * p.ko_stride_n + hh * p.ko_stride_h;
    float a[V], b[V], ya[V], yb[V];
    rope_load<T, V>(src + off_a, a);
    rope_load<T, V>(src + off_b, b);
    if constexpr (kInterleave) {
      float x[2 * V], y[2 * V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        x[j] = a[j];
        x[V + j] = b[j];
      }
#pragma unroll
      for (int j = 0; j < V; ++j)
        rope_rotate(x[2 * j], x[2 * j + 1], c[j], s[j], y[2 * j], y[2 * j + 1]);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        ya[j] = y[j];
        yb[j] = y[V + j];
      }
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) rope_rotate(a[j], b[j], c[j], s[j], ya[j], yb[j]);
    }
    rope_store<T, V>(dst + off_a, ya);
    rope_store<T, V>(dst + off_b, yb);
  }

  if (p.copy_tail) {
    const int tail_units = (p.head_dim - R) / V;
    for (int idx = local; idx < heads * tail_units; idx += tpt) {
      const int h = idx / tail_units, e = R + (idx % tail_units) * V;
      const bool is_q = h < p.num_qo_heads;
      const int hh = is_q ? h : h - p.num_qo_heads;
      const T* src = is_q ? q + t * p.q_stride_n + hh * p.q_stride_h
                          : k + t * p.k_stride_n + hh * p.k_stride_h;
      T* dst = is_q ? qo + t * p.qo_stride_n + hh * p.qo_stride_h
                    : ko + t * p.ko_stride_n + hh * p.ko_stride_h;
      rope_copy<T, V>(src + e, dst + e);
    }
  }
}

}  // namespace flashkv
