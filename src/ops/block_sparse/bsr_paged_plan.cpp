#include "ops/block_sparse/bsr_paged_plan.h"

#include <algorithm>
#include <vector>

#include "flashkv/variants.h"

namespace flashkv::ops {}  // namespace flashkv::ops

namespace flashkv {

int64_t block_sparse_mask_bytes(const BlockSparseLayout& l, bool causal) {
  return static_cast<int64_t>(ops::bsr_as_paged_prefill(l, causal).mask.size());
}

}  // namespace flashkv

namespace flashkv::ops {

BsrPagedPlan bsr_as_paged_prefill(const BlockSparseLayout& l, bool causal) {
  check_block_sparse_layout(l);
  const int64_t rows = l.num_block_rows();
  const int64_t shift = l.N - l.M;  // causal: key n is visible to row m iff n <= m + shift
  // The stored blocks each block row keeps (positions t in l.indices): with `causal`, only those
  // some row of the block row sees (the block's first key within the last row's bound).
  std::vector<std::vector<int64_t>> kept(rows);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t t = l.indptr[i]; t < l.indptr[i + 1]; ++t)
      if (!causal || static_cast<int64_t>(l.indices[t]) * l.C <= (i + 1) * l.R - 1 + shift)
        kept[i].push_back(t);
  // The kernel's own causal mask, without a custom mask, where it is exactly the positional one:
  // R == C, M == N, no element mask, and every block row that keeps a block keeps its diagonal
  // block i. Sorted by column, the diagonal comes last; blocks before it are wholly visible, and
  // inside it key c is visible to row r iff c <= r: the kernel's rule for a request of R rows
  // over its gathered keys (aligned to their end). It also skips the tiles above the diagonal.
  bool kernel_causal = causal && l.R == l.C && l.M == l.N && l.block_mask == nullptr;
  for (int64_t i = 0; i < rows && kernel_causal; ++i) {
    std::sort(kept[i].begin(), kept[i].end(),
              [&](int64_t a, int64_t b) { return l.indices[a] < l.indices[b]; });
    kernel_causal = kept[i].empty() || l.indices[kept[i].back()] == i;
  }

  BsrPagedPlan p;
  p.page_size = l.C;
  p.causal = kernel_causal;
  p.kv_indptr.push_back(0);
  for (int64_t i = 0; i < rows; ++i) {
    p.qo_indptr.push_back(static_cast<int32_t>(i * l.R));
    for (int64_t t : kept[i]) p.kv_indices.push_back(l.indices[t]);
    p.kv_indptr.push_back(static_cast<int32_t>(p.kv_indices.size()));
    p.kv_last_page_len.push_back(kept[i].empty() ? 0 : l.C);
  }
  p.qo_indptr.push_back(static_cast<int32_t>(rows * l.R));
  if ((!causal || kernel_causal) && l.block_mask == nullptr) return p;

  // Request i's mask: row r (query m = i R + r) over its gathered keys, kept block t's key c at
  // column (its place among the kept) C + c: the element mask, and n <= m + N - M when causal.
  std::vector<bool> bits;
  std::vector<int64_t> qo_lens, kv_lens;
  for (int64_t i = 0; i < rows; ++i) {
    qo_lens.push_back(l.R);
    kv_lens.push_back(static_cast<int64_t>(kept[i].size()) * l.C);
    for (int64_t r = 0; r < l.R; ++r) {
      const int64_t m = i * l.R + r;
      for (int64_t t : kept[i])
        for (int64_t c = 0; c < l.C; ++c) {
          const int64_t n = static_cast<int64_t>(l.indices[t]) * l.C + c;
          const bool elem = l.block_mask == nullptr || l.block_mask[(t * l.R + r) * l.C + c] != 0;
          bits.push_back(elem && (!causal || n <= m + shift));
        }
    }
  }
  p.mask = pack_custom_mask(bits, qo_lens, kv_lens, p.mask_indptr);
  return p;
}

}  // namespace flashkv::ops
