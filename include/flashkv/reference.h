// The CPU reference backend: obviously-correct attention with double accumulation.
//
// Every op here is the oracle for the GPU kernels and runs on host tensors only (the public ops
// in ops.h route host tensors here). Inputs may be any floating dtype; outputs are rounded to
// their own dtype once, at the end. Conventions (LSE base e, empty rows, causal alignment) are
// those of attention.h. `lse` arguments are optional: pass an undefined TensorView to skip.
#pragma once

#include "flashkv/attention.h"
#include "flashkv/paged_kv.h"
#include "flashkv/tensor.h"

namespace flashkv::reference {

// q[H_qo, D]; k, v [kv_len, H_kv, D] (NHD) or [H_kv, kv_len, D] (HND); out[H_qo, D]; lse f32[H_qo].
void single_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const TensorView& lse, KVLayout layout,
                   const AttentionOptions& opts = {});

// q[batch, H_qo, D] over a paged cache (host index arrays); out[batch, H_qo, D]; lse f32[batch,
// H_qo].
void batch_decode(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                  const TensorView& lse, const AttentionOptions& opts = {});

// q[qo_len, H_qo, D]; k, v as in single_decode; out[qo_len, H_qo, D]; lse f32[qo_len, H_qo].
void single_prefill(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const TensorView& lse, KVLayout layout,
                    const AttentionOptions& opts = {});

// Ragged queries q[nnz_qo, H_qo, D] split by qo_indptr i32[batch+1] over a paged cache.
void batch_prefill_paged(const TensorView& q, const TensorView& qo_indptr, const PagedKVCache& kv,
                         const TensorView& out, const TensorView& lse,
                         const AttentionOptions& opts = {});

// Ragged queries over ragged contiguous KV: k, v [nnz_kv, H_kv, D] split by kv_indptr i32[batch+1].
void batch_prefill_ragged(const TensorView& q, const TensorView& qo_indptr, const TensorView& k,
                          const TensorView& v, const TensorView& kv_indptr, const TensorView& out,
                          const TensorView& lse, const AttentionOptions& opts = {});

// ⊕ of two states: v_a, v_b, v_out [n, H, D]; s_a, s_b, s_out f32 [n, H] (natural-log LSE).
void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out);

// ⊕ over the S states of each row: v[n, S, H, D], s f32[n, S, H] -> v_out[n, H, D], s_out f32[n,
// H].
void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView& s_out);

}  // namespace flashkv::reference
