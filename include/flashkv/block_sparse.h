// Block-sparse attention masks (the FlashInfer paper's view of KV as a block-sparse row
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

#include <cstddef>
#include <cstdint>
#include <memory>

#include "flashkv/attention.h"
#include "flashkv/paged_kv.h"
#include "flashkv/runtime.h"
#include "flashkv/tensor.h"
#include "flashkv/variants.h"

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
  bool causal = false;           // see the header comment: bottom-right aligned, by position
  float sm_scale = 0.0f;         // 0: 1 / sqrt(head_dim)
  float logits_soft_cap = 0.0f;  // > 0: s = cap * tanh(s / cap) (variants.h)
  TensorView sinks;              // optional f32 [H_qo]: one more logit per head (variants.h)
  KVScale kv_scale;              // fp8 k, v: their dequantization scales
  // ALiBi and RoPE at the tokens' own positions (query row m at m + N - M, key token n at n),
  // however the layout gathers the keys: optional f32 [H_qo] slopes (logit += slope * (n - q_pos))
  // and RoPE on q and k (mode llama or llama31; its q / k_rope_offset are not taken). On the GPU
  // these run as a generated variant on the mma.sync kernel (src/ops/block_sparse/
  // sparse_positions_variant.h).
  TensorView alibi_slopes;
  RopeParams rope;
};

// The bytes of the mask a plan of `l` uploads (causal or an element mask: R x (blocks x C) bits
// per block row, byte-aligned per row; 0 otherwise): what BlockSparseConfig::max_mask_bytes bounds.
int64_t block_sparse_mask_bytes(const BlockSparseLayout& l, bool causal);

// Block-sparse attention on the GPU: each block row runs as a request of batch prefill over K/V
// viewed as pages of C tokens (src/ops/block_sparse/bsr_paged_plan.h), so the scheduler balances
// by stored blocks, splits long rows as split-KV and merges them with ⊕; causal and element
// masks become a per-row custom mask (none where the kernel's own causal mask is exact).
//
//   BlockSparseConfig cfg{.max_rows = 32768, .max_block_rows = 256, .max_blocks = 8192};
//   DeviceBuffer ws(BlockSparseAttention::workspace_bytes(cfg));
//   BlockSparseAttention bsa(cfg, ws.data(), ws.size());
//   bsa.plan(layout, {.num_qo_heads = 32, .num_kv_heads = 8, .head_dim = 128}, {}, stream);
//   bsa.run(q, k, v, out, lse, stream);
struct BlockSparseConfig {
  int64_t max_rows = 32768;       // M per plan, at most
  int64_t max_block_rows = 4096;  // M / R per plan, at most
  int64_t max_blocks = 1 << 20;   // stored blocks (indptr[M / R]) per plan, at most
  int64_t max_mask_bytes = 0;     // block_sparse_mask_bytes of a plan, at most (0: no masks)
  int num_qo_heads = 32;          // at most
  int head_dim = 128;             // at most
  int device = 0;
  int ctas_per_sm = 0;  // the prefill op's persistent CTAs per SM (0: BatchPrefillConfig's)
};

class BlockSparseAttention {
 public:
  static size_t workspace_bytes(const BlockSparseConfig& cfg);
  // `workspace`: device memory of at least workspace_bytes(cfg) bytes, owned by the caller.
  BlockSparseAttention(const BlockSparseConfig& cfg, void* workspace, size_t workspace_bytes);
  ~BlockSparseAttention();
  BlockSparseAttention(const BlockSparseAttention&) = delete;
  BlockSparseAttention& operator=(const BlockSparseAttention&) = delete;

  // Checks and maps the layout (host arrays, read during plan() only), compiles the kernel on
  // first use, and copies the plan to the workspace asynchronously on `stream`. opts.sinks and
  // opts.kv_scale's tensors must be on the device.
  void plan(const BlockSparseLayout& layout, const AttentionShape& shape,
            const BlockSparseOptions& opts = {}, Stream stream = nullptr);
  // q [M, H_qo, D]; k, v [N, H_kv, D] (tokens at one stride, 16-byte multiples); out
  // [M, H_qo, D]; lse f32 [M, H_qo] or undefined. An fp8 k, v is dequantized with the plan's
  // opts.kv_scale, or with `kv_scale` (on k's device) in the second form.
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
           const TensorView& lse, Stream stream = nullptr);
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
           const TensorView& lse, const KVScale& kv_scale, Stream stream = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Variable block sparsity per KV head on the GPU (FlashInfer's
// VariableBlockSparseAttentionWrapper): each KV head's layout runs as a batch prefill of its own
// over that head's keys as pages of one token (src/ops/block_sparse/variable_paged_plan.h), its
// query heads read through a strided view of q, so q and k may be laid out by token
// ([M, H_qo, D], [N, H_kv, D]) or by head (FlashInfer's [H_qo, M, D], [H_kv, N, D], passed as
// transposed views): any strides with 16-byte-multiple rows. Causal masks become custom masks.
//
//   VariableBlockSparseConfig cfg{.max_rows = 8192, .max_block_rows = 64, .max_kv_ids = 1 << 20};
//   DeviceBuffer ws(VariableBlockSparseAttention::workspace_bytes(cfg));
//   VariableBlockSparseAttention vbsa(cfg, ws.data(), ws.size());
//   vbsa.plan(layout, {.num_qo_heads = 32, .num_kv_heads = 8, .head_dim = 128}, {}, stream);
//   vbsa.run(q, k, v, out, lse, stream);
struct VariableBlockSparseConfig {
  int64_t max_rows = 32768;       // M per plan, at most
  int64_t max_block_rows = 4096;  // MB per plan, at most
  // Per KV head: the gathered key tokens summed over its block rows (sum over a, b of
  // block_mask_map[h][a][b] x block_col_sz[h][b], less what causal drops), at most.
  int64_t max_kv_ids = 1 << 22;
  int64_t max_mask_bytes = 0;  // per KV head: its causal mask (rows x gathered keys bits)
  int num_qo_heads = 32;       // at most
  int num_kv_heads = 8;        // at most
  int head_dim = 128;          // at most
  int device = 0;
};

// What a plan of `l` needs of a VariableBlockSparseConfig: the most gathered key tokens and
// causal-mask bytes of any one KV head (max_kv_ids, max_mask_bytes). Checks `l`.
struct VariableBlockSparseNeeds {
  int64_t kv_ids = 0, mask_bytes = 0;
};
VariableBlockSparseNeeds variable_block_sparse_needs(const VariableBlockSparseLayout& l,
                                                     bool causal);

class VariableBlockSparseAttention {
 public:
  // The workspace that never limits split-KV, and the least one may have (each KV head's share
  // holds its prefill plan arrays and page ids; plans then split KV into what fits).
  static size_t workspace_bytes(const VariableBlockSparseConfig& cfg);
  static size_t min_workspace_bytes(const VariableBlockSparseConfig& cfg);
  // `workspace`: device memory of at least min_workspace_bytes(cfg) bytes, owned by the caller,
  // shared equally among the KV heads.
  VariableBlockSparseAttention(const VariableBlockSparseConfig& cfg, void* workspace,
                               size_t workspace_bytes);
  ~VariableBlockSparseAttention();
  VariableBlockSparseAttention(const VariableBlockSparseAttention&) = delete;
  VariableBlockSparseAttention& operator=(const VariableBlockSparseAttention&) = delete;

  // layout.num_kv_heads must equal shape.num_kv_heads. Host arrays, read during plan() only.
  void plan(const VariableBlockSparseLayout& layout, const AttentionShape& shape,
            const BlockSparseOptions& opts = {}, Stream stream = nullptr);
  // q [M, H_qo, D], k, v [N, H_kv, D], out [M, H_qo, D] (any strides with 16-byte-multiple
  // rows); lse f32 [M, H_qo] (contiguous heads) or undefined.
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
           const TensorView& lse, Stream stream = nullptr);
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
           const TensorView& lse, const KVScale& kv_scale, Stream stream = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Sparse-KV decode (Quest-style selection) needs no op of its own: BatchDecode attends to the
// pages its page table names, so a selection of pages is a page table (plan with each request's
// number of selected pages; a CUDA graph replays with new ids written into the same device
// kv_indices, counts unchanged). A selection of single tokens is a page table over this view of
// the cache: k [pages, page_size, H, D] (NHD) as [pages * page_size, 1, H, D], token s of page p
// being view page p * page_size + s. NHD only (an HND cache's tokens are not evenly strided
// across pages): anything else is a named error.
TensorView token_pages(const TensorView& paged_k, KVLayout layout);

// Selections per request AND KV head (Quest selects per KV head): a view of the cache with one KV
// head, so that (request r, KV head h) is request r * H + h of a decode batch with the group's
// num_qo_heads / H query heads and 1 KV head; q [B, H_qo, D] and out are then the same memory as
// [B * H, H_qo / H, D] (contiguous heads). The view's pages:
// - NHD [P, S, H, D] -> [P * S * H, 1, 1, D]: page (p * S + s) * H + h is token s of page p in
//   head h (select tokens; whole pages as their S tokens; plan with page_size 1).
// - HND [P, H, S, D] -> [P * H, 1, S, D] (HND): page p * H + h is page p of head h (select pages;
//   plan with page_size S).
// The cache's heads must be evenly strided (a contiguous cache is): else a named error.
TensorView head_pages(const TensorView& paged_k, KVLayout layout);

// Validate a layout; each failure is a flashkv::Error naming the argument and what was expected
// (R or C < 1, M not divisible by R, indptr not monotone or not ending at the block count, a
// block column out of range or repeated in a row, row / column sizes that do not sum to M / N).
void check_block_sparse_layout(const BlockSparseLayout& l);
void check_variable_block_sparse_layout(const VariableBlockSparseLayout& l);

}  // namespace flashkv
