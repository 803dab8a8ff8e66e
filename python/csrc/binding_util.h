// What the binding files share: the GIL release around an op, the caller's workspace, the
// optional-argument types and FlashInfer's k_scale / v_scale keyword arguments.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstddef>
#include <optional>
#include <utility>

#include "array_view.h"
#include "flashkv/error.h"

namespace flashkv::python {

using LseArg = std::optional<OutArray>;
using OptionalIn = std::optional<InArray>;

// Runs f with the GIL released (the views were built while it was held).
template <class F>
void without_gil(F&& f) {
  nb::gil_scoped_release release;
  f();
}

// The keyword arguments of FlashInfer's k_scale / v_scale (array_view.h: kv_scale_of) that every
// op reading or writing a KV cache takes after its others.
#define FLASHKV_KV_SCALE_ARGS                           \
  nb::arg("k_scale") = 1.0f, nb::arg("v_scale") = 1.0f, \
  nb::arg("k_scale_tensor").none() = nb::none(), nb::arg("v_scale_tensor").none() = nb::none()

// The caller's workspace: contiguous device memory of any dtype (FlashInfer's is uint8) on the
// op's device, kept alive by the op.
struct Workspace {
  OutArray array;
  void* data = nullptr;
  size_t bytes = 0;

  Workspace(OutArray a, int device) : array(std::move(a)) {
    check(array.device_type() == nb::device::cuda::value && array.device_id() == device,
          "float_workspace_buffer: expected memory on device cuda:", device);
    int64_t expected = 1;
    for (int i = static_cast<int>(array.ndim()) - 1; i >= 0; --i) {
      check(array.shape(i) <= 1 || array.stride(i) == expected,
            "float_workspace_buffer: expected a contiguous buffer");
      expected *= static_cast<int64_t>(array.shape(i));
    }
    data = array.data();
    bytes = array.nbytes();
  }
};

}  // namespace flashkv::python
