// The quantized KV formats' host quantizers (flashkv/kv_quantize.h) and the format names
// (flashkv/kv_quant.h), for flashkv.quantize_kv / dequantize_kv (python/flashkv/kv_quant.py).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <string>

#include "binding_util.h"
#include "bindings.h"
#include "flashkv/kv_quant.h"
#include "flashkv/kv_quantize.h"

namespace flashkv::python {

using nb::arg;

void bind_kv_quant(nb::module_& m) {
  // (value dtype name, group size, groups at head_dim, packed, zero point) of a format name.
  m.def(
      "kv_format_info",
      [](const std::string& name, int head_dim) {
        const KVFormatSpec s = parse_kv_format(name);
        check(!s.format.is_none(), "kv_format: '", name,
              "' is a plain dtype, not a quantized format");
        check_kv_format(s.format, s.value_dtype, head_dim, "kv_format");
        return nb::make_tuple(std::string(dtype_name(s.value_dtype)),
                              s.format.effective_group_size(head_dim), s.format.groups(head_dim),
                              s.format.packed(), s.format.has_zero_point());
      },
      arg("name"), arg("head_dim"));
  m.def(
      "quantize_kv",
      [](const InArray& x, const std::string& kv_format, float tensor_scale, const OutArray& values,
         const OutArray& scales, const std::optional<OutArray>& zeros) {
        const TensorView xv = view_of(x, "x"), vv = view_of(values, "values"),
                         sv = view_of(scales, "scales"), zv = view_of(zeros, "zeros");
        const KVQuantFormat f = parse_kv_format(kv_format).format;
        without_gil([&] { quantize_kv(xv, f, tensor_scale, vv, sv, zv); });
      },
      arg("x"), arg("kv_format"), arg("tensor_scale"), arg("values"), arg("scales"),
      arg("zeros").none());
  m.def(
      "dequantize_kv",
      [](const InArray& values, const InArray& scales, const OptionalIn& zeros,
         const std::string& kv_format, float tensor_scale, const OutArray& out) {
        const TensorView vv = view_of(values, "values"), sv = view_of(scales, "scales"),
                         zv = view_of(zeros, "zeros"), ov = view_of(out, "out");
        const KVQuantFormat f = parse_kv_format(kv_format).format;
        without_gil([&] { dequantize_kv(vv, sv, zv, f, tensor_scale, ov); });
      },
      arg("values"), arg("scales"), arg("zeros").none(), arg("kv_format"), arg("tensor_scale"),
      arg("out"));
  m.def(
      "nvfp4_tensor_scale", [](const InArray& x) { return nvfp4_tensor_scale(view_of(x, "x")); },
      arg("x"));
}

}  // namespace flashkv::python
