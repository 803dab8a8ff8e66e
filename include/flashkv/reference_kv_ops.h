// The CPU reference of the KV-cache ops and RoPE (kv_ops.h, rope.h): the oracle for their GPU
// kernels. Host tensors only; conventions, shapes and checks are those of kv_ops.h / rope.h (each
// function validates its arguments itself and names the bad one). RoPE computes in double and
// rounds each output element once; the append copies elements exactly (same dtype).
#pragma once

#include "flashkv/paged_kv.h"
#include "flashkv/rope.h"
#include "flashkv/tensor.h"

namespace flashkv::reference {

void append_paged_kv_cache(const TensorView& append_key, const TensorView& append_value,
                           const TensorView& batch_indices, const TensorView& positions,
                           const PagedKVCache& paged_kv);

void get_batch_indices_positions(const TensorView& append_indptr, const TensorView& seq_lens,
                                 const TensorView& batch_indices, const TensorView& positions);

void apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                const TensorView& k_rope, const TensorView& indptr, const TensorView& offsets,
                const RopeOptions& opts = {});
void apply_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                        const TensorView& k_rope, const TensorView& pos_ids,
                        const RopeOptions& opts = {});
void apply_llama31_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                        const TensorView& k_rope, const TensorView& indptr,
                        const TensorView& offsets, const Llama31RopeOptions& opts = {});
void apply_llama31_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                                const TensorView& k_rope, const TensorView& pos_ids,
                                const Llama31RopeOptions& opts = {});
void apply_rope_with_cos_sin_cache(const TensorView& q, const TensorView& k,
                                   const TensorView& q_rope, const TensorView& k_rope,
                                   const TensorView& positions, const TensorView& cos_sin_cache,
                                   bool is_neox = true);

}  // namespace flashkv::reference
