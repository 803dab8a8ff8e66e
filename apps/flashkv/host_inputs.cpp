#include "host_inputs.h"

#include <algorithm>

namespace flashkv::cli {

TensorView to_gpu(const HostTensor& h, std::vector<DeviceBuffer>& keep) {
  keep.emplace_back(std::max<size_t>(h.nbytes(), 16));
  if (h.nbytes() > 0) keep.back().copy_from_host(h.data(), h.nbytes());
  std::vector<int64_t> strides(h.shape().size());
  int64_t s = 1;
  for (int i = static_cast<int>(strides.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= h.shape()[i];
  }
  return TensorView(keep.back().data(), h.dtype(), static_cast<int>(strides.size()),
                    h.shape().data(), strides.data(), Device::cuda(0));
}

RandomPagedCache::RandomPagedCache(const std::vector<int64_t>& lens, int page, int Hkv, int D,
                                   DType kv_dtype, uint64_t seed, KVLayout layout) {
  for (int64_t l : lens) {
    const int64_t p = (l + page - 1) / page;
    indptr.push_back(static_cast<int32_t>(indptr.back() + p));
    last.push_back(static_cast<int32_t>(p ? l - (p - 1) * page : 0));
  }
  const int64_t pages = indptr.back(), B = static_cast<int64_t>(lens.size());
  idx.resize(pages);
  SplitMix64 rng(seed);
  for (int64_t i = 0; i < pages; ++i) idx[i] = static_cast<int32_t>(i);
  for (int64_t i = pages - 1; i > 0; --i) std::swap(idx[i], idx[rng.next() % (i + 1)]);
  // At least one page, which no request uses when all are empty: a cache has storage.
  const int64_t alloc = std::max<int64_t>(pages, 1);
  const std::vector<int64_t> shape = layout == KVLayout::NHD
                                         ? std::vector<int64_t>{alloc, page, Hkv, D}
                                         : std::vector<int64_t>{alloc, Hkv, page, D};
  k = HostTensor(kv_dtype, shape);
  v = HostTensor(kv_dtype, shape);
  k.fill_random(seed + 1);
  v.fill_random(seed + 2);
  host.k = k.view();
  host.v = v.view();
  host.layout = layout;
  host.indptr = TensorView(indptr.data(), DType::i32, {B + 1});
  host.indices = TensorView(idx.data(), DType::i32, {pages});
  host.last_page_len = TensorView(last.data(), DType::i32, {B});
}

int64_t RandomPagedCache::offset(int64_t b, int64_t t, int64_t h) const {
  const int64_t page = k.shape()[host.layout == KVLayout::NHD ? 1 : 2];
  const int64_t heads = k.shape()[host.layout == KVLayout::NHD ? 2 : 1], D = k.shape()[3];
  const int64_t pg = idx[indptr[b] + t / page], slot = t % page;
  return host.layout == KVLayout::NHD ? ((pg * page + slot) * heads + h) * D
                                      : ((pg * heads + h) * page + slot) * D;
}

PagedKVCache RandomPagedCache::to_device(std::vector<DeviceBuffer>& keep, bool page_table) const {
  const int64_t pages = indptr.back(), B = static_cast<int64_t>(last.size());
  PagedKVCache dc = host;
  dc.k = to_gpu(k, keep);
  dc.v = to_gpu(v, keep);
  HostTensor hidx(DType::i32, {pages});
  std::copy(idx.begin(), idx.end(), static_cast<int32_t*>(hidx.data()));
  dc.indices = to_gpu(hidx, keep);
  HostTensor hip(DType::i32, {B + 1}), hl(DType::i32, {B});
  if (page_table) {
    std::copy(indptr.begin(), indptr.end(), static_cast<int32_t*>(hip.data()));
    std::copy(last.begin(), last.end(), static_cast<int32_t*>(hl.data()));
  }
  dc.indptr = to_gpu(hip, keep);
  dc.last_page_len = to_gpu(hl, keep);
  return dc;
}

}  // namespace flashkv::cli
