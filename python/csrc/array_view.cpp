#include "array_view.h"

#include <Python.h>

#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "flashkv/error.h"
#include "flashkv/kv_quant.h"

namespace flashkv::python {
namespace {

namespace dl = nb::dlpack;

std::string dtype_str(dl::dtype t) {
  return "(DLPack code " + std::to_string(t.code) + ", " + std::to_string(t.bits) + " bits, " +
         std::to_string(t.lanes) + " lanes)";
}

DType dtype_of(dl::dtype t, const char* name) {
  const auto code = static_cast<dl::dtype_code>(t.code);
  if (t.lanes == 1) {
    if (code == dl::dtype_code::Float && t.bits == 16) return DType::f16;
    if (code == dl::dtype_code::Float && t.bits == 32) return DType::f32;
    if (code == dl::dtype_code::Bfloat && t.bits == 16) return DType::bf16;
    if (code == dl::dtype_code::Int && t.bits == 32) return DType::i32;
    // Raw bytes: the packed 4-bit pairs of an INT4 / NVFP4 cache (kv_quant.h).
    if (code == dl::dtype_code::UInt && t.bits == 8) return DType::u8;
    // DLPack 1.1's float8 codes (kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12), by number: older
    // nanobind releases do not name them.
    if (t.code == 10 && t.bits == 8) return DType::e4m3;
    if (t.code == 12 && t.bits == 8) return DType::e5m2;
  }
  throw nb::type_error((std::string(name) + ": unsupported dtype " + dtype_str(t) +
                        "; expected float16, bfloat16, float32, float8_e4m3fn, float8_e5m2, "
                        "int32 or uint8")
                           .c_str());
}

Device device_of(int type, int id, const char* name) {
  switch (type) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value:  // pinned host memory
      return Device::cpu();
    case nb::device::cuda::value:
      return Device::cuda(id);
    default:
      throw nb::type_error((std::string(name) + ": unsupported DLPack device type " +
                            std::to_string(type) + "; expected CPU or CUDA memory")
                               .c_str());
  }
}

template <class Array>
TensorView make_view(const Array& a, const char* name) {
  const int ndim = static_cast<int>(a.ndim());
  if (ndim > TensorView::kMaxDims) {
    throw nb::type_error((std::string(name) + ": " + std::to_string(ndim) +
                          " dimensions; flashkv takes at most " +
                          std::to_string(TensorView::kMaxDims))
                             .c_str());
  }
  int64_t shape[TensorView::kMaxDims];
  int64_t strides[TensorView::kMaxDims];
  int64_t contiguous = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    shape[i] = static_cast<int64_t>(a.shape(i));
    // DLPack allows null strides (row-major); nanobind normally fills them in.
    strides[i] = a.stride_ptr() != nullptr ? a.stride(i) : contiguous;
    contiguous *= shape[i];
  }
  return TensorView(const_cast<void*>(static_cast<const void*>(a.data())),
                    dtype_of(a.dtype(), name), ndim, shape, strides,
                    device_of(a.device_type(), a.device_id(), name));
}

bool is_runtime_failure(std::string_view msg) {
  // Failed CUDA driver calls (runtime/driver.cpp: "<call>: CUDA_ERROR_...: ..."), NVRTC failures,
  // and the reason the driver could not be loaded; everything else flashkv reports is a bad
  // argument, named in the message.
  if (msg.find(": CUDA_ERROR_") != std::string_view::npos) return true;
  if (msg.substr(0, 6) == "NVRTC ") return true;
  if (msg.find("is not in its JIT module") != std::string_view::npos) return true;
  return !cuda_available() && msg == cuda_unavailable_reason();
}

}  // namespace

TensorView view_of(const InArray& a, const char* name) { return make_view(a, name); }
TensorView view_of(const OutArray& a, const char* name) { return make_view(a, name); }
TensorView view_of(const std::optional<OutArray>& a, const char* name) {
  return a ? make_view(*a, name) : TensorView();
}
TensorView view_of(const std::optional<InArray>& a, const char* name) {
  return a ? make_view(*a, name) : TensorView();
}

KVScale kv_scale_of(float k, float v, const std::optional<InArray>& k_tensor,
                    const std::optional<InArray>& v_tensor) {
  KVScale s;
  s.k = k;
  s.v = v;
  s.k_tensor = view_of(k_tensor, "k_scale");
  s.v_tensor = view_of(v_tensor, "v_scale");
  return s;
}

KVScale with_group_scales(KVScale s, const std::string& kv_format,
                          const std::optional<InArray>& k_group_scale,
                          const std::optional<InArray>& v_group_scale,
                          const std::optional<InArray>& k_zero,
                          const std::optional<InArray>& v_zero) {
  if (kv_format.empty()) {
    check(!k_group_scale && !v_group_scale && !k_zero && !v_zero, "k_group_scale / v_group_scale ",
          "/ k_zero / v_zero: group scales need a quantized kv_format (e4m3-per-token, int4-g64, ",
          "nvfp4, ...), got none");
    return s;
  }
  s.format = parse_kv_format(kv_format).format;
  s.k_group_scale = view_of(k_group_scale, "k_group_scale");
  s.v_group_scale = view_of(v_group_scale, "v_group_scale");
  s.k_zero = view_of(k_zero, "k_zero");
  s.v_zero = view_of(v_zero, "v_zero");
  return s;
}

nb::ndarray<> fp8_view(const InArray& a, const std::string& dtype) {
  const DType t = parse_dtype(dtype);
  check(is_fp8_dtype(t), "fp8_view: expected dtype e4m3 or e5m2, got ", dtype);
  const dl::dtype in = a.dtype();
  const auto code = static_cast<dl::dtype_code>(in.code);
  check(in.bits == 8 && in.lanes == 1 &&
            (code == dl::dtype_code::UInt || code == dl::dtype_code::Int),
        "fp8_view: expected an 8-bit integer array (the fp8 array's bytes), got ", dtype_str(in));
  const size_t ndim = a.ndim();
  std::vector<size_t> shape(ndim);
  std::vector<int64_t> strides(ndim);
  int64_t contiguous = 1;
  for (size_t i = ndim; i-- > 0;) {
    shape[i] = a.shape(i);
    strides[i] = a.stride_ptr() != nullptr ? a.stride(i) : contiguous;
    contiguous *= static_cast<int64_t>(shape[i]);
  }
  // The owner holds a reference to `a`'s DLPack tensor (and so its memory) for the view's life.
  auto* keep = new InArray(a);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<InArray*>(p); });
  const dl::dtype fp8{static_cast<uint8_t>(t == DType::e4m3 ? 10 : 12), 8, 1};
  return nb::ndarray<>(const_cast<void*>(a.data()), ndim, shape.data(), owner, strides.data(), fp8,
                       a.device_type(), a.device_id());
}

const int32_t* host_i32(const InArray& a, const char* name, int64_t min_len) {
  const TensorView v = make_view(a, name);
  check_device(v, name, Device::cpu());
  check_dtype(v, name, DType::i32);
  check_ndim(v, name, 1);
  check(v.size(0) <= 1 || v.stride(0) == 1, name, ": expected a contiguous array");
  check(v.size(0) >= min_len, name, ": expected at least ", min_len, " entries, got ", v.size(0));
  return v.data_as<const int32_t>();
}

void register_error_translator() {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(is_runtime_failure(e.what()) ? PyExc_RuntimeError : PyExc_ValueError,
                      e.what());
    }
  });
}

}  // namespace flashkv::python
