#include "ops/block_sparse/bsr_paged_plan.h"

#include "flashkv/variants.h"

namespace flashkv::ops {}  // namespace flashkv::ops

namespace flashkv {

int64_t block_sparse_mask_bytes(const BlockSparseLayout& l, bool causal) {
  check_block_sparse_layout(l);
  if (!causal && l.block_mask == nullptr) return 0;
  int64_t bytes = 0;
  for (int64_t i = 0; i < l.num_block_rows(); ++i)
    bytes += (static_cast<int64_t>(l.R) * (l.indptr[i + 1] - l.indptr[i]) * l.C + 7) / 8;
  return bytes;
}

}  // namespace flashkv

namespace flashkv::ops {

BsrPagedPlan bsr_as_paged_prefill(const BlockSparseLayout& l, bool causal) {
  check_block_sparse_layout(l);
  const int64_t rows = l.num_block_rows();
  BsrPagedPlan p;
  p.page_size = l.C;
  p.kv_indptr.assign(l.indptr, l.indptr + rows + 1);
  p.kv_indices.assign(l.indices, l.indices + l.indptr[rows]);
  for (int64_t i = 0; i <= rows; ++i) p.qo_indptr.push_back(static_cast<int32_t>(i * l.R));
  for (int64_t i = 0; i < rows; ++i)
    p.kv_last_page_len.push_back(l.indptr[i + 1] > l.indptr[i] ? l.C : 0);
  if (!causal && l.block_mask == nullptr) return p;

  // Request i's mask: row r (query m = i R + r) over its gathered keys, stored block t's key c at
  // column (t - indptr[i]) C + c: the element mask, and key n <= m + N - M when causal.
  std::vector<bool> bits;
  std::vector<int64_t> qo_lens, kv_lens;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t nnz = l.indptr[i + 1] - l.indptr[i];
    qo_lens.push_back(l.R);
    kv_lens.push_back(nnz * l.C);
    for (int64_t r = 0; r < l.R; ++r) {
      const int64_t m = i * l.R + r;
      for (int64_t t = l.indptr[i]; t < l.indptr[i + 1]; ++t)
        for (int64_t c = 0; c < l.C; ++c) {
          const int64_t n = static_cast<int64_t>(l.indices[t]) * l.C + c;
          const bool elem = l.block_mask == nullptr || l.block_mask[(t * l.R + r) * l.C + c] != 0;
          bits.push_back(elem && (!causal || n <= m + l.N - l.M));
        }
    }
  }
  p.mask = pack_custom_mask(bits, qo_lens, kv_lens, p.mask_indptr);
  return p;
}

}  // namespace flashkv::ops
