// The CPU reference of every built-in attention variant (variants.h): the ops of reference.h with
// an AttentionVariant instead of AttentionOptions. Double accumulation; outputs rounded once.
// Shapes, layouts and argument checks are those of the matching reference.h op; the variant's
// tensors (alibi_slopes, sinks, mask_indptr, q/k_rope_offset) and custom mask bytes must be host
// memory. With `variant.sigmoid`, `lse` must be undefined (sigmoid attention has no softmax).
//
// `chunk` makes an op return the partial state of a split-KV chunk (the oracle for split-KV and
// for the ⊕-exactness of sinks): only keys [begin, end) of each request are seen, at their own
// positions, with the masks and positions of the whole request (variants.h, "Split-KV and ⊕").
#pragma once

#include <cstdint>

#include "flashkv/paged_kv.h"
#include "flashkv/tensor.h"
#include "flashkv/variants.h"

namespace flashkv::reference {

struct KVChunk {
  int64_t begin = 0;
  int64_t end = -1;        // -1: to the end of each request's KV (clamped to kv_len anyway)
  bool with_sinks = true;  // whether this chunk's state carries the sinks (exactly one should)
};

// q[H_qo, D]; k, v [kv_len, H_kv, D] (NHD) or [H_kv, kv_len, D] (HND); out[H_qo, D]; lse f32[H_qo].
void single_decode_variant(const TensorView& q, const TensorView& k, const TensorView& v,
                           const TensorView& out, const TensorView& lse, KVLayout layout,
                           const AttentionVariant& variant, const KVChunk& chunk = {});

// q[batch, H_qo, D] over a paged cache; out[batch, H_qo, D]; lse f32[batch, H_qo].
void batch_decode_variant(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                          const TensorView& lse, const AttentionVariant& variant,
                          const KVChunk& chunk = {});

// q[qo_len, H_qo, D]; k, v as in single_decode_variant; out[qo_len, H_qo, D]; lse f32[qo_len,
// H_qo].
void single_prefill_variant(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const TensorView& lse, KVLayout layout,
                            const AttentionVariant& variant, const KVChunk& chunk = {});

// Ragged queries q[nnz_qo, H_qo, D] split by qo_indptr i32[batch+1] over a paged cache.
void batch_prefill_paged_variant(const TensorView& q, const TensorView& qo_indptr,
                                 const PagedKVCache& kv, const TensorView& out,
                                 const TensorView& lse, const AttentionVariant& variant,
                                 const KVChunk& chunk = {});

// Ragged queries over ragged contiguous KV k, v [nnz_kv, H_kv, D] split by kv_indptr i32[batch+1].
void batch_prefill_ragged_variant(const TensorView& q, const TensorView& qo_indptr,
                                  const TensorView& k, const TensorView& v,
                                  const TensorView& kv_indptr, const TensorView& out,
                                  const TensorView& lse, const AttentionVariant& variant,
                                  const KVChunk& chunk = {});

}  // namespace flashkv::reference
