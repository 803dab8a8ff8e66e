// The prefill kernel's runtime parameters: one flat struct of pointers and element strides,
// passed by value (the kernel takes it __grid_constant__: the variant block is read in place).
// Shared with the host (src/ops/prefill/prefill_core.cpp); includes only the plan layout and the
// variant argument block.
#pragma once

#include "attention/prefill/prefill_plan.cuh"
#include "kv/kv_scale.cuh"
#include "primitives/tma_desc.cuh"
#include "variants/variant_args.cuh"

namespace flashkv {

// Where KV comes from; a template parameter of the kernel, so the loaders carry no branches.
enum PrefillKVSource : int {
  kRaggedKV = 0,     // contiguous rows: token page_base + position
  kPagedPow2KV = 1,  // a page table, page_size a power of two (shift and mask)
  kPagedKV = 2,      // a page table, any page size (an integer division per load)
};

struct PrefillParams {
  const void* q;          // [nnz_qo, H_qo, D], request r's rows start at work.q_base
  const void* k;          // paged: page, token, head addressed with the strides below;
  const void* v;          // ragged: token (work.page_base + position), head
  const int* kv_indices;  // paged: page ids, request r's start at work.page_base; ragged: null
  void* out;              // [nnz_qo, H_qo, D]
  float* lse;             // [nnz_qo, H_qo] natural-log LSE, or nullptr
  long long q_stride_n, q_stride_h;  // elements
  long long o_stride_n, o_stride_h;
  long long lse_stride_n;
  long long page_stride;          // of k and v, elements
  int token_stride, head_stride;  // of k and v, elements (< 2^31, checked by the host)
  int num_pages;                  // paged: ids outside [0, num_pages) are read as zeros
  int page_size;                  // paged: tokens per page; 0: ragged KV
  int page_shift;       // log2(page_size) when it is a power of two, else -1: the loaders then
                        // split positions with shifts, not an integer division per 16 bytes
  int group;            // query heads per KV head, fused into the rows of a query tile
  int causal;           // 1: query token i sees KV positions <= work.diag + i
  float sm_scale_log2;  // sm_scale * log2(e): logits are kept in base 2
  PrefillPlanPtrs plan;
  VariantArgsBlock variant;  // the variant's Args (kernels/variants/variant.cuh), read in place
  // kv_tma = 1: the warp-specialized Hopper kernel (prefill_hopper_ws.cuh), all loads by TMA.
  // K and V as 4-D tensors (head_dim, token in page, head, page) (ragged: (head_dim, token, head,
  // 1)), boxes of 64 columns x 16 tokens (k_tma, v_tma) and x 1 token (k1_tma, v1_tma: the end of
  // an item); q as (head_dim, head, token, 1), boxes of 64 columns x group heads x q_tma_tokens
  // tokens (a query tile's rows). The host sets it for ragged KV and pages of at least 16 tokens (a
  // power of two), where every work item starts on a KV tile.
  int kv_tma;
  int q_tma_tokens;
  TmaDesc k_tma, v_tma, k1_tma, v1_tma, q_tma;
  KVScaleParams scale;  // an fp8 cache's dequantization scales (16-bit KV: unused)
};

}  // namespace flashkv
