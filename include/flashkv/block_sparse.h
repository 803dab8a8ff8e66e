// Block-sparse attention masks (issue 26; the FlashInfer paper's view of KV as a block-sparse row
// matrix): which keys each query row attends to, as FlashInfer's BlockSparseAttentionWrapper and
// VariableBlockSparseAttentionWrapper describe them. Host arrays, as PrefillBatch takes them.
//
// Semantics (the CPU reference, reference_block_sparse.h, is the oracle):
// - BlockSparseLayout: an M x N attention matrix cut into R x C blocks. Block row i (query rows
//   [i R, (i + 1) R)) attends to block columns indices[indptr[i] .. indptr[i + 1]) (key tokens
//   [j C, (j + 1) C) each); a block column appears at most once per block row, in any order.
//   `block_mask`, when given, masks elements inside the stored blocks (FlashInfer's `mask`).
// - VariableBlockSparseLayout: per KV head h, rows cut into blocks of block_row_sz[h][a] query
//   rows and keys into blocks of block_col_sz[h][b] tokens; block (a, b) is attended where
//   block_mask_map[h][a][b] is nonzero. Query heads see their KV head's pattern (GQA).
// - causal (BlockSparseOptions): key n is also hidden from query row m unless
//   n <= m + N - M, the bottom-right alignment of every flashkv op (attention.h). FlashInfer's
//   wrapper instead applies its causal mask inside each block row's gathered key list; the two
//   agree only where that list is the row's whole prefix.
// A query row that sees no key gets out = 0 and lse = -inf (with sinks: the sink alone).
#pragma once

#include <cstdint>

#include "flashkv/attention.h"
#include "flashkv/tensor.h"

namespace flashkv {

struct BlockSparseLayout {
  const int32_t* indptr = nullptr;   // [M / R + 1]: 0, non-decreasing, ends at the block count
  const int32_t* indices = nullptr;  // [indptr[M / R]] block columns, each in [0, N / C)
  int64_t M = 0;                     // query rows
  int64_t N = 0;                     // key tokens
  int R = 1;                         // query rows per block, >= 1 (any value, M % R == 0)
  int C = 1;                         // key tokens per block, >= 1 (any value, N % C == 0)
  // Optional [nnz, R, C], one byte per element, nonzero = attend: element (r, c) of the t-th
  // stored block (indices[t]) is query row i R + r and key indices[t] C + c.
  const uint8_t* block_mask = nullptr;
  int64_t num_block_rows() const { return R > 0 ? M / R : 0; }
  int64_t num_block_cols() const { return C > 0 ? N / C : 0; }
};

struct VariableBlockSparseLayout {
  const uint8_t* block_mask_map = nullptr;  // [num_kv_heads, MB, NB], nonzero = attend
  const int32_t* block_row_sz = nullptr;    // [num_kv_heads, MB], each >= 0, each head's sum M
  const int32_t* block_col_sz = nullptr;    // [num_kv_heads, NB], each >= 0, each head's sum N
  int num_kv_heads = 0;
  int64_t MB = 0, NB = 0;  // block rows and columns per head
  int64_t M = 0, N = 0;    // query rows and key tokens
};

struct BlockSparseOptions {
  bool causal = false;          // see the header comment: bottom-right aligned, by position
  float sm_scale = 0.0f;        // 0: 1 / sqrt(head_dim)
  float logits_soft_cap = 0.0f;  // > 0: s = cap * tanh(s / cap) (variants.h)
  TensorView sinks;             // optional f32 [H_qo]: one more logit per head (variants.h)
  KVScale kv_scale;             // fp8 k, v: their dequantization scales
};

// Validate a layout; each failure is a flashkv::Error naming the argument and what was expected
// (R or C < 1, M not divisible by R, indptr not monotone or not ending at the block count, a
// block column out of range or repeated in a row, row / column sizes that do not sum to M / N).
void check_block_sparse_layout(const BlockSparseLayout& l);
void check_variable_block_sparse_layout(const VariableBlockSparseLayout& l);

}  // namespace flashkv
