// What the binding files share: the GIL release around an op, the caller's workspace, the
// optional-argument types, the options of the unplanned ops and FlashInfer's k_scale / v_scale
// keyword arguments.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstddef>
#include <optional>
#include <utility>

#include "array_view.h"
#include "flashkv/attention.h"
#include "flashkv/error.h"
#include "flashkv/rope.h"

namespace flashkv::python {

using LseArg = std::optional<OutArray>;
using OptionalIn = std::optional<InArray>;

// Runs f with the GIL released (the views were built while it was held).
template <class F>
void without_gil(F&& f) {
  nb::gil_scoped_release release;
  f();
}

// The options of the ops without a plan (single-request attention, the CPU references).
inline AttentionOptions attention_options(float sm_scale, bool causal,
                                          const KVScale& kv_scale = {}) {
  AttentionOptions o;
  o.sm_scale = sm_scale;
  o.causal = causal;
  o.kv_scale = kv_scale;
  return o;
}

// RoPE's options from the wrappers' scalars (the RoPE ops and the fused decode step).
inline RopeOptions llama_rope(int rotary_dim, bool interleave, double rope_scale,
                              double rope_theta) {
  RopeOptions o;
  o.rotary_dim = rotary_dim;
  o.interleave = interleave;
  o.rope_scale = rope_scale;
  o.rope_theta = rope_theta;
  return o;
}

inline Llama31RopeOptions llama31_rope(int rotary_dim, bool interleave, double rope_scale,
                                       double rope_theta, double low_freq_factor,
                                       double high_freq_factor, double old_context_len) {
  Llama31RopeOptions o;
  o.rotary_dim = rotary_dim;
  o.interleave = interleave;
  o.rope_scale = rope_scale;
  o.rope_theta = rope_theta;
  o.low_freq_factor = low_freq_factor;
  o.high_freq_factor = high_freq_factor;
  o.old_context_len = old_context_len;
  return o;
}

// The keyword arguments of FlashInfer's k_scale / v_scale (array_view.h: kv_scale_of) that every
// op reading or writing a KV cache takes after its others.
#define FLASHKV_KV_SCALE_ARGS                           \
  nb::arg("k_scale") = 1.0f, nb::arg("v_scale") = 1.0f, \
  nb::arg("k_scale_tensor").none() = nb::none(), nb::arg("v_scale_tensor").none() = nb::none()

// A quantized format's keyword arguments (array_view.h: with_group_scales), after the scales'.
#define FLASHKV_KV_GROUP_ARGS                                                          \
  nb::arg("kv_format") = "", nb::arg("k_group_scale").none() = nb::none(),             \
  nb::arg("v_group_scale").none() = nb::none(), nb::arg("k_zero").none() = nb::none(), \
  nb::arg("v_zero").none() = nb::none()

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
