// Decode from Python (flashkv/decode.h): _C.BatchDecode (the GPU op), its plan options and
// statistics as classes (DecodePlanOptions, DecodePlanInfo), single_decode, the CPU reference of
// batch decode and check_decode_plan, the host path's copy of the plan's checks.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "binding_util.h"
#include "bindings.h"
#include "flashkv/decode.h"
#include "flashkv/plan_checks.h"
#include "flashkv/reference.h"
#include "plan_binding.h"
#include "variant.h"

namespace flashkv::python {
namespace {

using nb::arg;

DecodeStepOptions::Rope parse_step_rope(const std::string& rope) {
  using Rope = DecodeStepOptions::Rope;
  if (rope == "none") return Rope::kNone;
  if (rope == "llama") return Rope::kLlama;
  if (rope == "llama31") return Rope::kLlama31;
  if (rope == "cos_sin_cache") return Rope::kCosSinCache;
  fail("rope: expected 'none', 'llama', 'llama31' or 'cos_sin_cache', got '", rope, "'");
}

const char* decode_backend_name(DecodeBackend b) {
  switch (b) {
    case DecodeBackend::kCudaCores:
      return "cuda_cores";
    case DecodeBackend::kTensorCores:
      return "tensor_cores";
    default:
      return "auto";
  }
}

DecodeBackend parse_decode_backend(const std::string& b) {
  if (b == "auto") return DecodeBackend::kAuto;
  if (b == "cuda_cores") return DecodeBackend::kCudaCores;
  if (b == "tensor_cores") return DecodeBackend::kTensorCores;
  fail("backend: expected 'auto', 'cuda_cores' or 'tensor_cores', got '", b, "'");
}

// The batch of a host page table, named as `names` says (the sizes are checked by plan()).
DecodeBatch decode_batch(const InArray& kv_indptr, const InArray& kv_last_page_len, int page_size,
                         const PyPageTableNames& names) {
  DecodeBatch b;
  b.batch_size = batch_of(kv_indptr, names.kv_indptr.c_str());
  b.kv_indptr = host_i32(kv_indptr, names.kv_indptr.c_str(), b.batch_size + 1);
  b.kv_last_page_len = host_i32(kv_last_page_len, names.kv_last_page_len.c_str(), b.batch_size);
  b.page_size = page_size;
  return b;
}

int64_t pages_of(const DecodeBatch& b) { return b.batch_size > 0 ? b.kv_indptr[b.batch_size] : 0; }

BatchDecodeConfig decode_config(int max_batch, int num_qo_heads, int head_dim, int device,
                                int64_t max_kv_tokens, int min_fixed_split_size) {
  BatchDecodeConfig cfg;
  cfg.max_batch = max_batch;
  cfg.num_qo_heads = num_qo_heads;
  cfg.head_dim = head_dim;
  cfg.device = device;
  cfg.max_kv_tokens = max_kv_tokens;
  cfg.min_fixed_split_size = min_fixed_split_size;
  return cfg;
}

class PyBatchDecode {
 public:
  PyBatchDecode(OutArray workspace, int max_batch, int num_qo_heads, int head_dim, int device,
                int64_t max_kv_tokens, int min_fixed_split_size)
      : ws_(std::move(workspace), device) {
    op_ = std::make_unique<BatchDecode>(decode_config(max_batch, num_qo_heads, head_dim, device,
                                                      max_kv_tokens, min_fixed_split_size),
                                        ws_.data, ws_.bytes);
  }

  static size_t workspace_bytes(int max_batch, int num_qo_heads, int head_dim, int device,
                                int64_t max_kv_tokens, int min_fixed_split_size) {
    return BatchDecode::workspace_bytes(decode_config(max_batch, num_qo_heads, head_dim, device,
                                                      max_kv_tokens, min_fixed_split_size));
  }
  static size_t min_workspace_bytes(int max_batch, int num_qo_heads, int head_dim, int device,
                                    int64_t max_kv_tokens, int min_fixed_split_size) {
    return BatchDecode::min_workspace_bytes(decode_config(max_batch, num_qo_heads, head_dim, device,
                                                          max_kv_tokens, min_fixed_split_size));
  }
  // The chunks a fixed_split_size plan of this page table needs room for (decode.h).
  static int64_t fixed_split_chunks(const InArray& kv_indptr, const InArray& kv_last_page_len,
                                    int page_size, int fixed_split_size) {
    return BatchDecode::fixed_split_chunks(
        decode_batch(kv_indptr, kv_last_page_len, page_size, PyPageTableNames{}), fixed_split_size);
  }

  // The one place the GPU path checks the plan (BatchDecode::plan, plan_checks.h): kv_indices, a
  // host copy of the page ids or None, is checked there too, and run() compares its largest id
  // with the cache.
  void plan(const InArray& kv_indptr, const InArray& kv_last_page_len, int page_size,
            const AttentionShape& shape, const DecodePlanOptions& options, const PyVariant* variant,
            const OptionalIn& kv_indices, const PyPageTableNames& names, uintptr_t stream) {
    const DecodeBatch b = decode_batch(kv_indptr, kv_last_page_len, page_size, names);
    DecodePlanOptions o = options;
    if (variant != nullptr) o.variant = variant->variant;
    o.kv_indices_host =
        kv_indices ? host_i32(*kv_indices, names.kv_indices.c_str(), pages_of(b)) : nullptr;
    o.names = names.view();
    without_gil([&] { op_->plan(b, shape, o, stream_of(stream)); });
    // The plan holds the variant's device pointers: keep their arrays for as long as it runs.
    variant_keep_ = variant != nullptr ? variant->keep : std::vector<InArray>{};
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

  // The fused step. rope: "none", "llama", "llama31" or "cos_sin_cache"; the Llama options are
  // read for "llama", the Llama 3.1 ones for "llama31", cos_sin_cache / is_neox for
  // "cos_sin_cache".
  void run_step(const InArray& q, const InArray& k_new, const InArray& v_new, const OutArray& k,
                const OutArray& v, const std::string& layout, const InArray& indptr,
                const InArray& indices, const InArray& last_page_len, const OutArray& out,
                const LseArg& lse, const std::string& rope, int rotary_dim, bool interleave,
                double rope_scale, double rope_theta, double low_freq_factor,
                double high_freq_factor, double old_context_len, const OptionalIn& cos_sin_cache,
                bool is_neox, const OptionalIn& pos_ids, uintptr_t stream, float k_scale,
                float v_scale, const OptionalIn& k_scale_tensor, const OptionalIn& v_scale_tensor) {
    const TensorView qv = view_of(q, "q"), kn = view_of(k_new, "k_new"),
                     vn = view_of(v_new, "v_new"), ov = view_of(out, "out"),
                     lv = view_of(lse, "lse");
    const PagedKVCache kv =
        paged_cache(k, v, layout, indptr, indices, last_page_len,
                    kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor));
    DecodeStepOptions step;
    step.rope = parse_step_rope(rope);
    step.llama = llama_rope(rotary_dim, interleave, rope_scale, rope_theta);
    step.llama31 = llama31_rope(rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor,
                                high_freq_factor, old_context_len);
    step.cos_sin_cache = view_of(cos_sin_cache, "cos_sin_cache");
    step.is_neox = is_neox;
    step.pos_ids = view_of(pos_ids, "pos_ids");
    check(step.rope != DecodeStepOptions::Rope::kCosSinCache || step.cos_sin_cache.defined(),
          "cos_sin_cache: required with rope='cos_sin_cache'");
    without_gil([&] { op_->run_step(qv, kn, vn, kv, ov, lv, step, stream_of(stream)); });
  }

  void forget_captured_graphs() { op_->forget_captured_graphs(); }
  BatchDecode::PlanInfo plan_info() const { return op_->plan_info(); }

 private:
  Workspace ws_;  // declared first: destroyed after the op that uses it
  std::unique_ptr<BatchDecode> op_;
  std::vector<InArray> variant_keep_;  // arrays behind the plan's variant (PyVariant::keep)
};

void bind_decode_structs(nb::module_& m) {
  using O = DecodePlanOptions;
  StructBinding<O>(m, "DecodePlanOptions", "BatchDecode.plan()'s options (flashkv/decode.h).")
      .rw("sm_scale", &O::sm_scale)
      .rw("fixed_split_size", &O::fixed_split_size)
      .rw("disable_split_kv", &O::disable_split_kv)
      .rw("work_item_cost_tokens", &O::work_item_cost_tokens)
      .rw("min_chunk_tokens", &O::min_chunk_tokens)
      .rw("balance_chunk_bound", &O::balance_chunk_bound)
      .rw("balance_tail", &O::balance_tail)
      .rw("enable_cuda_graph", &O::enable_cuda_graph)
      .rw("enable_pdl", &O::enable_pdl)
      .rw_as(
          "backend", [](const O& o) { return std::string(decode_backend_name(o.backend)); },
          [](O& o, const std::string& b) { o.backend = parse_decode_backend(b); })
      .rw("tc_stages", &O::tc_stages)
      .rw("tc_warps", &O::tc_warps)
      .rw("num_pages", &O::num_pages)
      .rw("check_page_ids", &O::check_page_ids)
      .finish();

  using I = BatchDecode::PlanInfo;
  StructBinding<I>(m, "DecodePlanInfo", "Statistics of BatchDecode's last plan (decode.h).")
      .ro("num_ctas", &I::num_ctas)
      .ro("num_work_items", &I::num_work_items)
      .ro("num_split_tiles", &I::num_split_tiles)
      .ro("num_partial_states", &I::num_partial_states)  // split-KV chunks (slots) the plan uses
      .ro("slot_capacity", &I::slot_capacity)            // slots the workspace holds for the plan
      .ro("split_limited", &I::split_limited)            // the workspace was short: fewer splits
      .ro("chunk_bound", &I::chunk_bound)
      .ro("plan_us", &I::plan_us)
      .ro("schedule_us", &I::schedule_us)
      .ro("tensor_cores", &I::tensor_cores)
      .ro("ctas_per_sm", &I::ctas_per_sm)  // the kernel's shape (auto picks it per plan)
      .ro("warps", &I::warps)
      .ro("kernel_id", &I::kernel_id)
      .finish();
}

void bind_decode_op(nb::module_& m) {
  nb::class_<PyBatchDecode>(m, "BatchDecode")
      .def(nb::init<OutArray, int, int, int, int, int64_t, int>(), arg("workspace"),
           arg("max_batch"), arg("num_qo_heads"), arg("head_dim"), arg("device"),
           arg("max_kv_tokens") = 0, arg("min_fixed_split_size") = 0)
      .def_static("workspace_bytes", &PyBatchDecode::workspace_bytes, arg("max_batch"),
                  arg("num_qo_heads"), arg("head_dim"), arg("device"), arg("max_kv_tokens") = 0,
                  arg("min_fixed_split_size") = 0)
      .def_static("min_workspace_bytes", &PyBatchDecode::min_workspace_bytes, arg("max_batch"),
                  arg("num_qo_heads"), arg("head_dim"), arg("device"), arg("max_kv_tokens") = 0,
                  arg("min_fixed_split_size") = 0)
      .def_static("fixed_split_chunks", &PyBatchDecode::fixed_split_chunks, arg("kv_indptr"),
                  arg("kv_last_page_len"), arg("page_size"), arg("fixed_split_size"))
      .def("plan", &PyBatchDecode::plan, arg("kv_indptr"), arg("kv_last_page_len"),
           arg("page_size"), arg("shape"), arg("options"), arg("variant").none() = nb::none(),
           arg("kv_indices").none() = nb::none(), arg("names") = PyPageTableNames(),
           arg("stream") = 0)
      .def("run", &PyBatchDecode::run, arg("q"), arg("k"), arg("v"), arg("layout"), arg("indptr"),
           arg("indices"), arg("last_page_len"), arg("out"), arg("lse").none(), arg("stream"),
           FLASHKV_KV_SCALE_ARGS)
      .def("run_step", &PyBatchDecode::run_step, arg("q"), arg("k_new"), arg("v_new"), arg("k"),
           arg("v"), arg("layout"), arg("indptr"), arg("indices"), arg("last_page_len"), arg("out"),
           arg("lse").none(), arg("rope"), arg("rotary_dim"), arg("interleave"), arg("rope_scale"),
           arg("rope_theta"), arg("low_freq_factor"), arg("high_freq_factor"),
           arg("old_context_len"), arg("cos_sin_cache").none(), arg("is_neox"),
           arg("pos_ids").none(), arg("stream"), FLASHKV_KV_SCALE_ARGS)
      .def("forget_captured_graphs", &PyBatchDecode::forget_captured_graphs)
      .def("plan_info", &PyBatchDecode::plan_info);
}

// The host path's plan check (the CPU reference runs no BatchDecode): the checks the op runs,
// f32 allowed, and the largest host page id as (id, entry), or None without host page ids.
nb::object check_host_decode_plan(const InArray& kv_indptr, const InArray& kv_last_page_len,
                                  const OptionalIn& kv_indices, int page_size,
                                  const AttentionShape& sh, const PyPageTableNames& names) {
  const DecodeBatch b = decode_batch(kv_indptr, kv_last_page_len, page_size, names);
  const PageTableNames n = names.view();
  check_decode_plan(b.kv_indptr, b.kv_last_page_len, b.batch_size, sh.num_qo_heads, sh.num_kv_heads,
                    sh.head_dim, b.page_size, sh.q_dtype, sh.kv_dtype, sh.o_dtype,
                    PlanTarget::kHost, n, sh.kv_format);
  if (!kv_indices) return nb::none();
  const int64_t nnz = pages_of(b);
  const PageIdMax mx =
      check_page_ids(host_i32(*kv_indices, n.kv_indices, nnz), nnz, 0, n.kv_indices);
  return nb::make_tuple(mx.id, mx.entry);
}

}  // namespace

void bind_decode(nb::module_& m) {
  bind_decode_structs(m);
  bind_decode_op(m);
  m.def("check_host_decode_plan", &check_host_decode_plan, arg("kv_indptr"),
        arg("kv_last_page_len"), arg("kv_indices").none(), arg("page_size"), arg("shape"),
        arg("names") = PyPageTableNames());

  // One request over contiguous KV (host arrays: the CPU reference).
  m.def(
      "single_decode",
      [](const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
         const LseArg& lse, const std::string& layout, float sm_scale, uintptr_t stream,
         float k_scale, float v_scale, const OptionalIn& k_scale_tensor,
         const OptionalIn& v_scale_tensor) {
        const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), vv = view_of(v, "v"),
                         ov = view_of(out, "out"), lv = view_of(lse, "lse");
        const KVLayout l = parse_kv_layout(layout);
        const AttentionOptions o = attention_options(
            sm_scale, false, kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor));
        without_gil([&] { single_decode(qv, kv, vv, ov, lv, l, o, stream_of(stream)); });
      },
      arg("q"), arg("k"), arg("v"), arg("out"), arg("lse").none(), arg("layout"), arg("sm_scale"),
      arg("stream"), FLASHKV_KV_SCALE_ARGS);

  // Batch decode on host arrays: the CPU reference (BatchDecode needs a GPU).
  m.def(
      "reference_batch_decode",
      [](const InArray& q, const InArray& k, const InArray& v, const std::string& layout,
         const InArray& indptr, const InArray& indices, const InArray& last_page_len,
         const OutArray& out, const LseArg& lse, float sm_scale, float k_scale, float v_scale,
         const OptionalIn& k_scale_tensor, const OptionalIn& v_scale_tensor,
         const std::string& kv_format, const OptionalIn& k_group_scale,
         const OptionalIn& v_group_scale, const OptionalIn& k_zero, const OptionalIn& v_zero) {
        const TensorView qv = view_of(q, "q"), ov = view_of(out, "out"), lv = view_of(lse, "lse");
        const PagedKVCache kv = paged_cache(
            k, v, layout, indptr, indices, last_page_len,
            with_group_scales(kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor),
                              kv_format, k_group_scale, v_group_scale, k_zero, v_zero));
        without_gil(
            [&] { reference::batch_decode(qv, kv, ov, lv, attention_options(sm_scale, false)); });
      },
      arg("q"), arg("k"), arg("v"), arg("layout"), arg("indptr"), arg("indices"),
      arg("last_page_len"), arg("out"), arg("lse").none(), arg("sm_scale"), FLASHKV_KV_SCALE_ARGS,
      FLASHKV_KV_GROUP_ARGS);
}

}  // namespace flashkv::python
