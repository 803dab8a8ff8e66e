#include "common/gpu_util.h"

#include <cstdint>
#include <vector>

namespace flashkv::test {
namespace {
TensorView device_view(void* data, const HostTensor& h, int device) {
  std::vector<int64_t> strides(h.shape().size());
  int64_t s = 1;
  for (int i = static_cast<int>(h.shape().size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= h.shape()[i];
  }
  return TensorView(data, h.dtype(), static_cast<int>(h.shape().size()), h.shape().data(),
                    strides.data(), Device::cuda(device));
}
}  // namespace

DeviceTensor to_device(const HostTensor& h, int device) {
  DeviceTensor d{DeviceBuffer(std::max<size_t>(h.nbytes(), 16), device), {}};
  d.buf.copy_from_host(h.data(), h.nbytes());
  d.view = device_view(d.buf.data(), h, device);
  return d;
}

DeviceTensor poisoned_like(const HostTensor& h, int device) {
  DeviceTensor d{DeviceBuffer(std::max<size_t>(h.nbytes(), 16), device), {}};
  d.buf.fill_bytes(0xff);
  d.view = device_view(d.buf.data(), h, device);
  return d;
}

void to_host(const DeviceTensor& d, HostTensor& h) { d.buf.copy_to_host(h.data(), h.nbytes()); }

::testing::AssertionResult all_bytes_are(const DeviceTensor& d, uint8_t byte) {
  device_synchronize(d.buf.device());  // a launch that should not have happened has finished
  std::vector<uint8_t> bytes(d.view.nbytes());
  d.buf.copy_to_host(bytes.data(), bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != byte) {
      return ::testing::AssertionFailure()
             << d.view.str() << ": byte " << i << " of " << bytes.size() << " is "
             << static_cast<int>(bytes[i]) << ", expected " << static_cast<int>(byte);
    }
  }
  return ::testing::AssertionSuccess();
}

DeviceCache to_device(const PagedCacheHost& h, int device) {
  DeviceCache d;
  d.indptr = to_device(h.indptr, device);
  d.indices = to_device(h.indices, device);
  d.last_page_len = to_device(h.last_page_len, device);
  if (!h.kv.shape().empty()) {  // interleaved [num_pages, 2, ...]
    d.kv = to_device(h.kv, device);
    d.cache = PagedKVCache::interleaved(d.kv.view, h.cache.layout, d.indptr.view, d.indices.view,
                                        d.last_page_len.view);
  } else {
    d.k = to_device(h.k, device);
    d.v = to_device(h.v, device);
    d.cache = h.cache;
    d.cache.k = d.k.view;
    d.cache.v = d.v.view;
    d.cache.indptr = d.indptr.view;
    d.cache.indices = d.indices.view;
    d.cache.last_page_len = d.last_page_len.view;
  }
  d.cache.scale = h.cache.scale;
  if (h.cache.scale.k_tensor.defined()) {
    d.k_scale = to_device(h.k_scale, device);
    d.v_scale = to_device(h.v_scale, device);
    d.cache.scale.k_tensor = d.k_scale.view;
    d.cache.scale.v_tensor = d.v_scale.view;
  }
  return d;
}

std::string KVScaleCase::str() const {
  if (k == 1.0f && v == 1.0f && tensor == 0) return "";
  return " scale k " + std::to_string(k) + " v " + std::to_string(v) +
         (tensor == 1   ? " x tensor[1]"
          : tensor == 2 ? " x tensor[H_kv]"
                        : "");
}

void set_kv_scale(PagedCacheHost& h, const KVScaleCase& c, uint64_t seed) {
  KVScale s;
  s.k = c.k;
  s.v = c.v;
  if (c.tensor > 0) {
    const int64_t n = c.tensor == 1 ? 1 : h.cache.num_kv_heads();
    h.k_scale = HostTensor(DType::f32, {n});
    h.v_scale = HostTensor(DType::f32, {n});
    for (int64_t i = 0; i < n; ++i) {  // in [0.5, 2): powers of two would hide rounding
      h.k_scale.set(i,
                    0.5 + 1.5 * static_cast<double>((seed * 2654435761u + 97 * i) % 1000) / 1000);
      h.v_scale.set(i, 0.5 + 1.5 * static_cast<double>((seed * 40503u + 31 * i + 7) % 1000) / 1000);
    }
    s.k_tensor = h.k_scale.view();
    s.v_tensor = h.v_scale.view();
  }
  h.cache.scale = s;
}

}  // namespace flashkv::test
