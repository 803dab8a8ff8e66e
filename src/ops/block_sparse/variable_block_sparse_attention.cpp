// VariableBlockSparseAttention (flashkv/block_sparse.h): one batch prefill per KV head, each over
// that head's keys as pages of one token (variable_paged_plan.h), its query heads and outputs
// read and written through strided views, so no copy of q, k or out is made. The workspace holds,
// per KV head, the prefill op's workspace and this op's device copy of its page ids and mask.
// plan() plans every head's prefill, then uploads all heads' ids and masks in one PlanLifecycle
// upload (after the last run() that read them); run() launches the heads in order on `stream`.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "flashkv/block_sparse.h"
#include "flashkv/error.h"
#include "flashkv/prefill.h"
#include "flashkv/variant_spec.h"
#include "ops/block_sparse/sparse_positions_variant.h"
#include "ops/block_sparse/variable_paged_plan.h"
#include "ops/common/plan_lifecycle.h"
#include "runtime/driver.h"

namespace flashkv {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

BatchPrefillConfig head_prefill_config(const VariableBlockSparseConfig& c) {
  BatchPrefillConfig p;
  p.max_batch = static_cast<int>(c.max_block_rows);
  p.max_qo_tokens = c.max_rows;
  p.num_qo_heads = c.num_qo_heads;  // bounds the group
  p.head_dim = c.head_dim;
  p.device = c.device;
  return p;
}

// One head's slice of the workspace: the prefill workspace (`prefill` bytes), then page ids, mask
// offsets, mask.
struct HeadLayout {
  size_t prefill = 0, ids = 0, mask_indptr = 0, mask = 0, kv_ptr = 0, q_start = 0, freqs = 0,
         total = 0;
  HeadLayout(const VariableBlockSparseConfig& c, size_t prefill_bytes) {
    const size_t rows = align_up(static_cast<size_t>(c.max_block_rows + 1) * 4);
    prefill = align_up(prefill_bytes);
    ids = prefill;
    mask_indptr = ids + align_up(static_cast<size_t>(c.max_kv_ids) * 4);
    mask = mask_indptr + rows;
    // ALiBi / RoPE at true positions (sparse_positions_variant.h): first id entry and first
    // query row of each request, the RoPE frequencies.
    kv_ptr = mask + align_up(static_cast<size_t>(c.max_mask_bytes));
    q_start = kv_ptr + rows;
    freqs = q_start + rows;
    total = freqs + align_up(static_cast<size_t>(c.head_dim) * 4);
  }
  size_t index_bytes() const { return total - ids; }
};

size_t heads(const VariableBlockSparseConfig& c) {
  return static_cast<size_t>(std::max(c.num_kv_heads, 1));
}

// Columns [h * g, (h + 1) * g) of a [rows, H, ...] view (dimension 1).
TensorView head_slice(const TensorView& t, int64_t first, int64_t count) {
  std::vector<int64_t> shape(t.ndim()), strides(t.ndim());
  for (int d = 0; d < t.ndim(); ++d) {
    shape[d] = t.size(d);
    strides[d] = t.stride(d);
  }
  shape[1] = count;
  auto* base = static_cast<std::byte*>(t.data()) + first * t.stride(1) * dtype_size(t.dtype());
  return TensorView(base, t.dtype(), t.ndim(), shape.data(), strides.data(), t.device());
}

// Elements [first, first + count) of a 1-d f32 tensor (a head's sinks).
TensorView slice_1d(const TensorView& t, int64_t first, int64_t count) {
  const int64_t shape[1] = {count}, strides[1] = {t.stride(0)};
  auto* base = static_cast<std::byte*>(t.data()) + first * t.stride(0) * dtype_size(t.dtype());
  return TensorView(base, t.dtype(), 1, shape, strides, t.device());
}

// Head h's scales of a cache's KVScale: a per-head tensor [H_kv] becomes its element h; a [1]
// tensor and the floats apply to every head.
KVScale head_scale(const KVScale& s, int h) {
  KVScale r = s;
  if (s.k_tensor.defined() && s.k_tensor.size(0) > 1) r.k_tensor = slice_1d(s.k_tensor, h, 1);
  if (s.v_tensor.defined() && s.v_tensor.size(0) > 1) r.v_tensor = slice_1d(s.v_tensor, h, 1);
  return r;
}

}  // namespace

struct VariableBlockSparseAttention::Impl {
  VariableBlockSparseConfig cfg;
  HeadLayout head{VariableBlockSparseConfig{}, 0};
  std::byte* base = nullptr;                                // device workspace
  std::vector<std::unique_ptr<BatchPrefillPaged>> prefill;  // one per KV head
  ops::PlanLifecycle life;
  // The plan in force.
  int64_t M = 0, N = 0;
  int num_kv_heads = 0, group = 0, head_dim = 0;
  std::vector<int64_t> ids, requests;  // per head: page ids, requests
  KVScale kv_scale;
};

size_t VariableBlockSparseAttention::workspace_bytes(const VariableBlockSparseConfig& cfg) {
  return HeadLayout(cfg, BatchPrefillPaged::workspace_bytes(head_prefill_config(cfg))).total *
         heads(cfg);
}

size_t VariableBlockSparseAttention::min_workspace_bytes(const VariableBlockSparseConfig& cfg) {
  return HeadLayout(cfg, BatchPrefillPaged::min_workspace_bytes(head_prefill_config(cfg))).total *
         heads(cfg);
}

VariableBlockSparseAttention::VariableBlockSparseAttention(const VariableBlockSparseConfig& cfg,
                                                           void* workspace, size_t bytes)
    : impl_(std::make_unique<Impl>()) {
  check(cfg.max_rows >= 1 && cfg.max_block_rows >= 1 && cfg.max_kv_ids >= 0 &&
            cfg.max_mask_bytes >= 0 && cfg.num_kv_heads >= 1,
        "VariableBlockSparseConfig: expected max_rows, max_block_rows, num_kv_heads >= 1 and "
        "max_kv_ids, max_mask_bytes >= 0, got ",
        cfg.max_rows, ", ", cfg.max_block_rows, ", ", cfg.num_kv_heads, ", ", cfg.max_kv_ids, ", ",
        cfg.max_mask_bytes);
  check(cfg.max_block_rows < (int64_t{1} << 31) && cfg.max_kv_ids < (int64_t{1} << 31),
        "VariableBlockSparseConfig: max_block_rows and max_kv_ids must be < 2^31");
  check(workspace != nullptr, "workspace: expected a device buffer, got null");
  check(bytes >= min_workspace_bytes(cfg), "workspace: ", bytes, " bytes is too small; expected ",
        "at least VariableBlockSparseAttention::min_workspace_bytes(cfg) = ",
        min_workspace_bytes(cfg), " (workspace_bytes(cfg) = ", workspace_bytes(cfg),
        " never limits split-KV)");
  Impl& m = *impl_;
  m.cfg = cfg;
  // Each KV head gets an equal slice; its prefill op the slice less its index region (a plan
  // splits KV into what fits, as BatchPrefillPaged does with any workspace >= its minimum).
  const size_t slice = bytes / heads(cfg) / kAlign * kAlign;
  const size_t index = HeadLayout(cfg, 0).index_bytes();
  m.head = HeadLayout(
      cfg, std::min(slice - index, BatchPrefillPaged::workspace_bytes(head_prefill_config(cfg))) /
               kAlign * kAlign);
  m.base = static_cast<std::byte*>(workspace);
  runtime::ensure_context(cfg.device);
  for (int h = 0; h < cfg.num_kv_heads; ++h)
    m.prefill.push_back(std::make_unique<BatchPrefillPaged>(
        head_prefill_config(cfg), m.base + h * m.head.total, m.head.prefill));
  // The upload image holds every head's index region, at the head's offset from `base`.
  m.life = ops::PlanLifecycle("VariableBlockSparseAttention",
                              m.head.total * static_cast<size_t>(cfg.num_kv_heads), cfg.device);
}

VariableBlockSparseAttention::~VariableBlockSparseAttention() = default;

void VariableBlockSparseAttention::plan(const VariableBlockSparseLayout& l,
                                        const AttentionShape& shape, const BlockSparseOptions& opts,
                                        Stream stream) {
  Impl& m = *impl_;
  m.life.begin_plan(stream);
  check_variable_block_sparse_layout(l);
  check(l.num_kv_heads == shape.num_kv_heads,
        "VariableBlockSparseLayout.num_kv_heads: ", l.num_kv_heads,
        "; expected AttentionShape.num_kv_heads = ", shape.num_kv_heads);
  check(l.num_kv_heads <= m.cfg.num_kv_heads,
        "VariableBlockSparseLayout.num_kv_heads: ", l.num_kv_heads,
        "; the config allows VariableBlockSparseConfig.num_kv_heads = ", m.cfg.num_kv_heads);
  check(l.M <= m.cfg.max_rows, "VariableBlockSparseLayout.M: ", l.M, " query rows; the config ",
        "allows VariableBlockSparseConfig.max_rows = ", m.cfg.max_rows);
  check(l.MB <= m.cfg.max_block_rows, "VariableBlockSparseLayout.MB: ", l.MB,
        " block rows; the config allows VariableBlockSparseConfig.max_block_rows = ",
        m.cfg.max_block_rows);
  check(l.N < (int64_t{1} << 31), "VariableBlockSparseLayout.N: ", l.N, "; expected < 2^31");
  std::vector<ops::BsrPagedPlan> plans;
  for (int h = 0; h < l.num_kv_heads; ++h) {
    plans.push_back(ops::variable_head_as_paged_prefill(l, h, opts.causal));
    const ops::BsrPagedPlan& p = plans.back();
    check(static_cast<int64_t>(p.kv_indices.size()) <= m.cfg.max_kv_ids, "KV head ", h, " gathers ",
          p.kv_indices.size(), " key tokens over its block rows; the config ",
          "allows VariableBlockSparseConfig.max_kv_ids = ", m.cfg.max_kv_ids);
    check(static_cast<int64_t>(p.mask.size()) <= m.cfg.max_mask_bytes, "KV head ", h,
          ": the causal mask takes ", p.mask.size(), " bytes; the config allows ",
          "VariableBlockSparseConfig.max_mask_bytes = ", m.cfg.max_mask_bytes);
  }
  AttentionShape head_shape = shape;
  head_shape.num_kv_heads = 1;
  head_shape.num_qo_heads = shape.num_qo_heads / shape.num_kv_heads;
  const Device dev = Device::cuda(m.cfg.device);
  for (int h = 0; h < l.num_kv_heads; ++h) {
    const ops::BsrPagedPlan& p = plans[h];
    std::byte* const hb = m.base + h * m.head.total;
    AttentionVariant av;
    av.logits_soft_cap = opts.logits_soft_cap;
    if (opts.sinks.defined())
      av.sinks =
          slice_1d(opts.sinks, int64_t{h} * head_shape.num_qo_heads, head_shape.num_qo_heads);
    const int64_t requests = static_cast<int64_t>(p.kv_last_page_len.size());
    if (p.has_mask())
      av.custom_mask = {reinterpret_cast<const uint8_t*>(hb + m.head.mask),
                        static_cast<int64_t>(p.mask.size()),
                        TensorView(hb + m.head.mask_indptr, DType::i32, {requests + 1}, dev)};
    PrefillPlanOptions pp;
    pp.sm_scale = opts.sm_scale;
    pp.kv_indices_host = p.kv_indices.data();
    pp.num_pages = l.N;
    if (ops::needs_sparse_positions(opts)) {
      const int g = head_shape.num_qo_heads;
      ops::SparsePositionsInputs in;
      in.ids = TensorView(hb + m.head.ids, DType::i32,
                          {std::max<int64_t>(static_cast<int64_t>(p.kv_indices.size()), 1)}, dev);
      in.kv_ptr = TensorView(hb + m.head.kv_ptr, DType::i32, {requests + 1}, dev);
      in.q_start = TensorView(hb + m.head.q_start, DType::i32, {requests + 1}, dev);
      in.page = 1;
      in.shift = l.N - l.M;
      in.head_dim = shape.head_dim;
      if (opts.alibi_slopes.defined())
        in.alibi_slopes = slice_1d(opts.alibi_slopes, int64_t{h} * g, g);
      in.rope = opts.rope;
      in.logits_soft_cap = opts.logits_soft_cap;
      in.sinks = av.sinks;
      in.custom_mask = av.custom_mask;
      in.freq_hi_lo = TensorView(hb + m.head.freqs, DType::f32, {shape.head_dim}, dev);
      pp.variant = ops::sparse_positions_variant(in);
    } else if (p.has_mask() || opts.logits_soft_cap > 0.f || opts.sinks.defined()) {
      pp.variant = Variant::builtin(av);
    }
    m.prefill[h]->plan({.qo_indptr = p.qo_indptr.data(),
                        .kv_indptr = p.kv_indptr.data(),
                        .kv_last_page_len = p.kv_last_page_len.data(),
                        .batch_size = static_cast<int>(requests),
                        .page_size = 1},
                       head_shape, pp, stream);
  }

  std::byte* const image = m.life.begin_upload(stream);
  const auto put = [&](size_t offset, const void* src, size_t n) {
    if (n == 0) return;
    std::memcpy(image + offset, src, n);
    m.life.upload(reinterpret_cast<CUdeviceptr>(m.base + offset), offset, n, stream);
  };
  m.ids.assign(l.num_kv_heads, 0);
  m.requests.assign(l.num_kv_heads, 0);
  for (int h = 0; h < l.num_kv_heads; ++h) {
    const ops::BsrPagedPlan& p = plans[h];
    const size_t hb = h * m.head.total;
    put(hb + m.head.ids, p.kv_indices.data(), p.kv_indices.size() * 4);
    put(hb + m.head.mask_indptr, p.mask_indptr.data(), p.mask_indptr.size() * 4);
    put(hb + m.head.mask, p.mask.data(), p.mask.size());
    if (ops::needs_sparse_positions(opts)) {
      put(hb + m.head.kv_ptr, p.kv_indptr.data(), p.kv_indptr.size() * 4);
      put(hb + m.head.q_start, p.qo_indptr.data(), p.qo_indptr.size() * 4);
      if (opts.rope.mode != RopeMode::none) {
        const std::vector<float> f = ops::sparse_rope_freq_image(opts.rope, shape.head_dim);
        put(hb + m.head.freqs, f.data(), f.size() * 4);
      }
    }
    m.ids[h] = static_cast<int64_t>(p.kv_indices.size());
    m.requests[h] = static_cast<int64_t>(p.kv_last_page_len.size());
  }
  m.life.end_upload(stream);
  m.M = l.M;
  m.N = l.N;
  m.num_kv_heads = l.num_kv_heads;
  m.group = head_shape.num_qo_heads;
  m.head_dim = shape.head_dim;
  m.kv_scale = opts.kv_scale;
  m.life.commit();
}

void VariableBlockSparseAttention::run(const TensorView& q, const TensorView& k,
                                       const TensorView& v, const TensorView& out,
                                       const TensorView& lse, Stream stream) {
  impl_->life.require_planned("run");
  run(q, k, v, out, lse, impl_->kv_scale, stream);
}

void VariableBlockSparseAttention::run(const TensorView& q, const TensorView& k,
                                       const TensorView& v, const TensorView& out,
                                       const TensorView& lse, const KVScale& kv_scale,
                                       Stream stream) {
  Impl& m = *impl_;
  m.life.require_planned("run");
  const int64_t hq = int64_t{m.group} * m.num_kv_heads;
  for (const auto& [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    check_defined(*t, name);
    check_ndim(*t, name, 3);
    check(t->size(0) == m.N && t->size(1) == m.num_kv_heads && t->size(2) == m.head_dim, name,
          ": expected [N = ", m.N, ", H_kv = ", m.num_kv_heads, ", D = ", m.head_dim,
          "] (the plan's), got ", t->shape_str());
  }
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&out, "out"}}) {
    check_defined(*t, name);
    check_ndim(*t, name, 3);
    check(t->size(0) == m.M && t->size(1) == hq && t->size(2) == m.head_dim, name,
          ": expected [M = ", m.M, ", H_qo = ", hq, ", D = ", m.head_dim, "] (the plan's), got ",
          t->shape_str());
  }
  if (lse.defined()) {
    check_ndim(lse, "lse", 2);
    check(lse.size(0) == m.M && lse.size(1) == hq, "lse: expected [M = ", m.M, ", H_qo = ", hq,
          "], got ", lse.shape_str());
  }
  const Device dev = Device::cuda(m.cfg.device);
  const bool capturing = m.life.begin_run(false, "BlockSparseOptions", stream);
  for (int h = 0; h < m.num_kv_heads; ++h) {
    std::byte* const hb = m.base + h * m.head.total;
    // Head h's keys as pages of one token: [N, 1, 1, D], page n at n x k's token stride.
    const auto pages = [&](const TensorView& t) {
      const int64_t shape[4] = {m.N, 1, 1, m.head_dim};
      const int64_t strides[4] = {t.stride(0), t.stride(0), t.stride(1), t.stride(2)};
      auto* base = static_cast<std::byte*>(t.data()) + h * t.stride(1) * dtype_size(t.dtype());
      return TensorView(base, t.dtype(), 4, shape, strides, t.device());
    };
    PagedKVCache cache;
    cache.k = pages(k);
    cache.v = pages(v);
    cache.layout = KVLayout::NHD;
    cache.indices = TensorView(hb + m.head.ids, DType::i32, {m.ids[h]}, dev);
    cache.indptr = TensorView(hb + m.head.ids, DType::i32, {m.requests[h] + 1}, dev);
    cache.last_page_len = TensorView(hb + m.head.ids, DType::i32, {m.requests[h]}, dev);
    cache.scale = head_scale(kv_scale, h);
    m.prefill[h]->run(head_slice(q, h * m.group, m.group), cache,
                      head_slice(out, h * m.group, m.group),
                      lse.defined() ? head_slice(lse, h * m.group, m.group) : TensorView(), stream);
  }
  m.life.end_run(capturing, stream);
}

}  // namespace flashkv
