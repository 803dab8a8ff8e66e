// Helpers of the quantized KV format tests (tests/cpu/test_kv_quant*.cpp): a paged cache in one
// of the formats of kv_quant.h, made by quantizing an f32 cache's pools with the host quantizer,
// beside an f32 cache holding exactly the values it dequantizes to.
#pragma once

#include <string>
#include <vector>

#include "common/test_util.h"
#include "flashkv/host_tensor.h"
#include "flashkv/kv_quant.h"
#include "flashkv/kv_quantize.h"
#include "flashkv/paged_kv.h"

namespace flashkv::test {

// The scale dtype a test uses for a format (f32 for the fp8 and INT4 formats unless given).
inline DType default_scale_dtype(const KVQuantFormat& f) {
  return f.quant == KVQuant::kNvfp4 ? DType::e4m3 : DType::f32;
}

// One quantized copy of a cache: values, scales and zeros of k and v, the cache over them, and
// an f32 cache (same page table) whose k and v are the dequantized values.
struct QuantizedCache {
  QuantizedCache() = default;
  QuantizedCache(QuantizedCache&&) = default;
  QuantizedCache& operator=(QuantizedCache&&) = default;
  QuantizedCache(const QuantizedCache&) = delete;
  QuantizedCache& operator=(const QuantizedCache&) = delete;

  PagedCacheHost src;  // the f32 cache that was quantized
  HostTensor kq, vq, ks, vs, kz, vz;
  HostTensor kd, vd;  // dequantized (f32)
  PagedKVCache cache, dequantized;
};

// The value tensor's shape for `shape` (the cache's) in format `f`: the last dim halves when
// packed.
inline std::vector<int64_t> value_shape(std::vector<int64_t> shape, const KVQuantFormat& f) {
  if (f.packed()) shape.back() /= 2;
  return shape;
}

inline std::vector<int64_t> group_shape(std::vector<int64_t> shape, const KVQuantFormat& f) {
  shape.back() = f.groups(static_cast<int>(shape.back()));
  return shape;
}

// Quantizes a fresh f32 cache of `kv_lens` (make_paged_cache's arguments) into format `f` with
// value dtype `value_dtype` (e4m3 / e5m2 / u8), scale dtype `scale_dtype`, per-tensor factor
// `tensor_scale` (the KVScale float of both k and v).
inline QuantizedCache make_quantized_cache(const std::vector<int64_t>& kv_lens, int page_size,
                                           int num_kv_heads, int head_dim, KVLayout layout,
                                           const KVQuantFormat& f, DType value_dtype,
                                           DType scale_dtype, float tensor_scale, uint64_t seed) {
  QuantizedCache q;
  q.src = make_paged_cache(kv_lens, page_size, num_kv_heads, head_dim, layout, DType::f32, seed);
  const std::vector<int64_t> shape = q.src.k.shape();
  for (auto [x, vals, scales, zeros, deq] : {std::tuple{&q.src.k, &q.kq, &q.ks, &q.kz, &q.kd},
                                             std::tuple{&q.src.v, &q.vq, &q.vs, &q.vz, &q.vd}}) {
    *vals = HostTensor(value_dtype, value_shape(shape, f));
    *scales = HostTensor(scale_dtype, group_shape(shape, f));
    if (f.has_zero_point()) *zeros = HostTensor(scale_dtype, group_shape(shape, f));
    *deq = HostTensor(DType::f32, shape);
    const TensorView zv = f.has_zero_point() ? zeros->view() : TensorView();
    quantize_kv(x->view(), f, tensor_scale, vals->view(), scales->view(), zv);
    dequantize_kv(vals->view(), scales->view(), zv, f, tensor_scale, deq->view());
  }
  q.cache = q.src.cache;
  q.cache.k = q.kq.view();
  q.cache.v = q.vq.view();
  q.cache.scale = {.k = tensor_scale, .v = tensor_scale, .format = f};
  q.cache.scale.k_group_scale = q.ks.view();
  q.cache.scale.v_group_scale = q.vs.view();
  if (f.has_zero_point()) {
    q.cache.scale.k_zero = q.kz.view();
    q.cache.scale.v_zero = q.vz.view();
  }
  q.dequantized = q.src.cache;
  q.dequantized.k = q.kd.view();
  q.dequantized.v = q.vd.view();
  return q;
}

}  // namespace flashkv::test
