// Inputs of the CLI's checks against the CPU reference (`flashkv verify`, `flashkv fuzz`): device
// copies of host tensors, and random paged caches with shuffled pages.
#pragma once

#include <cstdint>
#include <vector>

#include "flashkv/host_tensor.h"
#include "flashkv/paged_kv.h"
#include "flashkv/runtime.h"

namespace flashkv::cli {

// A contiguous device copy of `h` in a buffer appended to `keep` (which owns it; at least 16
// bytes, so an empty tensor still has an address).
TensorView to_gpu(const HostTensor& h, std::vector<DeviceBuffer>& keep);

// A random paged cache over `lens` with shuffled pages: host tensors, the host page table, and
// its upload (the GPU copy's indptr / last_page_len views only carry shapes, as the planned ops
// read those from plan(), unless `page_table` asks for them: the append reads them). NHD [pages,
// page, Hkv, D] or HND [pages, Hkv, page, D]; `kv_dtype` may be fp8.
struct RandomPagedCache {
  std::vector<int32_t> indptr{0}, last, idx;
  HostTensor k, v;
  PagedKVCache host;

  RandomPagedCache(const std::vector<int64_t>& lens, int page, int Hkv, int D, DType kv_dtype,
                   uint64_t seed, KVLayout layout = KVLayout::NHD);
  RandomPagedCache(const RandomPagedCache&) = delete;  // `host` points into this object
  RandomPagedCache& operator=(const RandomPagedCache&) = delete;

  int64_t num_pages() const { return k.shape()[0]; }  // the storage's (>= the table's)
  // Element offset of (token t of request b, KV head h, dim 0) in k / v.
  int64_t offset(int64_t b, int64_t t, int64_t h) const;
  PagedKVCache to_device(std::vector<DeviceBuffer>& keep, bool page_table = false) const;
};

}  // namespace flashkv::cli
