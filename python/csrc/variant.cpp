// flashkv._C's attention variants: built-in descriptions (variants.h) and user VariantSpecs
// (variant_spec.h) as opaque Variant objects the plan() bindings take, and the CPU reference of
// the built-ins (reference_variants.h). Argument names and defaults are chosen by the Python
// wrappers (flashkv/variants.py); errors here name the Python argument where one exists.
#include "variant.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <optional>
#include <string>
#include <tuple>

#include "binding_util.h"
#include "flashkv/error.h"
#include "flashkv/reference_variants.h"

namespace flashkv::python {
namespace {

using nb::arg;

RopeMode parse_rope_mode(const std::string& s) {
  if (s == "none") return RopeMode::none;
  if (s == "llama") return RopeMode::llama;
  if (s == "llama31") return RopeMode::llama31;
  fail("rope_mode: expected 'none', 'llama' or 'llama31', got '", s, "'");
}

// A view of `a` (or an undefined one for None), kept alive by `pv`.
TensorView keep_view(PyVariant& pv, const OptionalIn& a, const char* name) {
  if (!a) return TensorView();
  pv.keep.push_back(*a);
  return view_of(*a, name);
}

PyVariant builtin_variant(float sm_scale, bool causal, int window_left, int window_right,
                          float logits_soft_cap, const OptionalIn& alibi_slopes,
                          const OptionalIn& sinks, bool sigmoid, float sigmoid_bias,
                          const std::string& rope_mode, float rope_scale, float rope_theta,
                          float low_freq_factor, float high_freq_factor, float old_context_len,
                          const OptionalIn& custom_mask, const OptionalIn& mask_indptr) {
  PyVariant pv;
  AttentionVariant v;
  v.sm_scale = sm_scale;
  v.causal = causal;
  v.window_left = window_left;
  v.window_right = window_right;
  v.logits_soft_cap = logits_soft_cap;
  v.alibi_slopes = keep_view(pv, alibi_slopes, "alibi_slopes");
  v.sinks = keep_view(pv, sinks, "sinks");
  v.sigmoid = sigmoid;
  v.sigmoid_bias = sigmoid_bias;
  v.rope.mode = parse_rope_mode(rope_mode);
  v.rope.rope_scale = rope_scale;
  v.rope.rope_theta = rope_theta;
  v.rope.low_freq_factor = low_freq_factor;
  v.rope.high_freq_factor = high_freq_factor;
  v.rope.old_context_len = old_context_len;
  if (custom_mask) {
    // Packed bytes (uint8, FlashInfer's packed_custom_mask): flashkv has no u8 DType, so the
    // mask crosses as a pointer and a size.
    const InArray& a = *custom_mask;
    check(a.dtype() == nb::dtype<uint8_t>(), "packed_custom_mask: expected dtype uint8");
    check(a.ndim() == 1 && (a.shape(0) <= 1 || a.stride(0) == 1),
          "packed_custom_mask: expected a contiguous 1-D array");
    pv.keep.push_back(a);
    v.custom_mask.bits = static_cast<const uint8_t*>(a.data());
    v.custom_mask.num_bytes = static_cast<int64_t>(a.shape(0));
  }
  v.custom_mask.mask_indptr = keep_view(pv, mask_indptr, "mask_indptr");
  pv.variant = Variant::builtin(v);
  return pv;
}

VariantParam::Kind parse_kind(const std::string& s, const std::string& name) {
  if (s == "f32") return VariantParam::Kind::kF32;
  if (s == "i32") return VariantParam::Kind::kI32;
  if (s == "tensor") return VariantParam::Kind::kTensor;
  fail("variant.params['", name, "']: kind '", s, "' (expected f32, i32 or tensor)");
}

// params: (name, kind "f32" | "i32" | "tensor", element dtype of a tensor); args: name -> a
// Python float / int or a DLPack array, converted by the declared kind.
PyVariant user_variant(const std::string& name, const std::string& source,
                       const std::vector<std::tuple<std::string, std::string, std::string>>& params,
                       bool use_softmax, const nb::dict& args) {
  PyVariant pv;
  VariantSpec spec;
  spec.name = name;
  spec.source = source;
  spec.use_softmax = use_softmax;
  for (const auto& [pname, kind, dtype] : params) {
    VariantParam p;
    p.name = pname;
    p.kind = parse_kind(kind, pname);
    if (p.kind == VariantParam::Kind::kTensor) p.dtype = parse_dtype(dtype);
    spec.params.push_back(p);
  }
  VariantArgs va;
  for (auto [key, value] : args) {
    const std::string k = nb::cast<std::string>(key);
    const VariantParam* p = nullptr;
    for (const auto& q : spec.params)
      if (q.name == k) p = &q;
    check(p != nullptr, "variant_args['", k, "']: not one of the variant's params");
    const std::string what = "variant_args['" + k + "']";
    switch (p->kind) {
      case VariantParam::Kind::kF32: {
        double d = 0;
        check(nb::try_cast<double>(value, d), what, ": expected a float");
        va.set(k, static_cast<float>(d));
        break;
      }
      case VariantParam::Kind::kI32: {
        int64_t i = 0;
        check(!nb::isinstance<nb::float_>(value) && nb::try_cast<int64_t>(value, i), what,
              ": expected an int");
        check(i >= INT32_MIN && i <= INT32_MAX, what, ": ", i, " does not fit int32");
        va.set(k, static_cast<int32_t>(i));
        break;
      }
      case VariantParam::Kind::kTensor: {
        InArray a;
        check(nb::try_cast<InArray>(value, a), what, ": expected an array (DLPack)");
        pv.keep.push_back(a);
        va.set(k, view_of(a, what.c_str()));
        break;
      }
    }
  }
  pv.variant = Variant::user(std::move(spec), std::move(va));
  return pv;
}

const AttentionVariant& builtin_of(const PyVariant& pv) {
  check(pv.variant.is_builtin() || pv.variant.is_plain(),
        "the CPU reference runs the built-in variants only");
  return pv.variant.builtin_description();
}

}  // namespace

void bind_variants(nb::module_& m) {
  nb::class_<PyVariant>(m, "Variant")
      .def_prop_ro("is_user", [](const PyVariant& v) { return v.variant.is_user(); })
      .def_prop_ro("use_softmax", [](const PyVariant& v) { return v.variant.use_softmax(); });
  m.def("builtin_variant", &builtin_variant, arg("sm_scale"), arg("causal"), arg("window_left"),
        arg("window_right"), arg("logits_soft_cap"), arg("alibi_slopes").none(),
        arg("sinks").none(), arg("sigmoid"), arg("sigmoid_bias"), arg("rope_mode"),
        arg("rope_scale"), arg("rope_theta"), arg("low_freq_factor"), arg("high_freq_factor"),
        arg("old_context_len"), arg("custom_mask").none(), arg("mask_indptr").none());
  m.def("user_variant", &user_variant, arg("name"), arg("source"), arg("params"),
        arg("use_softmax"), arg("args"));

  // CPU reference of the built-ins (host arrays only; the variant's tensors on the host too).
  m.def(
      "reference_batch_decode_variant",
      [](const InArray& q, const InArray& k, const InArray& v, const std::string& layout,
         const InArray& indptr, const InArray& indices, const InArray& last_page_len,
         const OutArray& out, const LseArg& lse, const PyVariant& variant, float k_scale,
         float v_scale, const OptionalIn& k_scale_tensor, const OptionalIn& v_scale_tensor) {
        const TensorView qv = view_of(q, "q"), ov = view_of(out, "out"), lv = view_of(lse, "lse");
        const PagedKVCache kv =
            paged_cache(k, v, layout, indptr, indices, last_page_len,
                        kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor));
        const AttentionVariant& av = builtin_of(variant);
        without_gil([&] { reference::batch_decode_variant(qv, kv, ov, lv, av); });
      },
      arg("q"), arg("k"), arg("v"), arg("layout"), arg("indptr"), arg("indices"),
      arg("last_page_len"), arg("out"), arg("lse").none(), arg("variant"), arg("k_scale") = 1.0f,
      arg("v_scale") = 1.0f, arg("k_scale_tensor").none() = nb::none(),
      arg("v_scale_tensor").none() = nb::none());
  // Single decode and single prefill share one signature: one binding body for both.
  using SingleVariantFn =
      void (*)(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
               const TensorView&, KVLayout, const AttentionVariant&, const reference::KVChunk&);
  const auto single_reference = [](SingleVariantFn fn) {
    return [fn](const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
                const LseArg& lse, const std::string& layout, const PyVariant& variant) {
      const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), vv = view_of(v, "v"),
                       ov = view_of(out, "out"), lv = view_of(lse, "lse");
      const KVLayout l = parse_kv_layout(layout);
      const AttentionVariant& av = builtin_of(variant);
      without_gil([&] { fn(qv, kv, vv, ov, lv, l, av, reference::KVChunk{}); });
    };
  };
  m.def("reference_single_decode_variant", single_reference(&reference::single_decode_variant),
        arg("q"), arg("k"), arg("v"), arg("out"), arg("lse").none(), arg("layout"), arg("variant"));
  m.def("reference_single_prefill_variant", single_reference(&reference::single_prefill_variant),
        arg("q"), arg("k"), arg("v"), arg("out"), arg("lse").none(), arg("layout"), arg("variant"));
  m.def(
      "reference_batch_prefill_paged_variant",
      [](const InArray& q, const InArray& qo_indptr, const InArray& k, const InArray& v,
         const std::string& layout, const InArray& indptr, const InArray& indices,
         const InArray& last_page_len, const OutArray& out, const LseArg& lse,
         const PyVariant& variant, float k_scale, float v_scale, const OptionalIn& k_scale_tensor,
         const OptionalIn& v_scale_tensor) {
        const TensorView qv = view_of(q, "q"), qi = view_of(qo_indptr, "qo_indptr"),
                         ov = view_of(out, "out"), lv = view_of(lse, "lse");
        const PagedKVCache kv =
            paged_cache(k, v, layout, indptr, indices, last_page_len,
                        kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor));
        const AttentionVariant& av = builtin_of(variant);
        without_gil([&] { reference::batch_prefill_paged_variant(qv, qi, kv, ov, lv, av); });
      },
      arg("q"), arg("qo_indptr"), arg("k"), arg("v"), arg("layout"), arg("indptr"), arg("indices"),
      arg("last_page_len"), arg("out"), arg("lse").none(), arg("variant"), arg("k_scale") = 1.0f,
      arg("v_scale") = 1.0f, arg("k_scale_tensor").none() = nb::none(),
      arg("v_scale_tensor").none() = nb::none());
  m.def(
      "reference_batch_prefill_ragged_variant",
      [](const InArray& q, const InArray& qo_indptr, const InArray& k, const InArray& v,
         const InArray& kv_indptr, const OutArray& out, const LseArg& lse,
         const PyVariant& variant) {
        const TensorView qv = view_of(q, "q"), qi = view_of(qo_indptr, "qo_indptr"),
                         kv = view_of(k, "k"), vv = view_of(v, "v"),
                         ki = view_of(kv_indptr, "kv_indptr"), ov = view_of(out, "out"),
                         lv = view_of(lse, "lse");
        const AttentionVariant& av = builtin_of(variant);
        without_gil(
            [&] { reference::batch_prefill_ragged_variant(qv, qi, kv, vv, ki, ov, lv, av); });
      },
      arg("q"), arg("qo_indptr"), arg("k"), arg("v"), arg("kv_indptr"), arg("out"),
      arg("lse").none(), arg("variant"));
}

}  // namespace flashkv::python
