// BlockSparseAttention (flashkv/block_sparse.h): block-sparse attention composed from batch
// prefill over a paged view of K/V (bsr_paged_plan.h says how a layout maps). The workspace holds
// the prefill op's workspace, then this op's device copy of the page ids and of the custom mask.
// plan() plans the prefill op, then uploads the ids and the mask through its own PlanLifecycle
// (after the last run() that read them); run() views k, v as pages of C tokens.
#include <algorithm>
#include <cstring>
#include <utility>

#include "flashkv/block_sparse.h"
#include "flashkv/error.h"
#include "flashkv/prefill.h"
#include "flashkv/variant_spec.h"
#include "ops/block_sparse/bsr_paged_plan.h"
#include "ops/block_sparse/sparse_positions_variant.h"
#include "ops/common/plan_lifecycle.h"
#include "runtime/driver.h"

namespace flashkv {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

BatchPrefillConfig prefill_config(const BlockSparseConfig& c) {
  BatchPrefillConfig p;
  p.max_batch = static_cast<int>(c.max_block_rows);
  p.max_qo_tokens = c.max_rows;
  p.num_qo_heads = c.num_qo_heads;
  p.head_dim = c.head_dim;
  p.device = c.device;
  if (c.ctas_per_sm > 0) p.ctas_per_sm = c.ctas_per_sm;
  return p;
}

// This op's region after the prefill workspace: page ids, the mask's byte offsets per block
// row, the mask bytes, then what ALiBi / RoPE at true positions read (sparse_positions_variant.h):
// each block row's first page entry and first query row, and the RoPE frequencies.
struct IndexLayout {
  size_t ids = 0, mask_indptr = 0, mask = 0, kv_ptr = 0, q_start = 0, freqs = 0, total = 0;
  explicit IndexLayout(const BlockSparseConfig& c) {
    const size_t rows = align_up(static_cast<size_t>(c.max_block_rows + 1) * 4);
    mask_indptr = align_up(static_cast<size_t>(c.max_blocks) * 4);
    mask = mask_indptr + rows;
    kv_ptr = mask + align_up(static_cast<size_t>(c.max_mask_bytes));
    q_start = kv_ptr + rows;
    freqs = q_start + rows;
    total = freqs + align_up(static_cast<size_t>(c.head_dim) * 4);
  }
};

}  // namespace

struct BlockSparseAttention::Impl {
  BlockSparseConfig cfg;
  std::unique_ptr<BatchPrefillPaged> prefill;
  ops::PlanLifecycle life;
  IndexLayout index{BlockSparseConfig{}};
  std::byte* index_base = nullptr;  // device
  // The plan in force.
  int64_t M = 0, N = 0, blocks = 0, block_rows = 0;
  int C = 1, num_kv_heads = 0, head_dim = 0;
  KVScale kv_scale;
};

size_t BlockSparseAttention::workspace_bytes(const BlockSparseConfig& cfg) {
  return align_up(BatchPrefillPaged::workspace_bytes(prefill_config(cfg))) + IndexLayout(cfg).total;
}

BlockSparseAttention::BlockSparseAttention(const BlockSparseConfig& cfg, void* workspace,
                                           size_t bytes)
    : impl_(std::make_unique<Impl>()) {
  check(cfg.max_rows >= 1 && cfg.max_block_rows >= 1 && cfg.max_blocks >= 0 &&
            cfg.max_mask_bytes >= 0,
        "BlockSparseConfig: expected max_rows, max_block_rows >= 1 and max_blocks, "
        "max_mask_bytes >= 0, got ",
        cfg.max_rows, ", ", cfg.max_block_rows, ", ", cfg.max_blocks, ", ", cfg.max_mask_bytes);
  check(cfg.max_block_rows <= cfg.max_rows && cfg.max_block_rows < (int64_t{1} << 31),
        "BlockSparseConfig.max_block_rows: expected <= max_rows and < 2^31, got ",
        cfg.max_block_rows);
  check(workspace != nullptr, "workspace: expected a device buffer, got null");
  check(bytes >= workspace_bytes(cfg), "workspace: ", bytes, " bytes is too small; expected ",
        "BlockSparseAttention::workspace_bytes(cfg) = ", workspace_bytes(cfg));
  Impl& m = *impl_;
  m.cfg = cfg;
  m.index = IndexLayout(cfg);
  const size_t prefill_bytes = align_up(BatchPrefillPaged::workspace_bytes(prefill_config(cfg)));
  runtime::ensure_context(cfg.device);
  m.prefill = std::make_unique<BatchPrefillPaged>(prefill_config(cfg), workspace, prefill_bytes);
  m.index_base = static_cast<std::byte*>(workspace) + prefill_bytes;
  m.life = ops::PlanLifecycle("BlockSparseAttention", m.index.total, cfg.device);
}

BlockSparseAttention::~BlockSparseAttention() = default;

void BlockSparseAttention::plan(const BlockSparseLayout& l, const AttentionShape& shape,
                                const BlockSparseOptions& opts, Stream stream) {
  Impl& m = *impl_;
  m.life.begin_plan(stream);
  const ops::BsrPagedPlan p = ops::bsr_as_paged_prefill(l, opts.causal);
  const int64_t rows = l.num_block_rows(), blocks = static_cast<int64_t>(p.kv_indices.size());
  check(l.M <= m.cfg.max_rows, "BlockSparseLayout.M: ", l.M, " query rows; the config allows ",
        "BlockSparseConfig.max_rows = ", m.cfg.max_rows);
  check(rows <= m.cfg.max_block_rows, "BlockSparseLayout: ", rows, " block rows (M / R); the ",
        "config allows BlockSparseConfig.max_block_rows = ", m.cfg.max_block_rows);
  check(blocks <= m.cfg.max_blocks, "BlockSparseLayout.indptr[M / R] = ", blocks,
        " blocks; the config allows BlockSparseConfig.max_blocks = ", m.cfg.max_blocks);
  check(static_cast<int64_t>(p.mask.size()) <= m.cfg.max_mask_bytes,
        "BlockSparseOptions: ", "the causal / element mask takes ", p.mask.size(),
        " bytes (block_sparse_mask_bytes); ",
        "the config allows BlockSparseConfig.max_mask_bytes = ", m.cfg.max_mask_bytes);
  check(l.N / l.C < (int64_t{1} << 31), "BlockSparseLayout: N / C = ", l.N / l.C,
        " pages; expected < 2^31");

  const Device dev = Device::cuda(m.cfg.device);
  AttentionVariant av;
  av.logits_soft_cap = opts.logits_soft_cap;
  av.sinks = opts.sinks;
  std::byte* const mask_dev = m.index_base + m.index.mask;
  std::byte* const mask_indptr_dev = m.index_base + m.index.mask_indptr;
  if (p.has_mask()) {
    av.custom_mask = {reinterpret_cast<const uint8_t*>(mask_dev),
                      static_cast<int64_t>(p.mask.size()),
                      TensorView(mask_indptr_dev, DType::i32, {rows + 1}, dev)};
  }
  PrefillPlanOptions pp;
  pp.causal = p.causal;  // the kernel's own causal mask (bsr_paged_plan.h)
  pp.sm_scale = opts.sm_scale;
  pp.kv_indices_host = p.kv_indices.data();
  pp.num_pages = l.N / l.C;
  const bool positions = ops::needs_sparse_positions(opts);
  if (positions) {
    check(opts.rope.mode == RopeMode::none || shape.head_dim <= m.cfg.head_dim,
          "BlockSparseOptions.rope: head_dim ", shape.head_dim, " exceeds the config's");
    ops::SparsePositionsInputs in;
    in.ids =
        TensorView(m.index_base + m.index.ids, DType::i32, {std::max<int64_t>(blocks, 1)}, dev);
    in.kv_ptr = TensorView(m.index_base + m.index.kv_ptr, DType::i32, {rows + 1}, dev);
    in.q_start = TensorView(m.index_base + m.index.q_start, DType::i32, {rows + 1}, dev);
    in.page = l.C;
    in.shift = l.N - l.M;
    in.head_dim = shape.head_dim;
    in.alibi_slopes = opts.alibi_slopes;
    in.rope = opts.rope;
    in.logits_soft_cap = opts.logits_soft_cap;
    in.sinks = opts.sinks;
    in.custom_mask = av.custom_mask;
    in.freq_hi_lo = TensorView(m.index_base + m.index.freqs, DType::f32, {shape.head_dim}, dev);
    pp.variant = ops::sparse_positions_variant(in);
  } else if (p.has_mask() || opts.logits_soft_cap > 0.f || opts.sinks.defined()) {
    pp.variant = Variant::builtin(av);
  }
  m.prefill->plan({.qo_indptr = p.qo_indptr.data(),
                   .kv_indptr = p.kv_indptr.data(),
                   .kv_last_page_len = p.kv_last_page_len.data(),
                   .batch_size = static_cast<int>(rows),
                   .page_size = l.C},
                  shape, pp, stream);

  // Page ids and the mask to the device, after the last run() read them.
  std::byte* const image = m.life.begin_upload(stream);
  const auto put = [&](size_t offset, const void* src, size_t n) {
    if (n == 0) return;
    std::memcpy(image + offset, src, n);
    m.life.upload(reinterpret_cast<CUdeviceptr>(m.index_base + offset), offset, n, stream);
  };
  put(m.index.ids, p.kv_indices.data(), p.kv_indices.size() * 4);
  put(m.index.mask_indptr, p.mask_indptr.data(), p.mask_indptr.size() * 4);
  put(m.index.mask, p.mask.data(), p.mask.size());
  if (positions) {
    put(m.index.kv_ptr, p.kv_indptr.data(), p.kv_indptr.size() * 4);
    put(m.index.q_start, p.qo_indptr.data(), p.qo_indptr.size() * 4);
    if (opts.rope.mode != RopeMode::none) {
      const std::vector<float> f = ops::sparse_rope_freq_image(opts.rope, shape.head_dim);
      put(m.index.freqs, f.data(), f.size() * 4);
    }
  }
  m.life.end_upload(stream);

  m.M = l.M;
  m.N = l.N;
  m.C = l.C;
  m.blocks = blocks;
  m.block_rows = rows;
  m.num_kv_heads = shape.num_kv_heads;
  m.head_dim = shape.head_dim;
  m.kv_scale = opts.kv_scale;
  m.life.commit();
}

void BlockSparseAttention::run(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, Stream stream) {
  impl_->life.require_planned("run");
  run(q, k, v, out, lse, impl_->kv_scale, stream);
}

void BlockSparseAttention::run(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse,
                               const KVScale& kv_scale, Stream stream) {
  Impl& m = *impl_;
  m.life.require_planned("run");
  for (const auto& [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    check_defined(*t, name);
    check_ndim(*t, name, 3);
    check(t->size(0) == m.N && t->size(1) == m.num_kv_heads && t->size(2) == m.head_dim, name,
          ": expected [N = ", m.N, ", H_kv = ", m.num_kv_heads, ", D = ", m.head_dim,
          "] (the plan's), got ", t->shape_str());
  }
  const Device dev = Device::cuda(m.cfg.device);
  // k, v [N, H, D] as pages [N / C, C, H, D]: page j is tokens [j C, (j + 1) C).
  const auto pages = [&](const TensorView& t) {
    const int64_t shape[4] = {m.N / m.C, m.C, t.size(1), t.size(2)};
    const int64_t strides[4] = {m.C * t.stride(0), t.stride(0), t.stride(1), t.stride(2)};
    return TensorView(t.data(), t.dtype(), 4, shape, strides, t.device());
  };
  PagedKVCache cache;
  cache.k = pages(k);
  cache.v = pages(v);
  cache.layout = KVLayout::NHD;
  // The page ids the plan uploaded; indptr and last_page_len only carry the shape run() checks
  // (the prefill op reads the plan's, as MultiLevelCascade's levels do).
  void* const ids = m.index_base + m.index.ids;
  cache.indices = TensorView(ids, DType::i32, {m.blocks}, dev);
  cache.indptr = TensorView(ids, DType::i32, {m.block_rows + 1}, dev);
  cache.last_page_len = TensorView(ids, DType::i32, {m.block_rows}, dev);
  cache.scale = kv_scale;
  const bool capturing = m.life.begin_run(false, "BlockSparseOptions", stream);
  m.prefill->run(q, cache, out, lse, stream);
  m.life.end_run(capturing, stream);
}

}  // namespace flashkv
