// The fused decode step inside the decode kernels (both decode.cuh and decode_tc.cuh): RoPE on q
// and on the new key, the append of the new key and value into the paged cache, and attention
// over the updated cache, in one launch.
//
// Ordering. Every request brings exactly one new token, at position kv_len - 1 (the plan counts
// it). Split-KV cuts a request's KV into chunks that partition [0, kv_len), and the loads of a
// work item never touch a token outside its chunk (decode_issue_tile zero-fills past the end), so
// exactly one work item per (request, kv_head) reads the new token's slot: the one whose chunk
// ends at kv_len. That item's CTA writes the slot first, then __syncthreads() (which orders the
// CTA's global writes before its own later reads), then streams the chunk. No other CTA reads the
// slot, so no grid-wide ordering is needed and the split-KV schedule is unchanged. (Two requests
// that share the page of their last token would race; a serving engine never shares a page that
// is still being written, and the unfused append would be just as wrong there.)
//
// Rounding. q and the key are rotated through kv/rope_math.cuh, the functions apply_rope's kernel
// uses, and rounded to the element type once: the cache and the output match the unfused
// rope -> append -> decode sequence bitwise.
#pragma once

#include "attention/decode/decode_params.cuh"
#include "common/device_error.cuh"
#include "kv/rope_math.cuh"
#include "primitives/types.cuh"

namespace flashkv {

__device__ __forceinline__ bool decode_step_active(const DecodeParams& p) {
  return p.step.new_k != nullptr;
}

// decode_step_position's value for a RoPE position out of range: the request's q and key are not
// rotated and its new token is not appended (device_errors.h: nothing is written for bad input).
constexpr long long kStepBadPosition = -2;

// The RoPE position of request w.request's new token; -1 when nothing rotates (no fused step, no
// RoPE), kStepBadPosition when the position is out of range (reported once per request).
__device__ __forceinline__ long long decode_step_position(const DecodeParams& p,
                                                          const DecodeWorkItem& w) {
  if (!decode_step_active(p) || !p.step.rope) return -1;
  const long long pos = p.step.pos_ids != nullptr ? p.step.pos_ids[w.request] : w.kv_len - 1;
  const bool bad =
      pos < 0 || (p.step.spec.cos_sin_cache != nullptr && pos >= p.step.spec.max_position);
  if (bad) {
    if (threadIdx.x == 0 && w.kv_head == 0) {
      report_device_error(p.error, kDeviceErrorRopePosition, kDeviceOpDecodeStep, w.request, pos,
                          p.step.spec.cos_sin_cache != nullptr ? p.step.spec.max_position : -1, -1,
                          w.request);
    }
    return kStepBadPosition;
  }
  return pos;
}

// cos/sin of the pairs of 8 consecutive elements [col, col + 8) at one position: a thread that
// rotates the same columns of several heads computes them once.
struct StepRot8 {
  float c[8], s[8];
};
__device__ __forceinline__ int rope_pair_of(const RopeSpec& r, int e) {
  const int half = r.rotary_dim / 2;
  return r.interleave ? e / 2 : (e < half ? e : e - half);
}
__device__ __forceinline__ StepRot8 decode_step_rot8(const RopeSpec& r, int col, long long pos) {
  StepRot8 t;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    t.c[e] = 1.f;
    t.s[e] = 0.f;
    if (col + e < r.rotary_dim) rope_cos_sin(r, pos, rope_pair_of(r, col + e), t.c[e], t.s[e]);
  }
  return t;
}

// Element e of a head row `row` (of T), rotated by (c, s) when e < rotary_dim: reads its pair
// partner from the same row. Returns the value rounded to T and back, as the unfused RoPE
// writes it.
template <class T>
__device__ __forceinline__ float decode_step_rotated(const RopeSpec& r, const T* row, int e,
                                                     float x, float c, float s) {
  if (e >= r.rotary_dim) return x;
  const int i = rope_pair_of(r, e);
  const bool first = r.interleave ? (e % 2 == 0) : e < r.rotary_dim / 2;
  const float partner = to_float(row[first ? rope_second(r, i) : rope_first(r, i)]);
  float y1, y2;
  if (first) {
    rope_rotate(x, partner, c, s, y1, y2);
    return to_float(from_float<T>(y1));
  }
  rope_rotate(partner, x, c, s, y1, y2);
  return to_float(from_float<T>(y2));
}

// 8 elements [col, col + 8) of query head `qo_head` of request w.request, loaded and, in a fused
// step with RoPE (pos >= 0), rotated with the cos/sin of `rot` (decode_step_rot8 of col, pos).
template <class T>
__device__ __forceinline__ uint4 decode_step_load_q8(const DecodeParams& p, const DecodeWorkItem& w,
                                                     int qo_head, int col, long long pos,
                                                     const StepRot8& rot) {
  const T* row = static_cast<const T*>(p.q) + (long long)w.request * p.q_stride_n +
                 (long long)qo_head * p.q_stride_h;
  const uint4 raw = *reinterpret_cast<const uint4*>(row + col);
  if (pos < 0 || col >= p.step.spec.rotary_dim) return raw;
  float x[8];
  Vec16<T>::to_floats(raw, x);
#pragma unroll
  for (int e = 0; e < 8; ++e)
    x[e] = decode_step_rotated<T>(p.step.spec, row, col + e, x[e], rot.c[e], rot.s[e]);
  return Vec16<T>::from_floats(x);
}

// The KV tile of work item w (tiles of C::kTile tokens from kv_start) that holds the new token,
// when this item appends it (its chunk ends at kv_len and its RoPE position is valid); -1
// otherwise. Uniform across the CTA.
template <class C>
__device__ __forceinline__ int decode_step_append_tile(const DecodeParams& p,
                                                       const DecodeWorkItem& w,
                                                       long long step_pos) {
  if (!decode_step_active(p) || step_pos == kStepBadPosition || w.kv_end != w.kv_len ||
      w.kv_end == w.kv_start)
    return -1;
  return (w.kv_end - w.kv_start - 1) / C::kTile;
}

// The new token's key (rotated) and value of head w.kv_head written into its cache slot, by the
// CTA of the work item whose chunk ends at kv_len (call it only when decode_step_append_tile >= 0,
// before the load of that tile is issued). All threads call it; it ends with the barrier that
// makes the writes visible to the CTA's later loads.
// 8 elements [c * 8, c * 8 + 8) of a new key or value row `src` (of T), rotated where `rotate`
// (keys; element positions below rotary_dim) and rounded to T, as the unfused RoPE writes them.
template <class T>
__device__ __forceinline__ void decode_step_row8(const DecodeParams& p, const T* src, int c,
                                                 bool rotate, long long pos, float (&x)[8]) {
  Vec16<T>::to_floats(*reinterpret_cast<const uint4*>(src + c * 8), x);
  if (rotate && c * 8 < p.step.spec.rotary_dim) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float cs, sn;
      rope_cos_sin(p.step.spec, pos, rope_pair_of(p.step.spec, c * 8 + e), cs, sn);
      x[e] = decode_step_rotated<T>(p.step.spec, src, c * 8 + e, x[e], cs, sn);
    }
  }
}

// 8 values divided by the cache's scale and rounded to fp8 F (saturating), as
// append_paged_kv_cache quantizes: 8 bytes.
template <class F>
__device__ __forceinline__ uint2 decode_step_quantize8(const float (&x)[8], float scale) {
  u32 w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = quantize_fp8x2<F>(__fdiv_rn(x[2 * i], scale), __fdiv_rn(x[2 * i + 1], scale));
  return make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
}

// The fused step into an fp8 cache: the new key and value come in q's dtype and are quantized
// with the cache's scales (decode_step_append's contract otherwise).
template <class C>
__device__ __forceinline__ void decode_step_append_fp8(const DecodeParams& p,
                                                       const DecodeWorkItem& w, long long off,
                                                       long long pos) {
  typedef typename C::kv_mem_t kv_t;  // the cache's (a widened tile's is not)
  typedef typename C::q_t src_t;
  kv_t* kd = static_cast<kv_t*>(const_cast<void*>(p.k)) + off;
  kv_t* vd = static_cast<kv_t*>(const_cast<void*>(p.v)) + off;
  const src_t* ks = static_cast<const src_t*>(p.step.new_k) +
                    (long long)w.request * p.step.k_stride_n +
                    (long long)w.kv_head * p.step.k_stride_h;
  const src_t* vs = static_cast<const src_t*>(p.step.new_v) +
                    (long long)w.request * p.step.v_stride_n +
                    (long long)w.kv_head * p.step.v_stride_h;
  const float k_scale = kv_scale_k(p.scale, w.kv_head), v_scale = kv_scale_v(p.scale, w.kv_head);
  for (int c = threadIdx.x; c < C::kHeadDim / 8; c += C::kThreads) {
    float x[8];
    decode_step_row8<src_t>(p, ks, c, pos >= 0, pos, x);
    *reinterpret_cast<uint2*>(kd + c * 8) = decode_step_quantize8<kv_t>(x, k_scale);
    decode_step_row8<src_t>(p, vs, c, false, pos, x);
    *reinterpret_cast<uint2*>(vd + c * 8) = decode_step_quantize8<kv_t>(x, v_scale);
  }
}

// The 16-bit cache: the new key (rotated) and value copied as they are.
template <class C>
__device__ __forceinline__ void decode_step_append_16(const DecodeParams& p,
                                                      const DecodeWorkItem& w, long long off,
                                                      long long pos) {
  typedef typename C::kv_mem_t kv_t;  // the cache's and the new rows'
  kv_t* kd = static_cast<kv_t*>(const_cast<void*>(p.k)) + off;
  kv_t* vd = static_cast<kv_t*>(const_cast<void*>(p.v)) + off;
  const kv_t* ks = static_cast<const kv_t*>(p.step.new_k) +
                   (long long)w.request * p.step.k_stride_n +
                   (long long)w.kv_head * p.step.k_stride_h;
  const kv_t* vs = static_cast<const kv_t*>(p.step.new_v) +
                   (long long)w.request * p.step.v_stride_n +
                   (long long)w.kv_head * p.step.v_stride_h;
  const bool rotate = pos >= 0;
  for (int c = threadIdx.x; c < C::kHeadDim / 8; c += C::kThreads) {
    uint4 kv = *reinterpret_cast<const uint4*>(ks + c * 8);
    if (rotate && c * 8 < p.step.spec.rotary_dim) {
      float x[8];
      Vec16<kv_t>::to_floats(kv, x);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float cs, sn;
        rope_cos_sin(p.step.spec, pos, rope_pair_of(p.step.spec, c * 8 + e), cs, sn);
        x[e] = decode_step_rotated<kv_t>(p.step.spec, ks, c * 8 + e, x[e], cs, sn);
      }
      kv = Vec16<kv_t>::from_floats(x);
    }
    *reinterpret_cast<uint4*>(kd + c * 8) = kv;
    *reinterpret_cast<uint4*>(vd + c * 8) = *reinterpret_cast<const uint4*>(vs + c * 8);
  }
}

template <class C>
__device__ __forceinline__ void decode_step_append(const DecodeParams& p, const DecodeWorkItem& w,
                                                   long long pos) {
  const int t = w.kv_len - 1;
  const int page = p.kv_indices[w.page_base + t / C::kPageSize];
  if ((unsigned long long)page < (unsigned long long)p.num_pages) {
    const long long off = (long long)page * p.page_stride +
                          (long long)(t % C::kPageSize) * p.token_stride +
                          (long long)w.kv_head * p.head_stride;
    if constexpr (is_fp8<typename C::kv_mem_t>()) {
      decode_step_append_fp8<C>(p, w, off, pos);
    } else {
      decode_step_append_16<C>(p, w, off, pos);
    }
  } else if (threadIdx.x == 0) {
    report_device_error(p.error, kDeviceErrorPageIndex, kDeviceOpDecodeStep, w.request, page,
                        p.num_pages, w.page_base + t / C::kPageSize, w.request);
  }
  __syncthreads();
}

}  // namespace flashkv
