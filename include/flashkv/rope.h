// Rotary position embedding (RoPE) on ragged queries and keys, with FlashInfer's conventions.
//
// Tensors: q [nnz, H_qo, D] and k [nnz, H_kv, D] (one row per token, any row/head strides, last
// dimension contiguous), f16/bf16/f32, one dtype for q, k and the outputs. q_rope / k_rope have
// the shapes of q / k. Out of place, or in place when q_rope is q and k_rope is k (the *_inplace
// forms); outputs that partly overlap their inputs are not supported.
//
// Positions. Token t of the batch has position p_t:
//   - by indptr + offsets (apply_rope, apply_llama31_rope): the tokens of request i are rows
//     [indptr[i], indptr[i+1]) and token j of it (0-based) has p = offsets[i] + j. indptr i32
//     [batch + 1] (0, non-decreasing, ends at nnz), offsets i32 [batch].
//   - by pos_ids (the *_pos_ids forms and apply_rope_with_cos_sin_cache): p_t = pos_ids[t], i32
//     [nnz].
//   Positions must be >= 0.
//
// Rotation. Only the first rotary_dim dimensions rotate (even, 2 <= rotary_dim <= D; 0 means D);
// the rest are copied unchanged. The rotary dimensions form rotary_dim / 2 pairs (x1, x2):
//   - interleave = false (NeoX / "half-split", the default): pair i is (x[i], x[i + rotary_dim/2])
//   - interleave = true  (GPT-J / original Llama):            pair i is (x[2i], x[2i + 1])
// and pair i turns by the angle p * freq[i]:
//   x1' = x1 cos - x2 sin,   x2' = x2 cos + x1 sin.
//
// Frequencies (rope_frequencies.h), for i in [0, rotary_dim / 2):
//   base[i] = rope_theta ^ (-2i / rotary_dim)
//   Llama (apply_rope):          freq[i] = base[i] / rope_scale   (linear position interpolation)
//   Llama 3.1 (apply_llama31_*): with wavelen = 2π / base[i] and
//     smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
//     clamped to [0, 1],
//                                freq[i] = (1 - smooth) * base[i] / rope_scale + smooth * base[i]
//     so bands with wavelen < old_context_len / high_freq_factor keep base[i] (high frequency),
//     bands with wavelen > old_context_len / low_freq_factor get base[i] / rope_scale (low
//     frequency), and the bands between are interpolated. This is FlashInfer's smooth_a/smooth_b
//     form (smooth = base * smooth_a + smooth_b) and Meta's / vLLM's piecewise definition.
//
// cos/sin cache (apply_rope_with_cos_sin_cache, the vLLM / SGLang convention): cos_sin_cache f32
// [max_position, rotary_dim]; row p holds cos(p * freq[i]) in columns [0, rotary_dim / 2) and
// sin(p * freq[i]) in [rotary_dim / 2, rotary_dim). rotary_dim is the cache's width. is_neox =
// true is the half-split pairing, false the interleaved one (is_neox == !interleave). Positions
// must be < max_position.
//
// Devices: host tensors run on the CPU reference (reference_kv_ops.h; double math, rounded once
// to the output dtype). CUDA tensors (all on one device, positions/indptr/offsets/cache
// included; index arrays contiguous) run one JIT kernel (kernels/kv/rope.cuh) on `stream`: it
// never synchronizes and is safe to capture in a CUDA graph (after the first GPU call on the
// device, which allocates the error record: device_errors.h). It rotates in f32 (the angle
// p * freq[i] reduced mod 2π in double, then sincosf; kv/rope_math.cuh) and rounds once to the
// dtype; 16-byte vector accesses when pointers, strides, head_dim and rotary_dim / 2 allow
// (else element by element); rotary_dim <= 256; a cos/sin cache must have contiguous rows.
// Bad input raises flashkv::Error naming the argument. Positions (and indptr, offsets) are on
// the device and are checked there, per token (device_errors.h): a token whose position is
// negative, >= max_position with a cos/sin cache, or that indptr places in no request is not
// written at all (in place: left as it was) and the first such error is raised by the next
// check_device_errors() (at once with FLASHKV_CHECK_DEVICE_ERRORS=1).
#pragma once

#include "flashkv/device_errors.h"
#include "flashkv/rope_frequencies.h"
#include "flashkv/runtime.h"
#include "flashkv/tensor.h"

namespace flashkv {

// --- Llama RoPE ---
void apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                const TensorView& k_rope, const TensorView& indptr, const TensorView& offsets,
                const RopeOptions& opts = {}, Stream stream = nullptr);
inline void apply_rope_inplace(const TensorView& q, const TensorView& k, const TensorView& indptr,
                               const TensorView& offsets, const RopeOptions& opts = {},
                               Stream stream = nullptr) {
  apply_rope(q, k, q, k, indptr, offsets, opts, stream);
}
void apply_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                        const TensorView& k_rope, const TensorView& pos_ids,
                        const RopeOptions& opts = {}, Stream stream = nullptr);
inline void apply_rope_pos_ids_inplace(const TensorView& q, const TensorView& k,
                                       const TensorView& pos_ids, const RopeOptions& opts = {},
                                       Stream stream = nullptr) {
  apply_rope_pos_ids(q, k, q, k, pos_ids, opts, stream);
}

// --- Llama 3.1 RoPE ---
void apply_llama31_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                        const TensorView& k_rope, const TensorView& indptr,
                        const TensorView& offsets, const Llama31RopeOptions& opts = {},
                        Stream stream = nullptr);
inline void apply_llama31_rope_inplace(const TensorView& q, const TensorView& k,
                                       const TensorView& indptr, const TensorView& offsets,
                                       const Llama31RopeOptions& opts = {},
                                       Stream stream = nullptr) {
  apply_llama31_rope(q, k, q, k, indptr, offsets, opts, stream);
}
void apply_llama31_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                                const TensorView& k_rope, const TensorView& pos_ids,
                                const Llama31RopeOptions& opts = {}, Stream stream = nullptr);
inline void apply_llama31_rope_pos_ids_inplace(const TensorView& q, const TensorView& k,
                                               const TensorView& pos_ids,
                                               const Llama31RopeOptions& opts = {},
                                               Stream stream = nullptr) {
  apply_llama31_rope_pos_ids(q, k, q, k, pos_ids, opts, stream);
}

// --- precomputed cos/sin (vLLM / SGLang) ---
// positions i32 [nnz]; cos_sin_cache f32 [max_position, rotary_dim].
void apply_rope_with_cos_sin_cache(const TensorView& q, const TensorView& k,
                                   const TensorView& q_rope, const TensorView& k_rope,
                                   const TensorView& positions, const TensorView& cos_sin_cache,
                                   bool is_neox = true, Stream stream = nullptr);
inline void apply_rope_with_cos_sin_cache_inplace(const TensorView& q, const TensorView& k,
                                                  const TensorView& positions,
                                                  const TensorView& cos_sin_cache,
                                                  bool is_neox = true, Stream stream = nullptr) {
  apply_rope_with_cos_sin_cache(q, k, q, k, positions, cos_sin_cache, is_neox, stream);
}

}  // namespace flashkv
