// One append_paged_kv_cache configuration: a paged cache (with spare pages no request owns) before
// and after appending append_lens[i] new tokens to request i, on the host (the CPU reference) and
// on the GPU, so tests can compare the whole cache bitwise.
#pragma once

#include <string>
#include <vector>

#include "common/gpu_util.h"

namespace flashkv::test {

struct AppendCase {
  std::vector<int64_t> old_lens, append_lens;  // per request: cached before, new tokens
  int page_size = 16, num_kv_heads = 8, head_dim = 128;
  KVLayout layout = KVLayout::NHD;
  bool interleaved = false;
  DType dtype = DType::f16;
  // Elements of padding after each new token's head row (0: contiguous append_key/value); not a
  // multiple of 16 bytes forces the element-by-element path.
  int row_pad = 0;
  uint64_t seed = 1;
  std::string str() const;
};

// The host side of a case: page table after the append, cache storage, new rows, and the
// batch_indices / positions FlashInfer's get_batch_indices_positions gives.
struct AppendInputs {
  KVLayout layout = KVLayout::NHD;
  int64_t pad = 0;  // AppendCase::row_pad
  int64_t num_pages = 0, nnz = 0;
  HostTensor indptr, indices, last_page_len;  // i32 page table, after the append
  HostTensor append_indptr, seq_lens;         // i32 [batch + 1], [batch]
  HostTensor batch_indices, positions;        // i32 [nnz]
  HostTensor k, v, kv;                        // cache storage: k/v, or kv when interleaved
  HostTensor new_k, new_v;                    // [nnz, H, D + row_pad]
  HostTensor& storage(bool is_v) { return kv.numel() > 0 ? kv : (is_v ? v : k); }
  // The cache over this object's host storage.
  PagedKVCache host_cache() const;
  // append_key / append_value views (host) of new_k / new_v without their padding.
  TensorView key_view() const;
  TensorView value_view() const;
};
AppendInputs make_append_inputs(const AppendCase& c);

// The case's cache and rows on the device.
struct AppendDevice {
  DeviceTensor k, v, kv, indptr, indices, last_page_len, new_k, new_v, batch_indices, positions;
  PagedKVCache cache;
  TensorView key, value;  // [nnz, H, D] views of new_k / new_v
};
AppendDevice to_device(const AppendInputs& in, const AppendCase& c);

// Copies the device cache storage back into host tensors shaped like `in`'s.
std::vector<HostTensor> cache_to_host(const AppendDevice& d, const AppendInputs& in);
// in.k / in.v (or in.kv) as the list cache_to_host returns.
std::vector<const HostTensor*> cache_storage(const AppendInputs& in);

// Runs the reference on `in` (its cache is updated in place) and the GPU append on a device copy
// of the cache as it was; expects both caches bitwise equal.
void expect_append_matches_reference(const AppendCase& c);

}  // namespace flashkv::test
