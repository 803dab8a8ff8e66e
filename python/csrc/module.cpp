// flashkv._C: the C++ API as it is, for the Python package (python/flashkv). Arrays arrive as
// DLPack views (array_view.h); the FlashInfer-shaped wrappers, output allocation, stream choice
// and the LSE base live in Python. Every op releases the GIL while it runs; flashkv::Error becomes
// ValueError or RuntimeError with the C++ message. Each op family binds itself (bindings.h); this
// file holds the module and what belongs to no op: fp8 views, the device, its error record.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include "array_view.h"
#include "binding_util.h"
#include "bindings.h"
#include "flashkv/device_errors.h"
#include "flashkv/runtime.h"
#include "variant.h"

namespace flashkv::python {
namespace {

using nb::arg;

void bind_device(nb::module_& m) {
  m.def("fp8_view", &fp8_view, arg("array"), arg("dtype"));
  m.def("cuda_available", &cuda_available);
  m.def("cuda_unavailable_reason", &cuda_unavailable_reason);
  m.def("cuda_device_count", &cuda_device_count);
  // Where NVRTC comes from (flashkv/_nvrtc_wheel.py adds the nvidia-cuda-nvrtc wheel's directory).
  m.def("nvrtc_soname", &nvrtc_soname);
  m.def("add_nvrtc_search_dir", &add_nvrtc_search_dir, arg("dir"));
  m.def("nvrtc_library", &nvrtc_library);
  m.def("nvrtc_version", &nvrtc_version);
  m.def("kernel_cache_dir", &kernel_cache_dir);
  m.def(
      "device_synchronize", [](int device) { without_gil([&] { device_synchronize(device); }); },
      arg("device"));
  // Errors recorded by kernels from device-resident input (device_errors.h).
  m.def(
      "check_device_errors",
      [](int device, uintptr_t stream) {
        without_gil([&] { check_device_errors(device, stream_of(stream)); });
      },
      arg("device"), arg("stream"));
}

}  // namespace

void bind_module(nb::module_& m) {
  register_error_translator();
  bind_device(m);
  bind_variants(m);    // before the ops: their plan() takes a Variant
  bind_plan_types(m);  // AttentionShape, PageTableNames: the plan() defaults need them bound
  bind_decode(m);
  bind_prefill(m);
  bind_cascade(m);
  bind_block_sparse(m);
  bind_merge(m);
  bind_kv_rope(m);
  bind_kv_quant(m);
  bind_precompile(m);
}

}  // namespace flashkv::python

NB_MODULE(_C, m) {
  m.doc() = "flashkv's C++ API (natural-log LSE); use the wrappers in the flashkv package.";
  flashkv::python::bind_module(m);
}
