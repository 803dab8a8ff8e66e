// flashkv._C: the C++ API as it is, for the Python package (python/flashkv). Arrays arrive as
// DLPack views (array_view.h); the FlashInfer-shaped wrappers, output allocation, stream choice
// and the LSE base live in Python. Every op releases the GIL while it runs; flashkv::Error becomes
// ValueError or RuntimeError with the C++ message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "array_view.h"
#include "binding_util.h"
#include "block_sparse_binding.h"
#include "flashkv/flashkv.h"
#include "variant.h"

namespace flashkv::python {
namespace {

using nb::arg;

AttentionOptions attention_options(float sm_scale, bool causal, const KVScale& kv_scale = {}) {
  AttentionOptions o;
  o.sm_scale = sm_scale;
  o.causal = causal;
  o.kv_scale = kv_scale;
  return o;
}

RopeOptions llama_rope(int rotary_dim, bool interleave, double rope_scale, double rope_theta) {
  RopeOptions o;
  o.rotary_dim = rotary_dim;
  o.interleave = interleave;
  o.rope_scale = rope_scale;
  o.rope_theta = rope_theta;
  return o;
}

Llama31RopeOptions llama31_rope(int rotary_dim, bool interleave, double rope_scale,
                                double rope_theta, double low_freq_factor, double high_freq_factor,
                                double old_context_len) {
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

DecodeStepOptions::Rope parse_step_rope(const std::string& rope) {
  using Rope = DecodeStepOptions::Rope;
  if (rope == "none") return Rope::kNone;
  if (rope == "llama") return Rope::kLlama;
  if (rope == "llama31") return Rope::kLlama31;
  if (rope == "cos_sin_cache") return Rope::kCosSinCache;
  fail("rope: expected 'none', 'llama', 'llama31' or 'cos_sin_cache', got '", rope, "'");
}

CascadePlanOptions::Use parse_cascade_use(const std::string& use) {
  using Use = CascadePlanOptions::Use;
  if (use == "auto") return Use::kAuto;
  if (use == "always") return Use::kAlways;
  if (use == "never") return Use::kNever;
  fail("use_cascade: expected 'auto', 'always' or 'never', got '", use, "'");
}

int batch_of(const InArray& indptr, const char* name) {
  check(indptr.ndim() == 1 && indptr.shape(0) >= 1, name,
        ": expected shape [batch + 1] with at least one entry");
  return static_cast<int>(indptr.shape(0)) - 1;
}

nb::dict prefill_info(const PrefillPlanInfo& i) {
  nb::dict d;
  d["num_ctas"] = i.num_ctas;
  d["num_work_items"] = i.num_work_items;
  d["num_split_tiles"] = i.num_split_tiles;
  d["num_partial_states"] = i.num_partial_states;  // split-KV chunks (slots) the plan uses
  d["slot_capacity"] = i.slot_capacity;            // slots the workspace holds for this plan
  d["split_limited"] = i.split_limited;            // the workspace was short: fewer splits
  d["tile_rows"] = i.tile_rows;
  d["chunk_bound"] = i.chunk_bound;
  d["wgmma"] = i.wgmma;
  d["kv_tma"] = i.kv_tma;  // the last run() loaded KV by TMA (the warp-specialized wgmma kernel)
  d["plan_us"] = i.plan_us;
  return d;
}

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

  void plan(const InArray& indptr, const InArray& last_page_len, int num_qo_heads, int num_kv_heads,
            int head_dim, int page_size, const std::string& q_dtype, const std::string& kv_dtype,
            const std::string& o_dtype, float sm_scale, bool enable_cuda_graph,
            int fixed_split_size, bool disable_split_kv, const PyVariant* variant,
            uintptr_t stream) {
    const int batch = batch_of(indptr, "indptr");
    const int32_t* ip = host_i32(indptr, "indptr", batch + 1);
    const int32_t* lp = host_i32(last_page_len, "last_page_len", batch);
    DecodePlanOptions o;
    o.sm_scale = sm_scale;
    o.enable_cuda_graph = enable_cuda_graph;
    o.fixed_split_size = fixed_split_size;
    o.disable_split_kv = disable_split_kv;
    if (variant != nullptr) o.variant = variant->variant;
    const DType qt = parse_dtype(q_dtype), kt = parse_dtype(kv_dtype), ot = parse_dtype(o_dtype);
    without_gil([&] {
      op_->plan(
          {.kv_indptr = ip, .kv_last_page_len = lp, .batch_size = batch, .page_size = page_size},
          {.num_qo_heads = num_qo_heads,
           .num_kv_heads = num_kv_heads,
           .head_dim = head_dim,
           .q_dtype = qt,
           .kv_dtype = kt,
           .o_dtype = ot},
          o, stream_of(stream));
    });
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

  nb::dict plan_info() const {
    const BatchDecode::PlanInfo i = op_->plan_info();
    nb::dict d;
    d["num_ctas"] = i.num_ctas;
    d["num_work_items"] = i.num_work_items;
    d["num_split_tiles"] = i.num_split_tiles;
    d["num_partial_states"] = i.num_partial_states;  // split-KV chunks (slots) the plan uses
    d["slot_capacity"] = i.slot_capacity;            // slots the workspace holds for this plan
    d["split_limited"] = i.split_limited;            // the workspace was short: fewer splits
    d["chunk_bound"] = i.chunk_bound;
    d["plan_us"] = i.plan_us;
    d["schedule_us"] = i.schedule_us;
    d["tensor_cores"] = i.tensor_cores;
    d["ctas_per_sm"] = i.ctas_per_sm;  // the kernel's shape (auto picks it per plan)
    d["warps"] = i.warps;
    return d;
  }

 private:
  Workspace ws_;  // declared first: destroyed after the op that uses it
  std::unique_ptr<BatchDecode> op_;
  std::vector<InArray> variant_keep_;  // arrays behind the plan's variant (PyVariant::keep)
};

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

// FlashInfer's prefill backend names: "fa2" the mma.sync kernel, "fa3" the Hopper wgmma one.
PrefillBackend prefill_backend(const std::string& b) {
  if (b == "auto") return PrefillBackend::kAuto;
  if (b == "fa2") return PrefillBackend::kMmaSync;
  if (b == "fa3") return PrefillBackend::kWgmma;
  fail("backend: expected 'auto', 'fa2' or 'fa3', got '", b, "'");
}

PrefillPlanOptions prefill_options(bool causal, float sm_scale, bool enable_cuda_graph,
                                   int fixed_split_size, bool disable_split_kv, int tile_rows,
                                   const PyVariant* variant, const std::string& backend) {
  PrefillPlanOptions o;
  o.backend = prefill_backend(backend);
  if (variant != nullptr) o.variant = variant->variant;
  o.tile_rows = tile_rows;
  o.causal = causal;
  o.sm_scale = sm_scale;
  o.enable_cuda_graph = enable_cuda_graph;
  o.fixed_split_size = fixed_split_size;
  o.disable_split_kv = disable_split_kv;
  return o;
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
  nb::dict plan_info() const { return prefill_info(op_->plan_info()); }

 protected:
  // The plan holds the variant's device pointers: keep their arrays for as long as it runs.
  void keep_variant(const PyVariant* variant) {
    variant_keep_ = variant != nullptr ? variant->keep : std::vector<InArray>{};
  }

  Workspace ws_;  // declared first: destroyed after the op that uses it
  std::unique_ptr<Op> op_;
  std::vector<InArray> variant_keep_;  // arrays behind the plan's variant (PyVariant::keep)
};

class PyBatchPrefillPaged : public PyBatchPrefill<BatchPrefillPaged> {
 public:
  using PyBatchPrefill::PyBatchPrefill;

  void plan(const InArray& qo_indptr, const InArray& kv_indptr, const InArray& last_page_len,
            int num_qo_heads, int num_kv_heads, int head_dim, int page_size,
            const std::string& q_dtype, const std::string& kv_dtype, const std::string& o_dtype,
            bool causal, float sm_scale, bool enable_cuda_graph, int fixed_split_size,
            bool disable_split_kv, int tile_rows, const PyVariant* variant,
            const std::string& backend, uintptr_t stream) {
    const int batch = batch_of(qo_indptr, "qo_indptr");
    const int32_t* qp = host_i32(qo_indptr, "qo_indptr", batch + 1);
    const int32_t* kp = host_i32(kv_indptr, "paged_kv_indptr", batch + 1);
    const int32_t* lp = host_i32(last_page_len, "paged_kv_last_page_len", batch);
    const PrefillPlanOptions o =
        prefill_options(causal, sm_scale, enable_cuda_graph, fixed_split_size, disable_split_kv,
                        tile_rows, variant, backend);
    const DType qt = parse_dtype(q_dtype), kt = parse_dtype(kv_dtype), ot = parse_dtype(o_dtype);
    without_gil([&] {
      op_->plan({.qo_indptr = qp,
                 .kv_indptr = kp,
                 .kv_last_page_len = lp,
                 .batch_size = batch,
                 .page_size = page_size},
                {.num_qo_heads = num_qo_heads,
                 .num_kv_heads = num_kv_heads,
                 .head_dim = head_dim,
                 .q_dtype = qt,
                 .kv_dtype = kt,
                 .o_dtype = ot},
                o, stream_of(stream));
    });
    keep_variant(variant);
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

  void plan(const InArray& qo_indptr, const InArray& kv_indptr, int num_qo_heads, int num_kv_heads,
            int head_dim, const std::string& q_dtype, const std::string& kv_dtype,
            const std::string& o_dtype, bool causal, float sm_scale, bool enable_cuda_graph,
            int fixed_split_size, bool disable_split_kv, int tile_rows, const PyVariant* variant,
            const std::string& backend, uintptr_t stream) {
    const int batch = batch_of(qo_indptr, "qo_indptr");
    const int32_t* qp = host_i32(qo_indptr, "qo_indptr", batch + 1);
    const int32_t* kp = host_i32(kv_indptr, "kv_indptr", batch + 1);
    const PrefillPlanOptions o =
        prefill_options(causal, sm_scale, enable_cuda_graph, fixed_split_size, disable_split_kv,
                        tile_rows, variant, backend);
    const DType qt = parse_dtype(q_dtype), kt = parse_dtype(kv_dtype), ot = parse_dtype(o_dtype);
    without_gil([&] {
      op_->plan({.qo_indptr = qp,
                 .kv_indptr = kp,
                 .kv_last_page_len = nullptr,
                 .batch_size = batch,
                 .page_size = 0},
                {.num_qo_heads = num_qo_heads,
                 .num_kv_heads = num_kv_heads,
                 .head_dim = head_dim,
                 .q_dtype = qt,
                 .kv_dtype = kt,
                 .o_dtype = ot},
                o, stream_of(stream));
    });
    keep_variant(variant);
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

  // Host page table of the whole batch; qo_indptr None: one query row per request (decode).
  void plan(const OptionalIn& qo_indptr, const InArray& kv_indptr, const InArray& kv_indices,
            const InArray& kv_last_page_len, int page_size, int num_qo_heads, int num_kv_heads,
            int head_dim, const std::string& dtype, const std::string& kv_dtype, bool causal,
            float sm_scale, const std::string& use_cascade, int min_group_size,
            bool enable_cuda_graph, uintptr_t stream) {
    CascadeBatch b;
    b.batch_size = batch_of(kv_indptr, "paged_kv_indptr");
    b.kv_indptr = host_i32(kv_indptr, "paged_kv_indptr", b.batch_size + 1);
    b.kv_indices = host_i32(kv_indices, "paged_kv_indices", b.kv_indptr[b.batch_size]);
    b.kv_last_page_len = host_i32(kv_last_page_len, "paged_kv_last_page_len", b.batch_size);
    b.qo_indptr = qo_indptr ? host_i32(*qo_indptr, "qo_indptr", b.batch_size + 1) : nullptr;
    b.page_size = page_size;
    CascadeShape shape;
    shape.num_qo_heads = num_qo_heads;
    shape.num_kv_heads = num_kv_heads;
    shape.head_dim = head_dim;
    shape.dtype = parse_dtype(dtype);
    shape.kv_dtype = parse_dtype(kv_dtype);  // the q dtype, or an fp8 cache's
    CascadePlanOptions o;
    o.causal = causal;
    o.sm_scale = sm_scale;
    o.use = parse_cascade_use(use_cascade);
    o.min_group_size = min_group_size;
    o.enable_cuda_graph = enable_cuda_graph;
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

  nb::dict plan_info() const {
    const CascadePlanInfo i = op_->plan_info();
    nb::dict d;
    d["num_levels"] = i.num_levels;
    d["cascade"] = i.cascade;
    d["plain_kv_bytes"] = i.plain_kv_bytes;
    d["cascade_kv_bytes"] = i.cascade_kv_bytes;
    d["estimated_plain_us"] = i.estimated_plain_us;
    d["estimated_cascade_us"] = i.estimated_cascade_us;
    d["num_split_tiles"] = i.num_split_tiles;
    d["split_limited"] = i.split_limited;
    d["plan_us"] = i.plan_us;
    return d;
  }

 private:
  Workspace ws_;  // declared first: destroyed after the op that uses it
  std::unique_ptr<MultiLevelCascade> op_;
};

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

// --- plan()'s argument checks (flashkv/plan_checks.h): the GPU ops run them in plan(); the
// wrappers' host path calls these, so both paths refuse the same plans with the same message.
// Names: the wrapper's argument names (qo_indptr, kv_indptr, kv_indices, kv_last_page_len).
struct PyNames {
  std::string qo, kv, indices, last;
  PageTableNames names() const { return {qo.c_str(), kv.c_str(), indices.c_str(), last.c_str()}; }
};

PlanTarget plan_target(bool host) { return host ? PlanTarget::kHost : PlanTarget::kGpu; }

// (largest page id, its entry) of a host page table, or None without one (device-resident ids).
nb::object page_id_max(const OptionalIn& indices, int64_t nnz, const PyNames& n) {
  if (!indices) return nb::none();
  const int32_t* ids = host_i32(*indices, n.indices.c_str(), nnz);
  const PageIdMax m = check_page_ids(ids, nnz, 0, n.indices.c_str());
  return nb::make_tuple(m.id, m.entry);
}

void bind_plan_checks(nb::module_& m) {
  m.def(
      "check_decode_plan",
      [](const InArray& indptr, const InArray& last_page_len, const OptionalIn& indices,
         int num_qo_heads, int num_kv_heads, int head_dim, int page_size,
         const std::string& q_dtype, const std::string& kv_dtype, const std::string& o_dtype,
         bool host, const std::string& indptr_name, const std::string& indices_name,
         const std::string& last_name) {
        const PyNames n{"qo_indptr", indptr_name, indices_name, last_name};
        const int batch = batch_of(indptr, n.kv.c_str());
        const int32_t* ip = host_i32(indptr, n.kv.c_str(), batch + 1);
        const int32_t* lp = host_i32(last_page_len, n.last.c_str(), batch);
        check_decode_plan(ip, lp, batch, num_qo_heads, num_kv_heads, head_dim, page_size,
                          parse_dtype(q_dtype), parse_dtype(kv_dtype), parse_dtype(o_dtype),
                          plan_target(host), n.names());
        return page_id_max(indices, batch > 0 ? ip[batch] : 0, n);
      },
      arg("indptr"), arg("last_page_len"), arg("indices").none(), arg("num_qo_heads"),
      arg("num_kv_heads"), arg("head_dim"), arg("page_size"), arg("q_dtype"), arg("kv_dtype"),
      arg("o_dtype"), arg("host"), arg("indptr_name") = "indptr", arg("indices_name") = "indices",
      arg("last_page_len_name") = "last_page_len");
  m.def(
      "check_prefill_plan",
      [](const InArray& qo_indptr, const InArray& kv_indptr, const OptionalIn& last_page_len,
         const OptionalIn& indices, int num_qo_heads, int num_kv_heads, int head_dim, int page_size,
         const std::string& q_dtype, const std::string& kv_dtype, const std::string& o_dtype,
         bool host, const std::string& qo_name, const std::string& kv_name,
         const std::string& indices_name, const std::string& last_name) {
        const PyNames n{qo_name, kv_name, indices_name, last_name};
        const bool paged = last_page_len.has_value();
        const int batch = batch_of(qo_indptr, n.qo.c_str());
        const int32_t* qp = host_i32(qo_indptr, n.qo.c_str(), batch + 1);
        const int32_t* kp = host_i32(kv_indptr, n.kv.c_str(), batch + 1);
        const int32_t* lp = paged ? host_i32(*last_page_len, n.last.c_str(), batch) : nullptr;
        check_prefill_plan(qp, kp, lp, batch, num_qo_heads, num_kv_heads, head_dim, page_size,
                           paged, parse_dtype(q_dtype), parse_dtype(kv_dtype), parse_dtype(o_dtype),
                           plan_target(host), n.names());
        return page_id_max(paged ? indices : OptionalIn(), batch > 0 ? kp[batch] : 0, n);
      },
      arg("qo_indptr"), arg("kv_indptr"), arg("last_page_len").none(), arg("indices").none(),
      arg("num_qo_heads"), arg("num_kv_heads"), arg("head_dim"), arg("page_size"), arg("q_dtype"),
      arg("kv_dtype"), arg("o_dtype"), arg("host"), arg("qo_indptr_name") = "qo_indptr",
      arg("kv_indptr_name") = "paged_kv_indptr", arg("indices_name") = "paged_kv_indices",
      arg("last_page_len_name") = "paged_kv_last_page_len");
  m.def(
      "check_cascade_plan",
      [](const OptionalIn& qo_indptr, const InArray& kv_indptr, const InArray& kv_indices,
         const InArray& kv_last_page_len, int page_size, int num_qo_heads, int num_kv_heads,
         int head_dim, const std::string& dtype, bool host) {
        const PyNames n{"qo_indptr", "paged_kv_indptr", "paged_kv_indices",
                        "paged_kv_last_page_len"};
        CascadeBatch b;
        b.batch_size = batch_of(kv_indptr, n.kv.c_str());
        b.kv_indptr = host_i32(kv_indptr, n.kv.c_str(), b.batch_size + 1);
        b.kv_last_page_len = host_i32(kv_last_page_len, n.last.c_str(), b.batch_size);
        b.qo_indptr = qo_indptr ? host_i32(*qo_indptr, n.qo.c_str(), b.batch_size + 1) : nullptr;
        b.page_size = page_size;
        CascadeShape shape;
        shape.num_qo_heads = num_qo_heads;
        shape.num_kv_heads = num_kv_heads;
        shape.head_dim = head_dim;
        shape.dtype = parse_dtype(dtype);
        // kv_indices null: its ids are checked below, once kv_indptr is known to be sound.
        check_cascade_plan(b, shape, plan_target(host), n.names());
        const int64_t nnz = b.batch_size > 0 ? b.kv_indptr[b.batch_size] : 0;
        b.kv_indices = host_i32(kv_indices, n.indices.c_str(), nnz);
        const PageIdMax mx = check_page_ids(b.kv_indices, nnz, 0, n.indices.c_str());
        return nb::make_tuple(mx.id, mx.entry);
      },
      arg("qo_indptr").none(), arg("kv_indptr"), arg("kv_indices"), arg("kv_last_page_len"),
      arg("page_size"), arg("num_qo_heads"), arg("num_kv_heads"), arg("head_dim"), arg("dtype"),
      arg("host"));
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
}  // namespace

void bind_module(nb::module_& m) {
  register_error_translator();
  bind_plan_checks(m);

  bind_variants(m);
  bind_block_sparse(m);
  m.def("fp8_view", &fp8_view, arg("array"), arg("dtype"));
  m.def("cuda_available", &cuda_available);
  m.def("cuda_unavailable_reason", &cuda_unavailable_reason);
  m.def("cuda_device_count", &cuda_device_count);
  m.def(
      "device_synchronize", [](int device) { without_gil([&] { device_synchronize(device); }); },
      arg("device"));

  // --- one request, contiguous KV (host arrays: the CPU reference) ---
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

  // --- batch ops on host arrays: the CPU reference (the Batch* objects below need a GPU) ---
  m.def(
      "reference_batch_decode",
      [](const InArray& q, const InArray& k, const InArray& v, const std::string& layout,
         const InArray& indptr, const InArray& indices, const InArray& last_page_len,
         const OutArray& out, const LseArg& lse, float sm_scale, float k_scale, float v_scale,
         const OptionalIn& k_scale_tensor, const OptionalIn& v_scale_tensor) {
        const TensorView qv = view_of(q, "q"), ov = view_of(out, "out"), lv = view_of(lse, "lse");
        const PagedKVCache kv =
            paged_cache(k, v, layout, indptr, indices, last_page_len,
                        kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor));
        without_gil(
            [&] { reference::batch_decode(qv, kv, ov, lv, attention_options(sm_scale, false)); });
      },
      arg("q"), arg("k"), arg("v"), arg("layout"), arg("indptr"), arg("indices"),
      arg("last_page_len"), arg("out"), arg("lse").none(), arg("sm_scale"), FLASHKV_KV_SCALE_ARGS);
  m.def(
      "reference_batch_prefill_paged",
      [](const InArray& q, const InArray& qo_indptr, const InArray& k, const InArray& v,
         const std::string& layout, const InArray& indptr, const InArray& indices,
         const InArray& last_page_len, const OutArray& out, const LseArg& lse, bool causal,
         float sm_scale, float k_scale, float v_scale, const OptionalIn& k_scale_tensor,
         const OptionalIn& v_scale_tensor) {
        const TensorView qv = view_of(q, "q"), qi = view_of(qo_indptr, "qo_indptr"),
                         ov = view_of(out, "out"), lv = view_of(lse, "lse");
        const PagedKVCache kv =
            paged_cache(k, v, layout, indptr, indices, last_page_len,
                        kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor));
        without_gil([&] {
          reference::batch_prefill_paged(qv, qi, kv, ov, lv, attention_options(sm_scale, causal));
        });
      },
      arg("q"), arg("qo_indptr"), arg("k"), arg("v"), arg("layout"), arg("indptr"), arg("indices"),
      arg("last_page_len"), arg("out"), arg("lse").none(), arg("causal"), arg("sm_scale"),
      FLASHKV_KV_SCALE_ARGS);
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

  // --- ⊕ (natural-log LSE) ---
  m.def(
      "merge_state",
      [](const InArray& v_a, const InArray& s_a, const InArray& v_b, const InArray& s_b,
         const OutArray& v_out, const OutArray& s_out, uintptr_t stream) {
        const TensorView va = view_of(v_a, "v_a"), sa = view_of(s_a, "s_a"),
                         vb = view_of(v_b, "v_b"), sb = view_of(s_b, "s_b"),
                         vo = view_of(v_out, "v_out"), so = view_of(s_out, "s_out");
        without_gil([&] { merge_state(va, sa, vb, sb, vo, so, stream_of(stream)); });
      },
      arg("v_a"), arg("s_a"), arg("v_b"), arg("s_b"), arg("v_out"), arg("s_out"), arg("stream"));
  m.def(
      "merge_state_in_place",
      [](const OutArray& v, const OutArray& s, const InArray& v_other, const InArray& s_other,
         uintptr_t stream) {
        const TensorView vv = view_of(v, "v"), sv = view_of(s, "s"),
                         vo = view_of(v_other, "v_other"), so = view_of(s_other, "s_other");
        without_gil([&] { merge_state_in_place(vv, sv, vo, so, stream_of(stream)); });
      },
      arg("v"), arg("s"), arg("v_other"), arg("s_other"), arg("stream"));
  m.def(
      "merge_states",
      [](const InArray& v, const InArray& s, const OutArray& v_out, const OutArray& s_out,
         uintptr_t stream) {
        const TensorView vv = view_of(v, "v"), sv = view_of(s, "s"), vo = view_of(v_out, "v_out"),
                         so = view_of(s_out, "s_out");
        without_gil([&] { merge_states(vv, sv, vo, so, stream_of(stream)); });
      },
      arg("v"), arg("s"), arg("v_out"), arg("s_out"), arg("stream"));

  // --- KV-cache ops (kv_ops.h): host arrays run the CPU reference ---
  m.def(
      "append_paged_kv_cache",
      [](const InArray& append_key, const InArray& append_value, const InArray& batch_indices,
         const InArray& positions, const OutArray& k, const OutArray& v, const std::string& layout,
         const InArray& indptr, const InArray& indices, const InArray& last_page_len,
         uintptr_t stream, float k_scale, float v_scale, const OptionalIn& k_scale_tensor,
         const OptionalIn& v_scale_tensor) {
        const TensorView ak = view_of(append_key, "append_key"),
                         av = view_of(append_value, "append_value"),
                         bi = view_of(batch_indices, "batch_indices"),
                         pos = view_of(positions, "positions");
        const PagedKVCache kv =
            paged_cache(k, v, layout, indptr, indices, last_page_len,
                        kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor));
        without_gil([&] { append_paged_kv_cache(ak, av, bi, pos, kv, stream_of(stream)); });
      },
      arg("append_key"), arg("append_value"), arg("batch_indices"), arg("positions"), arg("k"),
      arg("v"), arg("layout"), arg("indptr"), arg("indices"), arg("last_page_len"), arg("stream"),
      FLASHKV_KV_SCALE_ARGS);
  m.def(
      "get_batch_indices_positions",
      [](const InArray& append_indptr, const InArray& seq_lens, const OutArray& batch_indices,
         const OutArray& positions, uintptr_t stream) {
        const TensorView ai = view_of(append_indptr, "append_indptr"),
                         sl = view_of(seq_lens, "seq_lens"),
                         bi = view_of(batch_indices, "batch_indices"),
                         pos = view_of(positions, "positions");
        without_gil([&] { get_batch_indices_positions(ai, sl, bi, pos, stream_of(stream)); });
      },
      arg("append_indptr"), arg("seq_lens"), arg("batch_indices"), arg("positions"), arg("stream"));

  // --- RoPE (rope.h): in place when q_rope is q and k_rope is k ---
  m.def(
      "apply_rope",
      [](const InArray& q, const InArray& k, const OutArray& q_rope, const OutArray& k_rope,
         const InArray& indptr, const InArray& offsets, int rotary_dim, bool interleave,
         double rope_scale, double rope_theta, uintptr_t stream) {
        const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), qr = view_of(q_rope, "q_rope"),
                         kr = view_of(k_rope, "k_rope"), ip = view_of(indptr, "indptr"),
                         off = view_of(offsets, "offsets");
        const RopeOptions o = llama_rope(rotary_dim, interleave, rope_scale, rope_theta);
        without_gil([&] { apply_rope(qv, kv, qr, kr, ip, off, o, stream_of(stream)); });
      },
      arg("q"), arg("k"), arg("q_rope"), arg("k_rope"), arg("indptr"), arg("offsets"),
      arg("rotary_dim"), arg("interleave"), arg("rope_scale"), arg("rope_theta"), arg("stream"));
  m.def(
      "apply_rope_pos_ids",
      [](const InArray& q, const InArray& k, const OutArray& q_rope, const OutArray& k_rope,
         const InArray& pos_ids, int rotary_dim, bool interleave, double rope_scale,
         double rope_theta, uintptr_t stream) {
        const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), qr = view_of(q_rope, "q_rope"),
                         kr = view_of(k_rope, "k_rope"), pos = view_of(pos_ids, "pos_ids");
        const RopeOptions o = llama_rope(rotary_dim, interleave, rope_scale, rope_theta);
        without_gil([&] { apply_rope_pos_ids(qv, kv, qr, kr, pos, o, stream_of(stream)); });
      },
      arg("q"), arg("k"), arg("q_rope"), arg("k_rope"), arg("pos_ids"), arg("rotary_dim"),
      arg("interleave"), arg("rope_scale"), arg("rope_theta"), arg("stream"));
  m.def(
      "apply_llama31_rope",
      [](const InArray& q, const InArray& k, const OutArray& q_rope, const OutArray& k_rope,
         const InArray& indptr, const InArray& offsets, int rotary_dim, bool interleave,
         double rope_scale, double rope_theta, double low_freq_factor, double high_freq_factor,
         double old_context_len, uintptr_t stream) {
        const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), qr = view_of(q_rope, "q_rope"),
                         kr = view_of(k_rope, "k_rope"), ip = view_of(indptr, "indptr"),
                         off = view_of(offsets, "offsets");
        const Llama31RopeOptions o =
            llama31_rope(rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor,
                         high_freq_factor, old_context_len);
        without_gil([&] { apply_llama31_rope(qv, kv, qr, kr, ip, off, o, stream_of(stream)); });
      },
      arg("q"), arg("k"), arg("q_rope"), arg("k_rope"), arg("indptr"), arg("offsets"),
      arg("rotary_dim"), arg("interleave"), arg("rope_scale"), arg("rope_theta"),
      arg("low_freq_factor"), arg("high_freq_factor"), arg("old_context_len"), arg("stream"));
  m.def(
      "apply_llama31_rope_pos_ids",
      [](const InArray& q, const InArray& k, const OutArray& q_rope, const OutArray& k_rope,
         const InArray& pos_ids, int rotary_dim, bool interleave, double rope_scale,
         double rope_theta, double low_freq_factor, double high_freq_factor, double old_context_len,
         uintptr_t stream) {
        const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), qr = view_of(q_rope, "q_rope"),
                         kr = view_of(k_rope, "k_rope"), pos = view_of(pos_ids, "pos_ids");
        const Llama31RopeOptions o =
            llama31_rope(rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor,
                         high_freq_factor, old_context_len);
        without_gil([&] { apply_llama31_rope_pos_ids(qv, kv, qr, kr, pos, o, stream_of(stream)); });
      },
      arg("q"), arg("k"), arg("q_rope"), arg("k_rope"), arg("pos_ids"), arg("rotary_dim"),
      arg("interleave"), arg("rope_scale"), arg("rope_theta"), arg("low_freq_factor"),
      arg("high_freq_factor"), arg("old_context_len"), arg("stream"));
  m.def(
      "apply_rope_with_cos_sin_cache",
      [](const InArray& q, const InArray& k, const OutArray& q_rope, const OutArray& k_rope,
         const InArray& positions, const InArray& cos_sin_cache, bool is_neox, uintptr_t stream) {
        const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), qr = view_of(q_rope, "q_rope"),
                         kr = view_of(k_rope, "k_rope"), pos = view_of(positions, "positions"),
                         cs = view_of(cos_sin_cache, "cos_sin_cache");
        without_gil([&] {
          apply_rope_with_cos_sin_cache(qv, kv, qr, kr, pos, cs, is_neox, stream_of(stream));
        });
      },
      arg("q"), arg("k"), arg("q_rope"), arg("k_rope"), arg("positions"), arg("cos_sin_cache"),
      arg("is_neox"), arg("stream"));

  // --- errors recorded by kernels from device-resident input (device_errors.h) ---
  m.def(
      "check_device_errors",
      [](int device, uintptr_t stream) {
        without_gil([&] { check_device_errors(device, stream_of(stream)); });
      },
      arg("device"), arg("stream"));

  // --- plan/run objects (CUDA workspace) ---
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
      .def("plan", &PyBatchDecode::plan, arg("indptr"), arg("last_page_len"), arg("num_qo_heads"),
           arg("num_kv_heads"), arg("head_dim"), arg("page_size"), arg("q_dtype"), arg("kv_dtype"),
           arg("o_dtype"), arg("sm_scale"), arg("enable_cuda_graph"), arg("fixed_split_size"),
           arg("disable_split_kv"), arg("variant").none(), arg("stream"))
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

  nb::class_<PyBatchPrefillPaged> paged(m, "BatchPrefillPaged");
  bind_prefill_common(paged);
  paged
      .def("plan", &PyBatchPrefillPaged::plan, arg("qo_indptr"), arg("kv_indptr"),
           arg("last_page_len"), arg("num_qo_heads"), arg("num_kv_heads"), arg("head_dim"),
           arg("page_size"), arg("q_dtype"), arg("kv_dtype"), arg("o_dtype"), arg("causal"),
           arg("sm_scale"), arg("enable_cuda_graph"), arg("fixed_split_size"),
           arg("disable_split_kv"), arg("tile_rows"), arg("variant").none(), arg("backend"),
           arg("stream"))
      .def("run", &PyBatchPrefillPaged::run, arg("q"), arg("k"), arg("v"), arg("layout"),
           arg("indptr"), arg("indices"), arg("last_page_len"), arg("out"), arg("lse").none(),
           arg("stream"), FLASHKV_KV_SCALE_ARGS);

  nb::class_<PyBatchPrefillRagged> ragged(m, "BatchPrefillRagged");
  bind_prefill_common(ragged);
  ragged
      .def("plan", &PyBatchPrefillRagged::plan, arg("qo_indptr"), arg("kv_indptr"),
           arg("num_qo_heads"), arg("num_kv_heads"), arg("head_dim"), arg("q_dtype"),
           arg("kv_dtype"), arg("o_dtype"), arg("causal"), arg("sm_scale"),
           arg("enable_cuda_graph"), arg("fixed_split_size"), arg("disable_split_kv"),
           arg("tile_rows"), arg("variant").none(), arg("backend"), arg("stream"))
      .def("run", &PyBatchPrefillRagged::run, arg("q"), arg("k"), arg("v"), arg("out"),
           arg("lse").none(), arg("stream"), FLASHKV_KV_SCALE_ARGS);

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
           arg("kv_indices"), arg("kv_last_page_len"), arg("page_size"), arg("num_qo_heads"),
           arg("num_kv_heads"), arg("head_dim"), arg("dtype"), arg("kv_dtype"), arg("causal"),
           arg("sm_scale"), arg("use_cascade"), arg("min_group_size"), arg("enable_cuda_graph"),
           arg("stream"))
      .def("run", &PyMultiLevelCascade::run, arg("q"), arg("k"), arg("v"), arg("layout"),
           arg("out"), arg("lse").none(), arg("stream"), FLASHKV_KV_SCALE_ARGS)
      .def("plan_info", &PyMultiLevelCascade::plan_info);
}

}  // namespace flashkv::python

NB_MODULE(_C, m) {
  m.doc() = "flashkv's C++ API (natural-log LSE); use the wrappers in the flashkv package.";
  flashkv::python::bind_module(m);
}
