// The CPU reference of block-sparse attention (block_sparse.h): dense masked attention built from
// the layout. Each query row attends, in double, to exactly the keys the layout (with its element
// mask and `causal`) leaves it, in key order: logits sm_scale * q·k, then the soft-cap, a softmax
// whose denominator holds the head's sink when given; out rounded once to out's dtype, lse in
// natural log. A row that sees no key: out 0, lse -inf (or the sink's logit).
//
// q [M, H_qo, D]; k, v [N, H_kv, D] (NHD; fp8 with opts.kv_scale, dequantized exactly);
// out [M, H_qo, D]; lse f32 [M, H_qo] or undefined. Host tensors; H_qo a multiple of H_kv (GQA).
#pragma once

#include "flashkv/block_sparse.h"
#include "flashkv/tensor.h"

namespace flashkv::reference {

void block_sparse_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                            const BlockSparseLayout& layout, const TensorView& out,
                            const TensorView& lse, const BlockSparseOptions& opts = {});

// As above with a per-KV-head layout (layout.num_kv_heads must equal k's heads).
void variable_block_sparse_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const VariableBlockSparseLayout& layout, const TensorView& out,
                                     const TensorView& lse, const BlockSparseOptions& opts = {});

}  // namespace flashkv::reference
