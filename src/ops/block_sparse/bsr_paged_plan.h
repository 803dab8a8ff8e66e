// Block-sparse attention as batch prefill over a paged view of K/V (the FlashInfer paper's
// reading of KV as a block-sparse row matrix): block row i of a BlockSparseLayout is request i,
// its R query rows over the pages indices[indptr[i] .. indptr[i + 1]) of a cache whose page j is
// key tokens [j C, (j + 1) C), i.e. k [N, H_kv, D] viewed as [N / C, C, H_kv, D]. The page size C
// is any value (the prefill kernels take non-power-of-two pages). Causal positions and element
// masks are absolute, so they become a custom mask per request over its gathered keys, except
// where the kernel's own causal mask is exactly the positional one (BsrPagedPlan::causal).
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
  std::vector<int32_t> kv_indptr;         // [MB + 1]: pages per block row
  std::vector<int32_t> kv_indices;        // page ids: the kept block columns (see causal)
  std::vector<int32_t> kv_last_page_len;  // [MB]: C, or 0 for an empty block row
  int page_size = 1;                      // C
  // With `causal`: blocks no row of their block row sees are dropped; where the kernel's own
  // causal mask is the positional one (R == C, M == N, no element mask, each block row keeping
  // its diagonal block, placed last), `causal` is set and no custom mask is built.
  bool causal = false;
  // With `causal` (unless the kernel's does it) or an element mask: request i's R x (nnz_i C)
  // bits over its gathered keys
  // (variants.h: FlashInfer's packed_custom_mask and mask_indptr); else empty.
  std::vector<uint8_t> mask;
  std::vector<int32_t> mask_indptr;
  bool has_mask() const { return !mask_indptr.empty(); }
};

// Checks `l` (check_block_sparse_layout) and maps it.
BsrPagedPlan bsr_as_paged_prefill(const BlockSparseLayout& l, bool causal);

}  // namespace flashkv::ops
