// One KV head of a VariableBlockSparseLayout as batch prefill over that head's keys viewed as
// pages of one token (k[:, h] as [N, 1, 1, D]; page n is key token n): block row a of head h (its
// block_row_sz[h][a] query rows, after those of the block rows before it) is a request whose
// pages are the tokens of its attended block columns, in column order. FlashInfer's
// VariableBlockSparseAttentionWrapper maps it the same way (page size 1); flashkv keeps each head
// a batch of its own (VariableBlockSparseAttention runs one prefill per KV head over strided
// views of q and out), so no copy of q is made. Block rows of 0 rows are left out.
//
// Causal (position: key n visible to query m iff n <= m + N - M) drops the tokens no row of the
// request sees and, where a kept token is hidden from some row, masks it per row (a custom mask).
// Host arrays only: the CPU tests run them through the paged reference.
#pragma once

#include "flashkv/block_sparse.h"
#include "ops/block_sparse/bsr_paged_plan.h"

namespace flashkv::ops {

// Does not check `l` (check_variable_block_sparse_layout does, once for every head).
BsrPagedPlan variable_head_as_paged_prefill(const VariableBlockSparseLayout& l, int head,
                                            bool causal);

}  // namespace flashkv::ops
