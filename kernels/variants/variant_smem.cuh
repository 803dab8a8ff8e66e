// A variant's query / key / value transforms applied to rows staged in shared memory, in place,
// by all threads of a CTA: the one place the kernels (decode on tensor cores and CUDA cores,
// prefill) run these hooks on 16-bit rows. The layout is the kernel's: `offset(row, chunk)` is the
// byte offset of 16-byte chunk `chunk` of row `row`. Results are rounded back to the row's dtype.
// Callers put a __syncthreads() between the loads landing and this, and after it.
#pragma once

#include "kv/rope_math.cuh"
#include "primitives/types.cuh"
#include "variants/variant.cuh"

namespace flashkv {

template <class T, class Offset>
__device__ __forceinline__ T* variant_elem(unsigned char* base, const Offset& offset, int row,
                                           int e) {
  return reinterpret_cast<T*>(base + offset(row, e / 8)) + e % 8;
}

// query_transform on rows [0, rows): row r's context comes from row_ctx(r).
template <class V, class T, int HEAD_DIM, int THREADS, class Offset, class RowCtx>
__device__ __forceinline__ void variant_transform_q_rows(const typename V::Args& a,
                                                         unsigned char* base, const Offset& offset,
                                                         int rows, const RowCtx& row_ctx) {
  constexpr int kHalf = HEAD_DIM / 2;
  for (int idx = threadIdx.x; idx < rows * kHalf; idx += THREADS) {
    const int r = idx / kHalf, i = idx % kHalf;
    T* p1 = variant_elem<T>(base, offset, r, i);
    T* p2 = variant_elem<T>(base, offset, r, i + kHalf);
    float x1 = to_float(*p1), x2 = to_float(*p2);
    V::query_transform(a, row_ctx(r), i, x1, x2);
    *p1 = from_float<T>(x1);
    *p2 = from_float<T>(x2);
  }
}

// RoPE (rope_freq / key_rope_pos) on the staged key rows [0, rows): thread t owns pair
// i = t % (D/2) of rows t / (D/2), + kStep, + 2 kStep, ... Their positions advance by kStep, so
// one precise sin/cos per thread and tile plus a step rotation (4 FMAs) per row replace a sin/cos
// per element; the step recurrence adds ~1e-7 relative per row (<= 64 rows), far below the
// 16-bit rounding of the result.
template <class V, class T, int HEAD_DIM, int THREADS, class Offset>
__device__ __forceinline__ void variant_rope_k_rows(const typename V::Args& a, VariantKey key,
                                                    int first_kv_idx, int rows,
                                                    unsigned char* k_base, const Offset& offset) {
  constexpr int kHalf = HEAD_DIM / 2;
  static_assert(THREADS % kHalf == 0, "whole rows of pairs per thread group");
  constexpr int kStep = THREADS / kHalf;
  const int i = threadIdx.x % kHalf;
  const int r0 = threadIdx.x / kHalf;
  if (r0 >= rows) return;
  key.kv_idx = first_kv_idx + r0;
  const double freq = V::rope_freq(a, i);
  float c, s, cs, ss;
  rope_angle_cos_sin(freq, V::key_rope_pos(a, key), c, s);
  rope_angle_cos_sin(freq, kStep, cs, ss);
  for (int r = r0; r < rows; r += kStep) {
    T* p1 = variant_elem<T>(k_base, offset, r, i);
    T* p2 = variant_elem<T>(k_base, offset, r, i + kHalf);
    const float x1 = to_float(*p1), x2 = to_float(*p2);
    *p1 = from_float<T>(x1 * c - x2 * s);
    *p2 = from_float<T>(x2 * c + x1 * s);
    const float cn = c * cs - s * ss;
    s = s * cs + c * ss;
    c = cn;
  }
}

// key_transform / value_transform on the staged K and V rows [0, rows) of a KV tile whose row 0
// is key `first_kv_idx` of the request (`key` carries batch, kv_len, kv_head).
template <class V, class T, int HEAD_DIM, int THREADS, class Offset>
__device__ __forceinline__ void variant_transform_kv_rows(const typename V::Args& a, VariantKey key,
                                                          int first_kv_idx, int rows,
                                                          unsigned char* k_base,
                                                          unsigned char* v_base,
                                                          const Offset& offset) {
  typedef VariantTraits<V> Tr;
  static_assert(!is_fp8<T>(),
                "key_transform / value_transform / key RoPE over an fp8 cache need the tile staged "
                "widened (kv/kv_chunk_copy.cuh); the host widens it when the variant's source "
                "names one of these hooks");
  if constexpr (Tr::kKeyRope)
    variant_rope_k_rows<V, T, HEAD_DIM, THREADS>(a, key, first_kv_idx, rows, k_base, offset);
  if constexpr (Tr::kKeyTransform) {
    constexpr int kHalf = HEAD_DIM / 2;
    for (int idx = threadIdx.x; idx < rows * kHalf; idx += THREADS) {
      const int r = idx / kHalf, i = idx % kHalf;
      key.kv_idx = first_kv_idx + r;
      T* p1 = variant_elem<T>(k_base, offset, r, i);
      T* p2 = variant_elem<T>(k_base, offset, r, i + kHalf);
      float x1 = to_float(*p1), x2 = to_float(*p2);
      V::key_transform(a, key, i, x1, x2);
      *p1 = from_float<T>(x1);
      *p2 = from_float<T>(x2);
    }
  }
  if constexpr (Tr::kValueTransform) {
    for (int idx = threadIdx.x; idx < rows * HEAD_DIM; idx += THREADS) {
      const int r = idx / HEAD_DIM, e = idx % HEAD_DIM;
      key.kv_idx = first_kv_idx + r;
      T* p = variant_elem<T>(v_base, offset, r, e);
      *p = from_float<T>(V::value_transform(a, key, e, to_float(*p)));
    }
  }
}

}  // namespace flashkv
