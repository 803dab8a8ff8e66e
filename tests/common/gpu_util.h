// GPU test helpers: a fixture that skips cleanly without a device, and device copies of host
// tensors and paged caches.
#pragma once

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "flashkv/runtime.h"

namespace flashkv::test {

// Derive GPU tests from this: they skip (not fail) on machines without a CUDA device.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  }
};

// A device tensor with the same shape as a host tensor.
struct DeviceTensor {
  DeviceBuffer buf;
  TensorView view;
};
DeviceTensor to_device(const HostTensor& h, int device = 0);
// Device tensor of the host tensor's shape filled with NaN bytes (0xff), so unwritten elements
// are caught.
DeviceTensor poisoned_like(const HostTensor& h, int device = 0);
// Copies a device tensor back into `h` (same size).
void to_host(const DeviceTensor& d, HostTensor& h);
// Success iff every byte of d's view is still `byte` (0xff: the poison of poisoned_like), so a
// call that must write nothing did not write even one element; the failure names the first
// byte that changed.
::testing::AssertionResult all_bytes_are(const DeviceTensor& d, uint8_t byte = 0xff);

// The paged cache on the device: k/v (or the interleaved kv) and the index tensors.
struct DeviceCache {
  DeviceTensor k, v, kv, indptr, indices, last_page_len;
  DeviceTensor k_scale, v_scale;  // the cache's scale tensors, when it has them
  PagedKVCache cache;
};
DeviceCache to_device(const PagedCacheHost& h, int device = 0);

// How a test scales an fp8 cache (attention.h: KVScale): the host factors, and scale tensors
// (tensor 0: none; 1: f32 [1]; 2: f32 [num_kv_heads], per KV head) of values drawn from `seed`
// in [0.5, 2).
struct KVScaleCase {
  float k = 1.0f, v = 1.0f;
  int tensor = 0;
  std::string str() const;  // "" for the identity
};
// Sets h.cache.scale (host tensors, kept in h.k_scale / h.v_scale).
void set_kv_scale(PagedCacheHost& h, const KVScaleCase& c, uint64_t seed);

}  // namespace flashkv::test
