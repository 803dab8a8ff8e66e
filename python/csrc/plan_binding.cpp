// The structs every plan() binding takes, and the plan checks the ops share (page ids, the
// contiguous KV of the single-request ops).
#include "plan_binding.h"

#include <string>

#include "binding_util.h"
#include "flashkv/attention.h"
#include "flashkv/error.h"
#include "flashkv/kv_quant.h"
#include "flashkv/plan_checks.h"

namespace flashkv::python {

using nb::arg;

int batch_of(const InArray& indptr, const char* name) {
  check(indptr.ndim() == 1 && indptr.shape(0) >= 1, name,
        ": expected shape [batch + 1] with at least one entry");
  return static_cast<int>(indptr.shape(0)) - 1;
}

namespace {

// A DType field as its flashkv name ("f16", "bf16", "e4m3", ...; parse_dtype's spellings in).
template <DType AttentionShape::*Field>
void dtype_field(StructBinding<AttentionShape>& b, const char* name) {
  b.rw_as(
      name, [](const AttentionShape& s) { return std::string(dtype_name(s.*Field)); },
      [](AttentionShape& s, const std::string& v) { s.*Field = parse_dtype(v); });
}

}  // namespace

void bind_plan_types(nb::module_& m) {
  StructBinding<AttentionShape> shape(m, "AttentionShape",
                                      "Heads, head_dim and dtypes of a decode or prefill plan.");
  shape.rw("num_qo_heads", &AttentionShape::num_qo_heads)
      .rw("num_kv_heads", &AttentionShape::num_kv_heads)
      .rw("head_dim", &AttentionShape::head_dim);
  dtype_field<&AttentionShape::q_dtype>(shape, "q_dtype");
  dtype_field<&AttentionShape::kv_dtype>(shape, "kv_dtype");
  dtype_field<&AttentionShape::o_dtype>(shape, "o_dtype");
  // A quantized cache's format by name ("" for none; kv_quant.h: "int4-g64", "nvfp4", ...);
  // kv_dtype holds its element dtype.
  shape.rw_as(
      "kv_format",
      [](const AttentionShape& s) {
        return s.kv_format.is_none() ? std::string() : kv_format_name(s.kv_format, s.kv_dtype);
      },
      [](AttentionShape& s, const std::string& v) {
        s.kv_format = v.empty() ? KVQuantFormat{} : parse_kv_format(v).format;
      });
  shape.finish();

  nb::class_<PyPageTableNames>(m, "PageTableNames",
                               "How a plan's errors name the page-table arrays.")
      .def(nb::init<>())
      .def_rw("qo_indptr", &PyPageTableNames::qo_indptr)
      .def_rw("kv_indptr", &PyPageTableNames::kv_indptr)
      .def_rw("kv_indices", &PyPageTableNames::kv_indices)
      .def_rw("kv_last_page_len", &PyPageTableNames::kv_last_page_len);

  // run(): the plan's largest host page id (the checks' (id, entry)) against the cache's pages.
  m.def(
      "check_page_ids_fit",
      [](int64_t max_id, int64_t entry, int64_t num_pages, const std::string& name) {
        check_page_ids_fit(PageIdMax{max_id, entry}, num_pages, name.c_str());
      },
      arg("max_id"), arg("entry"), arg("num_pages"), arg("name"));
  m.def(
      "check_single_kv",
      [](const InArray& k, const std::string& layout, int num_qo_heads) {
        check_contiguous_kv_heads(view_of(k, "k"), parse_kv_layout(layout), num_qo_heads);
      },
      arg("k"), arg("layout"), arg("num_qo_heads"));
}

}  // namespace flashkv::python
