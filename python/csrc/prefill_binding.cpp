// Prefill from Python (flashkv/prefill.h): _C.BatchPrefillPaged / BatchPrefillRagged (the GPU
// ops), their plan options and statistics as classes (PrefillPlanOptions, PrefillPlanInfo),
// single_prefill, the CPU references of batch prefill and check_host_prefill_plan, the host
// path's copy of the plan's checks.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "binding_util.h"
#include "bindings.h"
#include "flashkv/plan_checks.h"
#include "flashkv/prefill.h"
#include "flashkv/reference.h"
#include "plan_binding.h"
#include "variant.h"

namespace flashkv::python {
namespace {

using nb::arg;

// FlashInfer's prefill backend names: "fa2" the mma.sync kernel, "fa3" the Hopper wgmma one.
PrefillBackend parse_prefill_backend(const std::string& b) {
  if (b == "auto") return PrefillBackend::kAuto;
  if (b == "fa2") return PrefillBackend::kMmaSync;
  if (b == "fa3") return PrefillBackend::kWgmma;
  fail("backend: expected 'auto', 'fa2' or 'fa3', got '", b, "'");
}

const char* prefill_backend_name(PrefillBackend b) {
  switch (b) {
    case PrefillBackend::kMmaSync:
      return "fa2";
    case PrefillBackend::kWgmma:
      return "fa3";
    default:
      return "auto";
  }
}

// The batch of host arrays: paged with kv_last_page_len (kv_indptr in pages), ragged without
// (kv_indptr in tokens, page_size 0). Named as `names` says; plan() checks the contents.
PrefillBatch prefill_batch(const InArray& qo_indptr, const InArray& kv_indptr,
                           const OptionalIn& kv_last_page_len, int page_size,
                           const PyPageTableNames& names) {
  PrefillBatch b;
  b.batch_size = batch_of(qo_indptr, names.qo_indptr.c_str());
  b.qo_indptr = host_i32(qo_indptr, names.qo_indptr.c_str(), b.batch_size + 1);
  b.kv_indptr = host_i32(kv_indptr, names.kv_indptr.c_str(), b.batch_size + 1);
  if (kv_last_page_len) {
    b.kv_last_page_len = host_i32(*kv_last_page_len, names.kv_last_page_len.c_str(), b.batch_size);
    b.page_size = page_size;
  }
  return b;
}

int64_t kv_entries(const PrefillBatch& b) {
  return b.batch_size > 0 ? b.kv_indptr[b.batch_size] : 0;
}

BatchPrefillConfig prefill_config(int max_batch, int64_t max_qo_tokens, int num_qo_heads,
                                  int head_dim, int device) {
  BatchPrefillConfig cfg;
  cfg.max_batch = max_batch;
  cfg.max_qo_tokens = max_qo_tokens;
  cfg.num_qo_heads = num_qo_heads;
  cfg.head_dim = head_dim;
  cfg.device = device;
  return cfg;
}

// BatchPrefillPaged and BatchPrefillRagged share construction and the plan's bookkeeping.
template <class Op>
class PyBatchPrefill {
 public:
  PyBatchPrefill(OutArray workspace, int max_batch, int64_t max_qo_tokens, int num_qo_heads,
                 int head_dim, int device)
      : ws_(std::move(workspace), device) {
    op_ = std::make_unique<Op>(
        prefill_config(max_batch, max_qo_tokens, num_qo_heads, head_dim, device), ws_.data,
        ws_.bytes);
  }

  static size_t workspace_bytes(int max_batch, int64_t max_qo_tokens, int num_qo_heads,
                                int head_dim, int device) {
    return Op::workspace_bytes(
        prefill_config(max_batch, max_qo_tokens, num_qo_heads, head_dim, device));
  }
  static size_t min_workspace_bytes(int max_batch, int64_t max_qo_tokens, int num_qo_heads,
                                    int head_dim, int device) {
    return Op::min_workspace_bytes(
        prefill_config(max_batch, max_qo_tokens, num_qo_heads, head_dim, device));
  }

  void forget_captured_graphs() { op_->forget_captured_graphs(); }
  PrefillPlanInfo plan_info() const { return op_->plan_info(); }

 protected:
  // The one place the GPU path checks the plan (the op's plan(), plan_checks.h).
  void plan_batch(const PrefillBatch& b, const AttentionShape& shape,
                  const PrefillPlanOptions& options, const PyVariant* variant,
                  const int32_t* kv_indices, const PyPageTableNames& names, uintptr_t stream) {
    PrefillPlanOptions o = options;
    if (variant != nullptr) o.variant = variant->variant;
    o.kv_indices_host = kv_indices;
    o.names = names.view();
    without_gil([&] { op_->plan(b, shape, o, stream_of(stream)); });
    // The plan holds the variant's device pointers: keep their arrays for as long as it runs.
    variant_keep_ = variant != nullptr ? variant->keep : std::vector<InArray>{};
  }

  Workspace ws_;  // declared first: destroyed after the op that uses it
  std::unique_ptr<Op> op_;
  std::vector<InArray> variant_keep_;  // arrays behind the plan's variant (PyVariant::keep)
};

class PyBatchPrefillPaged : public PyBatchPrefill<BatchPrefillPaged> {
 public:
  using PyBatchPrefill::PyBatchPrefill;

  // kv_indices: a host copy of the page ids (checked by plan(); run() compares the largest with
  // the cache) or None.
  void plan(const InArray& qo_indptr, const InArray& kv_indptr, const InArray& kv_last_page_len,
            int page_size, const AttentionShape& shape, const PrefillPlanOptions& options,
            const PyVariant* variant, const OptionalIn& kv_indices, const PyPageTableNames& names,
            uintptr_t stream) {
    const PrefillBatch b = prefill_batch(qo_indptr, kv_indptr, kv_last_page_len, page_size, names);
    const int32_t* ids =
        kv_indices ? host_i32(*kv_indices, names.kv_indices.c_str(), kv_entries(b)) : nullptr;
    plan_batch(b, shape, options, variant, ids, names, stream);
  }

  void run(const InArray& q, const InArray& k, const InArray& v, const std::string& layout,
           const InArray& indptr, const InArray& indices, const InArray& last_page_len,
           const OutArray& out, const LseArg& lse, uintptr_t stream, float k_scale, float v_scale,
           const OptionalIn& k_scale_tensor, const OptionalIn& v_scale_tensor) {
    const TensorView qv = view_of(q, "q"), ov = view_of(out, "out"), lv = view_of(lse, "lse");
    const PagedKVCache kv =
        paged_cache(k, v, layout, indptr, indices, last_page_len,
                    kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor));
    without_gil([&] { op_->run(qv, kv, ov, lv, stream_of(stream)); });
  }
};

class PyBatchPrefillRagged : public PyBatchPrefill<BatchPrefillRagged> {
 public:
  using PyBatchPrefill::PyBatchPrefill;

  void plan(const InArray& qo_indptr, const InArray& kv_indptr, const AttentionShape& shape,
            const PrefillPlanOptions& options, const PyVariant* variant,
            const PyPageTableNames& names, uintptr_t stream) {
    const PrefillBatch b = prefill_batch(qo_indptr, kv_indptr, std::nullopt, 0, names);
    plan_batch(b, shape, options, variant, nullptr, names, stream);
  }

  void run(const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
           const LseArg& lse, uintptr_t stream, float k_scale, float v_scale,
           const OptionalIn& k_scale_tensor, const OptionalIn& v_scale_tensor) {
    const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), vv = view_of(v, "v"),
                     ov = view_of(out, "out"), lv = view_of(lse, "lse");
    const KVScale scale = kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor);
    without_gil([&] { op_->run(qv, kv, vv, ov, lv, scale, stream_of(stream)); });
  }
};

void bind_prefill_structs(nb::module_& m) {
  using O = PrefillPlanOptions;
  StructBinding<O>(m, "PrefillPlanOptions",
                   "BatchPrefillPaged / BatchPrefillRagged.plan()'s options (flashkv/prefill.h).")
      .rw("causal", &O::causal)
      .rw("sm_scale", &O::sm_scale)
      .rw("fixed_split_size", &O::fixed_split_size)
      .rw("disable_split_kv", &O::disable_split_kv)
      .rw("enable_cuda_graph", &O::enable_cuda_graph)
      .rw("enable_pdl", &O::enable_pdl)
      .rw("tile_rows", &O::tile_rows)
      .rw("num_pages", &O::num_pages)
      .rw_as(
          "backend", [](const O& o) { return std::string(prefill_backend_name(o.backend)); },
          [](O& o, const std::string& b) { o.backend = parse_prefill_backend(b); })
      .finish();

  using I = PrefillPlanInfo;
  StructBinding<I>(m, "PrefillPlanInfo", "Statistics of a prefill op's last plan (prefill.h).")
      .ro("num_ctas", &I::num_ctas)
      .ro("num_work_items", &I::num_work_items)
      .ro("num_split_tiles", &I::num_split_tiles)
      .ro("num_partial_states", &I::num_partial_states)  // split-KV chunks (slots) the plan uses
      .ro("slot_capacity", &I::slot_capacity)            // slots the workspace holds for the plan
      .ro("split_limited", &I::split_limited)            // the workspace was short: fewer splits
      .ro("tile_rows", &I::tile_rows)
      .ro("chunk_bound", &I::chunk_bound)
      .ro("wgmma", &I::wgmma)
      .ro("kv_tma", &I::kv_tma)  // the last run() loaded KV by TMA (the warp-specialized kernel)
      .ro("plan_us", &I::plan_us)
      .finish();
}

template <class T>
void bind_prefill_common(nb::class_<T>& c) {
  c.def(nb::init<OutArray, int, int64_t, int, int, int>(), arg("workspace"), arg("max_batch"),
        arg("max_qo_tokens"), arg("num_qo_heads"), arg("head_dim"), arg("device"))
      .def_static("workspace_bytes", &T::workspace_bytes, arg("max_batch"), arg("max_qo_tokens"),
                  arg("num_qo_heads"), arg("head_dim"), arg("device"))
      .def_static("min_workspace_bytes", &T::min_workspace_bytes, arg("max_batch"),
                  arg("max_qo_tokens"), arg("num_qo_heads"), arg("head_dim"), arg("device"))
      .def("forget_captured_graphs", &T::forget_captured_graphs)
      .def("plan_info", &T::plan_info);
}

void bind_prefill_ops(nb::module_& m) {
  nb::class_<PyBatchPrefillPaged> paged(m, "BatchPrefillPaged");
  bind_prefill_common(paged);
  paged
      .def("plan", &PyBatchPrefillPaged::plan, arg("qo_indptr"), arg("kv_indptr"),
           arg("kv_last_page_len"), arg("page_size"), arg("shape"), arg("options"),
           arg("variant").none() = nb::none(), arg("kv_indices").none() = nb::none(),
           arg("names") = PyPageTableNames(), arg("stream") = 0)
      .def("run", &PyBatchPrefillPaged::run, arg("q"), arg("k"), arg("v"), arg("layout"),
           arg("indptr"), arg("indices"), arg("last_page_len"), arg("out"), arg("lse").none(),
           arg("stream"), FLASHKV_KV_SCALE_ARGS);

  nb::class_<PyBatchPrefillRagged> ragged(m, "BatchPrefillRagged");
  bind_prefill_common(ragged);
  ragged
      .def("plan", &PyBatchPrefillRagged::plan, arg("qo_indptr"), arg("kv_indptr"), arg("shape"),
           arg("options"), arg("variant").none() = nb::none(), arg("names") = PyPageTableNames(),
           arg("stream") = 0)
      .def("run", &PyBatchPrefillRagged::run, arg("q"), arg("k"), arg("v"), arg("out"),
           arg("lse").none(), arg("stream"), FLASHKV_KV_SCALE_ARGS);
}

// The host path's plan check (the CPU reference runs no prefill op): the checks the ops run, f32
// allowed; paged with kv_last_page_len. Returns the largest host page id as (id, entry), or None
// without host page ids (or ragged).
nb::object check_host_prefill_plan(const InArray& qo_indptr, const InArray& kv_indptr,
                                   const OptionalIn& kv_last_page_len, const OptionalIn& kv_indices,
                                   int page_size, const AttentionShape& sh,
                                   const PyPageTableNames& names) {
  const bool paged = kv_last_page_len.has_value();
  const PrefillBatch b = prefill_batch(qo_indptr, kv_indptr, kv_last_page_len, page_size, names);
  const PageTableNames n = names.view();
  check_prefill_plan(b.qo_indptr, b.kv_indptr, b.kv_last_page_len, b.batch_size, sh.num_qo_heads,
                     sh.num_kv_heads, sh.head_dim, page_size, paged, sh.q_dtype, sh.kv_dtype,
                     sh.o_dtype, PlanTarget::kHost, n, sh.kv_format);
  if (!paged || !kv_indices) return nb::none();
  const int64_t nnz = kv_entries(b);
  const PageIdMax mx =
      check_page_ids(host_i32(*kv_indices, n.kv_indices, nnz), nnz, 0, n.kv_indices);
  return nb::make_tuple(mx.id, mx.entry);
}

}  // namespace

void bind_prefill(nb::module_& m) {
  bind_prefill_structs(m);
  bind_prefill_ops(m);
  m.def("check_host_prefill_plan", &check_host_prefill_plan, arg("qo_indptr"), arg("kv_indptr"),
        arg("kv_last_page_len").none(), arg("kv_indices").none(), arg("page_size"), arg("shape"),
        arg("names") = PyPageTableNames());

  // One request over contiguous KV (host arrays: the CPU reference).
  m.def(
      "single_prefill",
      [](const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
         const LseArg& lse, const std::string& layout, bool causal, float sm_scale,
         uintptr_t stream, float k_scale, float v_scale, const OptionalIn& k_scale_tensor,
         const OptionalIn& v_scale_tensor) {
        const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), vv = view_of(v, "v"),
                         ov = view_of(out, "out"), lv = view_of(lse, "lse");
        const KVLayout l = parse_kv_layout(layout);
        const AttentionOptions o = attention_options(
            sm_scale, causal, kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor));
        without_gil([&] { single_prefill(qv, kv, vv, ov, lv, l, o, stream_of(stream)); });
      },
      arg("q"), arg("k"), arg("v"), arg("out"), arg("lse").none(), arg("layout"), arg("causal"),
      arg("sm_scale"), arg("stream"), FLASHKV_KV_SCALE_ARGS);

  // Batch prefill on host arrays: the CPU references (the prefill ops need a GPU).
  m.def(
      "reference_batch_prefill_paged",
      [](const InArray& q, const InArray& qo_indptr, const InArray& k, const InArray& v,
         const std::string& layout, const InArray& indptr, const InArray& indices,
         const InArray& last_page_len, const OutArray& out, const LseArg& lse, bool causal,
         float sm_scale, float k_scale, float v_scale, const OptionalIn& k_scale_tensor,
         const OptionalIn& v_scale_tensor, const std::string& kv_format,
         const OptionalIn& k_group_scale, const OptionalIn& v_group_scale, const OptionalIn& k_zero,
         const OptionalIn& v_zero) {
        const TensorView qv = view_of(q, "q"), qi = view_of(qo_indptr, "qo_indptr"),
                         ov = view_of(out, "out"), lv = view_of(lse, "lse");
        const PagedKVCache kv = paged_cache(
            k, v, layout, indptr, indices, last_page_len,
            with_group_scales(kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor),
                              kv_format, k_group_scale, v_group_scale, k_zero, v_zero));
        without_gil([&] {
          reference::batch_prefill_paged(qv, qi, kv, ov, lv, attention_options(sm_scale, causal));
        });
      },
      arg("q"), arg("qo_indptr"), arg("k"), arg("v"), arg("layout"), arg("indptr"), arg("indices"),
      arg("last_page_len"), arg("out"), arg("lse").none(), arg("causal"), arg("sm_scale"),
      FLASHKV_KV_SCALE_ARGS, FLASHKV_KV_GROUP_ARGS);
  m.def(
      "reference_batch_prefill_ragged",
      [](const InArray& q, const InArray& qo_indptr, const InArray& k, const InArray& v,
         const InArray& kv_indptr, const OutArray& out, const LseArg& lse, bool causal,
         float sm_scale, float k_scale, float v_scale, const OptionalIn& k_scale_tensor,
         const OptionalIn& v_scale_tensor) {
        const TensorView qv = view_of(q, "q"), qi = view_of(qo_indptr, "qo_indptr"),
                         kv = view_of(k, "k"), vv = view_of(v, "v"),
                         ki = view_of(kv_indptr, "kv_indptr"), ov = view_of(out, "out"),
                         lv = view_of(lse, "lse");
        const AttentionOptions o = attention_options(
            sm_scale, causal, kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor));
        without_gil([&] { reference::batch_prefill_ragged(qv, qi, kv, vv, ki, ov, lv, o); });
      },
      arg("q"), arg("qo_indptr"), arg("k"), arg("v"), arg("kv_indptr"), arg("out"),
      arg("lse").none(), arg("causal"), arg("sm_scale"), FLASHKV_KV_SCALE_ARGS);
}

}  // namespace flashkv::python
