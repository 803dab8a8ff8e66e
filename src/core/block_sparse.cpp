// Validation of the block-sparse layouts (flashkv/block_sparse.h): every host array is read once
// and every failure names the argument.
#include "flashkv/block_sparse.h"

#include <vector>

#include "flashkv/error.h"

namespace flashkv {

void check_block_sparse_layout(const BlockSparseLayout& l) {
  check(l.R >= 1, "BlockSparseLayout.R: expected query rows per block >= 1, got ", l.R);
  check(l.C >= 1, "BlockSparseLayout.C: expected key tokens per block >= 1, got ", l.C);
  check(l.M >= 0 && l.N >= 0, "BlockSparseLayout.M / N: expected >= 0, got M = ", l.M,
        ", N = ", l.N);
  check(l.M % l.R == 0, "BlockSparseLayout.M: ", l.M,
        " query rows are not a multiple of R = ", l.R);
  check(l.N % l.C == 0, "BlockSparseLayout.N: ", l.N,
        " key tokens are not a multiple of C = ", l.C);
  check(l.indptr != nullptr,
        "BlockSparseLayout.indptr: null (expected M / R + 1 = ", l.num_block_rows() + 1,
        " host int32 entries)");
  const int64_t rows = l.num_block_rows(), cols = l.num_block_cols();
  check(l.indptr[0] == 0, "BlockSparseLayout.indptr[0] must be 0, got ", l.indptr[0]);
  for (int64_t i = 1; i <= rows; ++i) {
    check(l.indptr[i] >= l.indptr[i - 1], "BlockSparseLayout.indptr must be non-decreasing, but ",
          "indptr[", i, "] = ", l.indptr[i], " < indptr[", i - 1, "] = ", l.indptr[i - 1]);
  }
  const int64_t nnz = l.indptr[rows];
  check(nnz == 0 || l.indices != nullptr, "BlockSparseLayout.indices: null with indptr[", rows,
        "] = ", nnz, " blocks");
  std::vector<int64_t> seen_in_row(cols, -1);  // the last block row that held each column
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t t = l.indptr[i]; t < l.indptr[i + 1]; ++t) {
      const int64_t j = l.indices[t];
      check(j >= 0 && j < cols, "BlockSparseLayout.indices[", t, "] = ", j, " (block row ", i,
            ") is outside [0, N / C = ", cols, ")");
      check(seen_in_row[j] != i, "BlockSparseLayout.indices[", t, "] = ", j,
            ": block column repeated in block row ", i, " (each block at most once per row)");
      seen_in_row[j] = i;
    }
  }
}

void check_variable_block_sparse_layout(const VariableBlockSparseLayout& l) {
  check(l.num_kv_heads >= 1, "VariableBlockSparseLayout.num_kv_heads: expected >= 1, got ",
        l.num_kv_heads);
  check(l.MB >= 0 && l.NB >= 0, "VariableBlockSparseLayout.MB / NB: expected >= 0, got MB = ", l.MB,
        ", NB = ", l.NB);
  check(l.M >= 0 && l.N >= 0, "VariableBlockSparseLayout.M / N: expected >= 0, got M = ", l.M,
        ", N = ", l.N);
  check(l.block_row_sz != nullptr && l.block_col_sz != nullptr,
        "VariableBlockSparseLayout.block_row_sz / block_col_sz: null (expected [num_kv_heads, MB] "
        "and [num_kv_heads, NB] host int32)");
  check(l.MB * l.NB == 0 || l.block_mask_map != nullptr,
        "VariableBlockSparseLayout.block_mask_map: null (expected [num_kv_heads, MB, NB] bytes)");
  const auto check_sizes = [](const int32_t* sz, int64_t n, int heads, int64_t total,
                              const char* name, const char* total_name) {
    for (int h = 0; h < heads; ++h) {
      int64_t sum = 0;
      for (int64_t b = 0; b < n; ++b) {
        const int64_t s = sz[h * n + b];
        check(s >= 0, "VariableBlockSparseLayout.", name, "[", h, "][", b, "] = ", s,
              ": expected >= 0");
        sum += s;
      }
      check(sum == total, "VariableBlockSparseLayout.", name, "[", h, "] sums to ", sum,
            "; expected ", total_name, " = ", total);
    }
  };
  check_sizes(l.block_row_sz, l.MB, l.num_kv_heads, l.M, "block_row_sz", "M");
  check_sizes(l.block_col_sz, l.NB, l.num_kv_heads, l.N, "block_col_sz", "N");
}

TensorView token_pages(const TensorView& k, KVLayout layout) {
  check_defined(k, "paged_kv.k");
  check_ndim(k, "paged_kv.k", 4);
  check(layout == KVLayout::NHD,
        "token_pages: expected an NHD cache ([pages, page_size, H, D]); an HND cache's tokens are "
        "not evenly strided across pages");
  const int64_t pages = k.size(0), page = k.size(1);
  check(pages <= 1 || page <= 1 || k.stride(0) == page * k.stride(1), "token_pages: paged_kv.k ",
        k.shape_str(), ": expected pages of tokens at one stride (page stride = page_size x token ",
        "stride, as a contiguous cache has), got strides ", k.stride(0), " and ", k.stride(1));
  const int64_t token_stride = page > 1 ? k.stride(1) : k.stride(0);
  const int64_t shape[4] = {pages * page, 1, k.size(2), k.size(3)};
  const int64_t strides[4] = {token_stride, token_stride, k.stride(2), k.stride(3)};
  return TensorView(k.data(), k.dtype(), 4, shape, strides, k.device());
}

TensorView head_pages(const TensorView& k, KVLayout layout) {
  check_defined(k, "paged_kv.k");
  check_ndim(k, "paged_kv.k", 4);
  const int64_t pages = k.size(0), d = k.size(3);
  if (layout == KVLayout::NHD) {
    const int64_t page = k.size(1), heads = k.size(2), hs = k.stride(2);
    check((page <= 1 || k.stride(1) == heads * hs) &&
              (pages <= 1 || k.stride(0) == page * heads * hs),
          "head_pages: paged_kv.k ", k.shape_str(), " (NHD): expected its heads evenly strided ",
          "(token stride = H x head stride, page stride = page_size x token stride, as a ",
          "contiguous cache has), got strides ", k.stride(0), ", ", k.stride(1), ", ", hs);
    const int64_t shape[4] = {pages * page * heads, 1, 1, d};
    const int64_t strides[4] = {hs, hs, hs, k.stride(3)};
    return TensorView(k.data(), k.dtype(), 4, shape, strides, k.device());
  }
  const int64_t heads = k.size(1), page = k.size(2), hs = k.stride(1);
  check(pages <= 1 || k.stride(0) == heads * hs, "head_pages: paged_kv.k ", k.shape_str(),
        " (HND): expected its heads evenly strided (page stride = H x head stride, as a ",
        "contiguous cache has), got strides ", k.stride(0), ", ", hs);
  const int64_t shape[4] = {pages * heads, 1, page, d};
  const int64_t strides[4] = {hs, hs, k.stride(2), k.stride(3)};
  return TensorView(k.data(), k.dtype(), 4, shape, strides, k.device());
}

}  // namespace flashkv
