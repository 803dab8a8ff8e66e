// Multi-level cascade from Python (flashkv/cascade.h): _C.MultiLevelCascade (the GPU op), its
// shape, plan options and statistics as classes (CascadeShape, CascadePlanOptions,
// CascadePlanInfo), and check_host_cascade_plan, the host path's copy of the plan's checks.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>
#include <utility>

#include "binding_util.h"
#include "bindings.h"
#include "flashkv/cascade.h"
#include "flashkv/plan_checks.h"
#include "plan_binding.h"

namespace flashkv::python {
namespace {

using nb::arg;
using Use = CascadePlanOptions::Use;

Use parse_cascade_use(const std::string& use) {
  if (use == "auto") return Use::kAuto;
  if (use == "always") return Use::kAlways;
  if (use == "never") return Use::kNever;
  fail("use_cascade: expected 'auto', 'always' or 'never', got '", use, "'");
}

const char* cascade_use_name(Use u) {
  switch (u) {
    case Use::kAlways:
      return "always";
    case Use::kNever:
      return "never";
    default:
      return "auto";
  }
}

// The batch's host page table; qo_indptr None: one query row per request (decode). kv_indices
// with_ids false: left null (the host check reads it once kv_indptr is known to be sound).
CascadeBatch cascade_batch(const OptionalIn& qo_indptr, const InArray& kv_indptr,
                           const InArray& kv_indices, const InArray& kv_last_page_len,
                           int page_size, const PyPageTableNames& names, bool with_ids) {
  CascadeBatch b;
  b.batch_size = batch_of(kv_indptr, names.kv_indptr.c_str());
  b.kv_indptr = host_i32(kv_indptr, names.kv_indptr.c_str(), b.batch_size + 1);
  b.kv_last_page_len = host_i32(kv_last_page_len, names.kv_last_page_len.c_str(), b.batch_size);
  b.qo_indptr =
      qo_indptr ? host_i32(*qo_indptr, names.qo_indptr.c_str(), b.batch_size + 1) : nullptr;
  b.page_size = page_size;
  if (with_ids) {
    b.kv_indices = host_i32(kv_indices, names.kv_indices.c_str(),
                            b.batch_size > 0 ? b.kv_indptr[b.batch_size] : 0);
  }
  return b;
}

MultiLevelCascadeConfig cascade_config(int max_batch, int64_t max_qo_tokens, int64_t max_pages,
                                       int num_qo_heads, int head_dim, int max_levels, int device) {
  MultiLevelCascadeConfig cfg;
  cfg.max_batch = max_batch;
  cfg.max_qo_tokens = max_qo_tokens;
  cfg.max_pages = max_pages;
  cfg.num_qo_heads = num_qo_heads;
  cfg.head_dim = head_dim;
  cfg.max_levels = max_levels;
  cfg.device = device;
  return cfg;
}

// MultiLevelCascade: max_qo_tokens 0 makes a decode cascade (one query row per request).
class PyMultiLevelCascade {
 public:
  PyMultiLevelCascade(OutArray workspace, int max_batch, int64_t max_qo_tokens, int64_t max_pages,
                      int num_qo_heads, int head_dim, int max_levels, int device)
      : ws_(std::move(workspace), device) {
    op_ = std::make_unique<MultiLevelCascade>(
        cascade_config(max_batch, max_qo_tokens, max_pages, num_qo_heads, head_dim, max_levels,
                       device),
        ws_.data, ws_.bytes);
  }

  static size_t workspace_bytes(int max_batch, int64_t max_qo_tokens, int64_t max_pages,
                                int num_qo_heads, int head_dim, int max_levels, int device) {
    return MultiLevelCascade::workspace_bytes(cascade_config(
        max_batch, max_qo_tokens, max_pages, num_qo_heads, head_dim, max_levels, device));
  }
  static size_t min_workspace_bytes(int max_batch, int64_t max_qo_tokens, int64_t max_pages,
                                    int num_qo_heads, int head_dim, int max_levels, int device) {
    return MultiLevelCascade::min_workspace_bytes(cascade_config(
        max_batch, max_qo_tokens, max_pages, num_qo_heads, head_dim, max_levels, device));
  }

  // The one place the GPU path checks the plan (MultiLevelCascade::plan, plan_checks.h).
  void plan(const OptionalIn& qo_indptr, const InArray& kv_indptr, const InArray& kv_indices,
            const InArray& kv_last_page_len, int page_size, const CascadeShape& shape,
            const CascadePlanOptions& options, const PyPageTableNames& names, uintptr_t stream) {
    const CascadeBatch b =
        cascade_batch(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size, names, true);
    CascadePlanOptions o = options;
    o.names = names.view();
    without_gil([&] { op_->plan(b, shape, o, stream_of(stream)); });
  }

  // The plan holds device copies of every level's page ids: only the cache tensors are passed.
  void run(const InArray& q, const InArray& k, const InArray& v, const std::string& layout,
           const OutArray& out, const LseArg& lse, uintptr_t stream, float k_scale, float v_scale,
           const OptionalIn& k_scale_tensor, const OptionalIn& v_scale_tensor) {
    const TensorView qv = view_of(q, "q"), ov = view_of(out, "out"), lv = view_of(lse, "lse");
    PagedKVCache kv;
    kv.k = view_of(k, "paged_kv.k");
    kv.v = view_of(v, "paged_kv.v");
    kv.layout = parse_kv_layout(layout);
    kv.scale = kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor);
    without_gil([&] { op_->run(qv, kv, ov, lv, stream_of(stream)); });
  }

  CascadePlanInfo plan_info() const { return op_->plan_info(); }

 private:
  Workspace ws_;  // declared first: destroyed after the op that uses it
  std::unique_ptr<MultiLevelCascade> op_;
};

void bind_cascade_structs(nb::module_& m) {
  using S = CascadeShape;
  StructBinding<S> shape(m, "CascadeShape", "Heads, head_dim and dtypes of a cascade plan.");
  shape.rw("num_qo_heads", &S::num_qo_heads)
      .rw("num_kv_heads", &S::num_kv_heads)
      .rw("head_dim", &S::head_dim)
      .rw_as(
          "dtype", [](const S& s) { return std::string(dtype_name(s.dtype)); },
          [](S& s, const std::string& v) { s.dtype = parse_dtype(v); })
      .rw_as(  // the q dtype, or an fp8 cache's
          "kv_dtype", [](const S& s) { return std::string(dtype_name(s.kv_dtype)); },
          [](S& s, const std::string& v) { s.kv_dtype = parse_dtype(v); })
      .finish();

  using O = CascadePlanOptions;
  StructBinding<O>(m, "CascadePlanOptions", "MultiLevelCascade.plan()'s options (cascade.h).")
      .rw("causal", &O::causal)
      .rw("sm_scale", &O::sm_scale)
      .rw_as(
          "use", [](const O& o) { return std::string(cascade_use_name(o.use)); },
          [](O& o, const std::string& u) { o.use = parse_cascade_use(u); })
      .rw("min_group_size", &O::min_group_size)
      .rw("enable_cuda_graph", &O::enable_cuda_graph)
      .finish();

  using I = CascadePlanInfo;
  StructBinding<I>(m, "CascadePlanInfo", "Statistics of MultiLevelCascade's last plan.")
      .ro("num_levels", &I::num_levels)
      .ro("cascade", &I::cascade)
      .ro("plain_kv_bytes", &I::plain_kv_bytes)
      .ro("cascade_kv_bytes", &I::cascade_kv_bytes)
      .ro("estimated_plain_us", &I::estimated_plain_us)
      .ro("estimated_cascade_us", &I::estimated_cascade_us)
      .ro("num_split_tiles", &I::num_split_tiles)
      .ro("split_limited", &I::split_limited)
      .ro("plan_us", &I::plan_us)
      .finish();
}

// The host path's plan check (the CPU reference runs no cascade): the checks the op runs, f32
// allowed; returns the largest page id as (id, entry).
nb::tuple check_host_cascade_plan(const OptionalIn& qo_indptr, const InArray& kv_indptr,
                                  const InArray& kv_indices, const InArray& kv_last_page_len,
                                  int page_size, const CascadeShape& shape,
                                  const PyPageTableNames& names) {
  CascadeBatch b =
      cascade_batch(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size, names, false);
  const PageTableNames n = names.view();
  check_cascade_plan(b, shape, PlanTarget::kHost, n);  // kv_indices null: checked below
  const int64_t nnz = b.batch_size > 0 ? b.kv_indptr[b.batch_size] : 0;
  b.kv_indices = host_i32(kv_indices, n.kv_indices, nnz);
  const PageIdMax mx = check_page_ids(b.kv_indices, nnz, 0, n.kv_indices);
  return nb::make_tuple(mx.id, mx.entry);
}

}  // namespace

void bind_cascade(nb::module_& m) {
  bind_cascade_structs(m);
  nb::class_<PyMultiLevelCascade>(m, "MultiLevelCascade")
      .def(nb::init<OutArray, int, int64_t, int64_t, int, int, int, int>(), arg("workspace"),
           arg("max_batch"), arg("max_qo_tokens"), arg("max_pages"), arg("num_qo_heads"),
           arg("head_dim"), arg("max_levels"), arg("device"))
      .def_static("workspace_bytes", &PyMultiLevelCascade::workspace_bytes, arg("max_batch"),
                  arg("max_qo_tokens"), arg("max_pages"), arg("num_qo_heads"), arg("head_dim"),
                  arg("max_levels"), arg("device"))
      .def_static("min_workspace_bytes", &PyMultiLevelCascade::min_workspace_bytes,
                  arg("max_batch"), arg("max_qo_tokens"), arg("max_pages"), arg("num_qo_heads"),
                  arg("head_dim"), arg("max_levels"), arg("device"))
      .def("plan", &PyMultiLevelCascade::plan, arg("qo_indptr").none(), arg("kv_indptr"),
           arg("kv_indices"), arg("kv_last_page_len"), arg("page_size"), arg("shape"),
           arg("options"), arg("names") = PyPageTableNames(), arg("stream") = 0)
      .def("run", &PyMultiLevelCascade::run, arg("q"), arg("k"), arg("v"), arg("layout"),
           arg("out"), arg("lse").none(), arg("stream"), FLASHKV_KV_SCALE_ARGS)
      .def("plan_info", &PyMultiLevelCascade::plan_info);
  m.def("check_host_cascade_plan", &check_host_cascade_plan, arg("qo_indptr").none(),
        arg("kv_indptr"), arg("kv_indices"), arg("kv_last_page_len"), arg("page_size"),
        arg("shape"), arg("names") = PyPageTableNames());
}

}  // namespace flashkv::python
