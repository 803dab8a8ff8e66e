// DLPack arrays (nb::ndarray) as flashkv TensorViews, and flashkv::Error as Python exceptions.
//
// Any framework that speaks DLPack crosses here without a copy: NumPy, PyTorch, CuPy, JAX. The
// view keeps the array's dtype, shape, element strides and device (kDLCPU and kDLCUDAHost are
// host memory; kDLCUDA is Device::cuda(device_id)). Anything else raises TypeError naming the
// argument.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>

#include "flashkv/paged_kv.h"
#include "flashkv/runtime.h"
#include "flashkv/tensor.h"

namespace flashkv::python {

namespace nb = nanobind;

// Inputs may be read-only (a NumPy array from np.frombuffer, a JAX array); outputs may not.
using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

// The view of `a` (TypeError naming `name` for a dtype or device flashkv does not take).
TensorView view_of(const InArray& a, const char* name);
TensorView view_of(const OutArray& a, const char* name);
// An undefined view for None.
TensorView view_of(const std::optional<OutArray>& a, const char* name);
TensorView view_of(const std::optional<InArray>& a, const char* name);

// The dequantization scales of an fp8 KV cache (attention.h: KVScale), as the wrappers pass
// FlashInfer's k_scale / v_scale: a float each and, optionally, an f32 tensor each ([1] or
// [num_kv_heads], on the cache's device). Checked by the op that reads them.
KVScale kv_scale_of(float k, float v, const std::optional<InArray>& k_tensor,
                    const std::optional<InArray>& v_tensor);

// `s` with a quantized format's group scales (kv_quant.h): kv_format "" means none (and no
// arrays); otherwise a format name ("int4-g64", ...) and its pools, checked by the op.
KVScale with_group_scales(KVScale s, const std::string& kv_format,
                          const std::optional<InArray>& k_group_scale,
                          const std::optional<InArray>& v_group_scale,
                          const std::optional<InArray>& k_zero,
                          const std::optional<InArray>& v_zero);

// A paged cache of k/v arrays, its page table and its scales. KV: InArray for the attention ops
// (read), OutArray for the append (written).
template <class KV>
PagedKVCache paged_cache(const KV& k, const KV& v, const std::string& layout, const InArray& indptr,
                         const InArray& indices, const InArray& last_page_len,
                         const KVScale& scale = {}) {
  PagedKVCache kv;
  kv.k = view_of(k, "paged_kv.k");
  kv.v = view_of(v, "paged_kv.v");
  kv.layout = parse_kv_layout(layout);
  kv.indptr = view_of(indptr, "paged_kv.indptr");
  kv.indices = view_of(indices, "paged_kv.indices");
  kv.last_page_len = view_of(last_page_len, "paged_kv.last_page_len");
  kv.scale = scale;
  return kv;
}

// `a` (8-bit: a uint8 view of an fp8 array) as an fp8 array of `dtype` ("e4m3" / "e5m2"): the
// same memory, shape, strides and device, DLPack dtype code 10 / 12, keeping `a` alive. DLPack
// exports of float8 are refused by PyTorch releases that predate DLPack 1.1's float8 codes, and
// NumPy has no float8 (ml_dtypes' arrays do not export it): the wrappers pass every fp8 array
// through here (flashkv._C.fp8_view) as a uint8 view and its dtype.
nb::ndarray<> fp8_view(const InArray& a, const std::string& dtype);

// A host int32 index array of at least `min_len` entries, contiguous (the plan() arrays).
const int32_t* host_i32(const InArray& a, const char* name, int64_t min_len);

// The CUDA stream a Python caller passed as an integer (0: the legacy default stream).
inline Stream stream_of(uintptr_t s) { return reinterpret_cast<Stream>(s); }

// flashkv::Error -> ValueError (an argument problem) or RuntimeError (CUDA, NVRTC, no driver);
// flashkv::NotImplementedError -> NotImplementedError (a format no GPU kernel reads yet).
void register_error_translator();

}  // namespace flashkv::python
