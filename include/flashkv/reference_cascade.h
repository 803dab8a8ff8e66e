// The CPU reference of multi-level cascade (shared-prefix) attention: the oracle for a
// MultiLevelCascade GPU op, and the proof that a cascade computes plain attention.
//
// A cascade is L levels of page tables over one paged cache (FlashInfer's multi-level cascade
// arrays). Level l splits q's rows into consecutive groups by qo_indptr[l]; group g's rows attend
// to the pages kv_indptr[l][g] .. kv_indptr[l][g+1] of kv_indices[l]. Levels 0 .. L-2 hold shared
// prefixes and are attended without a mask (every row of a group sees the whole prefix). The
// last level holds one group per request (its own suffix) and is attended as the plain op would
// be: with opts.causal, aligned to the end of the suffix, which is the end of the request's KV.
// Each row's L states are merged with ⊕ in double and rounded once into out/lse, so the result
// equals batch_prefill_paged / batch_decode over the concatenated page lists up to double
// rounding. A group with no pages contributes (0, -inf), the identity of ⊕.
//
// q's rows are in cascade order: the requests of every group are consecutive (the scheduler's
// detect_shared_prefixes() gives that order). With opts.causal, a row that attends a non-empty
// prefix must see that prefix whole: every last-level group needs suffix_len >= qo_len - 1, else
// Error (a causal query that starts inside the shared prefix cannot use it unmasked).
#pragma once

#include <span>

#include "flashkv/attention.h"
#include "flashkv/paged_kv.h"
#include "flashkv/tensor.h"

namespace flashkv::reference {

// The index arrays of one cascade level (host i32 tensors).
struct CascadeLevelView {
  TensorView qo_indptr;         // [num_groups + 1] over q's rows, ends at q.size(0)
  TensorView kv_indptr;         // [num_groups + 1] into kv_indices
  TensorView kv_indices;        // page ids into k / v
  TensorView kv_last_page_len;  // [num_groups], in [1, page_size] for groups with pages
};

// q[nnz_qo, H_qo, D]; k, v as in PagedKVCache (NHD [pages, page_size, H_kv, D] or HND), with
// opts.kv_scale as the cache's dequantization scales (fp8); out[nnz_qo, H_qo, D]; lse f32[nnz_qo,
// H_qo] or undefined. One level is plain batch prefill.
void multi_level_cascade(const TensorView& q, const TensorView& k, const TensorView& v,
                         KVLayout layout, std::span<const CascadeLevelView> levels,
                         const TensorView& out, const TensorView& lse,
                         const AttentionOptions& opts = {});

}  // namespace flashkv::reference
