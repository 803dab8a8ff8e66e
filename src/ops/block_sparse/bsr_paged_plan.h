// Block-sparse attention as batch prefill over a paged view of K/V (the FlashInfer paper's
// reading of KV as a block-sparse row matrix): block row i of a BlockSparseLayout is request i,
// its R query rows over the pages indices[indptr[i] .. indptr[i + 1]) of a cache whose page j is
// key tokens [j C, (j + 1) C), i.e. k [N, H_kv, D] viewed as [N / C, C, H_kv, D]. The page size C
// is any value (the prefill kernels take non-power-of-two pages). Causal positions and element
// masks are absolute, so they become a custom mask per request over its gathered keys.
//
// Host arrays only: what BlockSparseAttention's plan() uploads. The CPU tests run them through
// the paged reference and compare with reference::block_sparse_attention, so the mapping is
// checked without a GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "flashkv/block_sparse.h"

namespace flashkv::ops {

struct BsrPagedPlan {
  std::vector<int32_t> qo_indptr;         // [MB + 1]: i R
  std::vector<int32_t> kv_indptr;         // [MB + 1]: the layout's indptr (pages)
  std::vector<int32_t> kv_indices;        // the layout's indices (page ids)
  std::vector<int32_t> kv_last_page_len;  // [MB]: C, or 0 for an empty block row
  int page_size = 1;                      // C
  // With `causal` or an element mask: request i's R x (nnz_i C) bits over its gathered keys
  // (variants.h: FlashInfer's packed_custom_mask and mask_indptr); else empty.
  std::vector<uint8_t> mask;
  std::vector<int32_t> mask_indptr;
  bool has_mask() const { return !mask_indptr.empty(); }
};

// Checks `l` (check_block_sparse_layout) and maps it.
BsrPagedPlan bsr_as_paged_prefill(const BlockSparseLayout& l, bool causal);

}  // namespace flashkv::ops
