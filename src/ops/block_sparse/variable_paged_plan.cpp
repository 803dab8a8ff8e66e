#include "ops/block_sparse/variable_paged_plan.h"

#include <algorithm>
#include <vector>

#include "flashkv/variants.h"

namespace flashkv::ops {

BsrPagedPlan variable_head_as_paged_prefill(const VariableBlockSparseLayout& l, int h,
                                            bool causal) {
  const int32_t* row_sz = l.block_row_sz + static_cast<int64_t>(h) * l.MB;
  const int32_t* col_sz = l.block_col_sz + static_cast<int64_t>(h) * l.NB;
  const uint8_t* map = l.block_mask_map + static_cast<int64_t>(h) * l.MB * l.NB;
  std::vector<int64_t> col_start(l.NB + 1, 0);
  for (int64_t b = 0; b < l.NB; ++b) col_start[b + 1] = col_start[b] + col_sz[b];
  const int64_t shift = l.N - l.M;

  BsrPagedPlan p;
  p.page_size = 1;
  p.kv_indptr.push_back(0);
  p.qo_indptr.push_back(0);
  std::vector<int64_t> qo_lens, kv_lens;
  std::vector<std::pair<int64_t, int64_t>> rows_of;  // first query row and count, per request
  bool partial = false;  // some kept token is hidden from some row of its request
  int64_t row0 = 0;
  for (int64_t a = 0; a < l.MB; ++a) {
    const int64_t rs = row_sz[a];
    if (rs == 0) continue;
    const int64_t first_bound = row0 + shift, last_bound = row0 + rs - 1 + shift;
    const size_t before = p.kv_indices.size();
    for (int64_t b = 0; b < l.NB; ++b) {
      if (map[a * l.NB + b] == 0) continue;
      for (int64_t n = col_start[b]; n < col_start[b + 1]; ++n) {
        if (causal && n > last_bound) break;  // no row of this request sees n or later keys
        partial = partial || (causal && n > first_bound);
        p.kv_indices.push_back(static_cast<int32_t>(n));
      }
    }
    const int64_t kv = static_cast<int64_t>(p.kv_indices.size() - before);
    p.kv_indptr.push_back(static_cast<int32_t>(p.kv_indices.size()));
    p.kv_last_page_len.push_back(kv > 0 ? 1 : 0);
    row0 += rs;
    p.qo_indptr.push_back(static_cast<int32_t>(row0));
    qo_lens.push_back(rs);
    kv_lens.push_back(kv);
    rows_of.emplace_back(row0 - rs, rs);
  }
  if (!partial) return p;
  // Request i's mask: row r (query m) over its gathered tokens n: n <= m + N - M.
  std::vector<bool> bits;
  for (size_t i = 0; i < rows_of.size(); ++i)
    for (int64_t r = 0; r < rows_of[i].second; ++r) {
      const int64_t m = rows_of[i].first + r;
      for (int32_t t = p.kv_indptr[i]; t < p.kv_indptr[i + 1]; ++t)
        bits.push_back(p.kv_indices[t] <= m + shift);
    }
  p.mask = pack_custom_mask(bits, qo_lens, kv_lens, p.mask_indptr);
  return p;
}

}  // namespace flashkv::ops

namespace flashkv {

VariableBlockSparseNeeds variable_block_sparse_needs(const VariableBlockSparseLayout& l,
                                                     bool causal) {
  check_variable_block_sparse_layout(l);
  VariableBlockSparseNeeds n;
  for (int h = 0; h < l.num_kv_heads; ++h) {
    const ops::BsrPagedPlan p = ops::variable_head_as_paged_prefill(l, h, causal);
    n.kv_ids = std::max(n.kv_ids, static_cast<int64_t>(p.kv_indices.size()));
    n.mask_bytes = std::max(n.mask_bytes, static_cast<int64_t>(p.mask.size()));
  }
  return n;
}

}  // namespace flashkv
