#include "common/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace flashkv::test {
namespace {

// Independent streams from one user seed (k, v, page order, padding).
uint64_t derive_seed(uint64_t seed, uint64_t salt) {
  return SplitMix64(seed ^ (salt * 0xD1B54A32D192ED03ull)).next();
}

}  // namespace

HostTensor make_i32(const std::vector<int64_t>& values) {
  HostTensor t(DType::i32, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) t.set(i, static_cast<double>(values[i]));
  return t;
}

HostTensor make_tensor(DType dtype, std::vector<int64_t> shape, const std::vector<double>& values) {
  HostTensor t(dtype, std::move(shape));
  if (static_cast<int64_t>(values.size()) != t.numel()) {
    throw std::invalid_argument("make_tensor: value count does not match the shape");
  }
  for (size_t i = 0; i < values.size(); ++i) t.set(i, values[i]);
  return t;
}

PagedCacheHost make_paged_cache(const std::vector<int64_t>& kv_lens, int page_size,
                                int num_kv_heads, int head_dim, KVLayout layout, DType dtype,
                                uint64_t seed, bool shuffle_pages, bool interleaved,
                                bool nan_padding) {
  const int64_t batch = static_cast<int64_t>(kv_lens.size());
  PagedCacheHost c;
  c.kv_lens = kv_lens;

  // Page table: request i owns pages_i = ceil(len / page_size) consecutive entries of indices.
  std::vector<int64_t> indptr{0}, last_page_len, ragged_ptr{0};
  for (int64_t len : kv_lens) {
    const int64_t pages = (len + page_size - 1) / page_size;
    indptr.push_back(indptr.back() + pages);
    last_page_len.push_back(pages == 0 ? 0 : len - (pages - 1) * page_size);
    ragged_ptr.push_back(ragged_ptr.back() + len);
  }
  const int64_t num_pages = indptr.back();
  std::vector<int64_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  if (shuffle_pages) {
    SplitMix64 rng(derive_seed(seed, 3));
    for (int64_t i = num_pages - 1; i > 0; --i) {  // Fisher-Yates, portable unlike std::shuffle
      std::swap(perm[i], perm[rng.next() % static_cast<uint64_t>(i + 1)]);
    }
  }
  c.indptr = make_i32(indptr);
  c.indices = make_i32(perm);
  c.last_page_len = make_i32(last_page_len);
  c.kv_indptr = make_i32(ragged_ptr);

  // The logical KV, drawn in (token, head, dim) order so it is independent of the storage.
  const int64_t nnz = ragged_ptr.back();
  c.k_ragged = HostTensor(dtype, {nnz, num_kv_heads, head_dim});
  c.v_ragged = HostTensor(dtype, {nnz, num_kv_heads, head_dim});
  c.k_ragged.fill_random(derive_seed(seed, 1));
  c.v_ragged.fill_random(derive_seed(seed, 2));

  // Page slots past a request's last token get values too, drawn in (slot, head, dim) order
  // (NaN only when asked: a kernel that reads whole pages must keep them out of P·V).
  const int64_t num_pad = num_pages * page_size - nnz;
  HostTensor k_pad(dtype, {num_pad, num_kv_heads, head_dim});
  HostTensor v_pad(dtype, {num_pad, num_kv_heads, head_dim});
  if (nan_padding) {
    for (int64_t i = 0; i < k_pad.numel(); ++i) {
      k_pad.set(i, std::nan(""));
      v_pad.set(i, std::nan(""));
    }
  } else {
    k_pad.fill_random(derive_seed(seed, 4));
    v_pad.fill_random(derive_seed(seed, 5));
  }

  const bool nhd = layout == KVLayout::NHD;
  const std::vector<int64_t> page_shape =
      nhd ? std::vector<int64_t>{page_size, num_kv_heads, head_dim}
          : std::vector<int64_t>{num_kv_heads, page_size, head_dim};
  if (interleaved) {
    c.kv = HostTensor(dtype, {num_pages, 2, page_shape[0], page_shape[1], page_shape[2]});
    c.cache = PagedKVCache::interleaved(c.kv.view(), layout, c.indptr.view(), c.indices.view(),
                                        c.last_page_len.view());
  } else {
    c.k = HostTensor(dtype, {num_pages, page_shape[0], page_shape[1], page_shape[2]});
    c.v = HostTensor(dtype, c.k.shape());
    c.cache = PagedKVCache{.k = c.k.view(),
                           .v = c.v.view(),
                           .layout = layout,
                           .indptr = c.indptr.view(),
                           .indices = c.indices.view(),
                           .last_page_len = c.last_page_len.view()};
  }

  // Copy each (token, head) row of head_dim elements into its page slot through the cache's own
  // strides: the logical KV for the request's tokens, the padding for the slots after them.
  // Every view here comes from a contiguous HostTensor, so a row is contiguous (stride(3) == 1).
  const TensorView& k = c.cache.k;
  const TensorView& v = c.cache.v;
  const int tok_dim = nhd ? 1 : 2, head_dim_idx = nhd ? 2 : 1;
  const size_t elem = dtype_size(dtype), row_bytes = head_dim * elem;
  // Strides read once: TensorView::stride() formats an error message on every call.
  const int64_t k_s[3] = {k.stride(0), k.stride(tok_dim), k.stride(head_dim_idx)};
  const int64_t v_s[3] = {v.stride(0), v.stride(tok_dim), v.stride(head_dim_idx)};
  auto row = [&](const TensorView& t, const int64_t* s, int64_t page, int64_t slot, int h) {
    return static_cast<char*>(t.data()) + (page * s[0] + slot * s[1] + h * s[2]) * elem;
  };
  int64_t pad = 0;
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t t = 0; t < (indptr[i + 1] - indptr[i]) * page_size; ++t) {
      const int64_t page = perm[indptr[i] + t / page_size], slot = t % page_size;
      const bool token = t < kv_lens[i];
      const HostTensor& k_src = token ? c.k_ragged : k_pad;
      const HostTensor& v_src = token ? c.v_ragged : v_pad;
      const int64_t src_row = token ? ragged_ptr[i] + t : pad++;
      for (int h = 0; h < num_kv_heads; ++h) {
        const size_t src = ((src_row * num_kv_heads + h) * head_dim) * elem;
        std::memcpy(row(k, k_s, page, slot, h), static_cast<const char*>(k_src.data()) + src,
                    row_bytes);
        std::memcpy(row(v, v_s, page, slot, h), static_cast<const char*>(v_src.data()) + src,
                    row_bytes);
      }
    }
  }
  return c;
}

::testing::AssertionResult matches_reference(const std::vector<double>& out,
                                             const std::vector<double>& ref,
                                             const std::vector<double>& ref_lowp,
                                             DType compute_dtype) {
  const ToleranceCheck r = check_tolerance(out, ref, ref_lowp, tolerance_floor(compute_dtype));
  if (r.pass) return ::testing::AssertionSuccess() << r.str();
  return ::testing::AssertionFailure() << r.str();
}

}  // namespace flashkv::test
