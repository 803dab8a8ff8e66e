// KVScale's checks (attention.h): shared by every op that reads or writes a quantized cache.
#include <cmath>
#include <string>

#include "flashkv/attention.h"
#include "flashkv/error.h"

namespace flashkv {
namespace {

void check_scale_tensor(const TensorView& t, int num_kv_heads, Device device, const char* name,
                        const char* which) {
  if (!t.defined()) return;
  check(t.dtype() == DType::f32, name, ".", which, ": expected f32, got ", dtype_name(t.dtype()));
  check(t.ndim() == 1 && (t.size(0) == 1 || t.size(0) == num_kv_heads), name, ".", which,
        ": expected shape [1] or [", num_kv_heads, "] (num_kv_heads), got ", t.shape_str());
  check(t.size(0) == 1 || t.stride(0) == 1, name, ".", which, ": expected a contiguous tensor");
  check(t.device() == device, name, ".", which, ": expected a tensor on ", device.str(),
        " (the cache's device), got ", t.device().str());
  check(t.data() != nullptr, name, ".", which, ": expected data, got a null pointer");
}

}  // namespace

void check_kv_scale(const KVScale& s, DType kv_dtype, int num_kv_heads, Device device, bool gpu,
                    const char* name) {
  if (s.has_group_scales()) {
    const std::string fmt = kv_format_name(s.format, kv_dtype);
    if (gpu) {
      fail_not_implemented(name, ".format: ", fmt, " (group scales) has no GPU kernel yet ",
                           "(issue 42); the CPU reference reads it from a PagedKVCache");
    }
    fail(name, ".format: ", fmt, " (group scales) is read from a PagedKVCache only (its ",
         "scale pools share the page ids); contiguous k, v take per-tensor / per-head scales");
  }
  check(std::isfinite(s.k) && s.k > 0.0f, name, ".k: expected a finite scale > 0, got ", s.k);
  check(std::isfinite(s.v) && s.v > 0.0f, name, ".v: expected a finite scale > 0, got ", s.v);
  check_scale_tensor(s.k_tensor, num_kv_heads, device, name, "k_tensor");
  check_scale_tensor(s.v_tensor, num_kv_heads, device, name, "v_tensor");
  check(!gpu || is_fp8_dtype(kv_dtype) || s.is_identity(), name,
        ": dequantization scales apply to fp8 (e4m3, e5m2) caches on the GPU; this cache is ",
        dtype_name(kv_dtype), " (fold a key scale into sm_scale and multiply the output by the ",
        "value scale instead)");
}

}  // namespace flashkv
