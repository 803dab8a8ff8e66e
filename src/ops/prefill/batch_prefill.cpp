// BatchPrefillPaged and BatchPrefillRagged: the KV-source half of prefill (a page table, or
// kv_indptr over contiguous rows) on top of the shared plan/run machinery
// (ops/prefill/prefill_core.h).
#include "flashkv/error.h"
#include "flashkv/prefill.h"
#include "ops/common/kv_scale_params.h"
#include "ops/common/run_checks.h"
#include "ops/prefill/prefill_core.h"

namespace flashkv {
namespace {

// k and v share one set of strides in the kernel; 16-byte vector loads need aligned rows.
void check_kv_strides(const TensorView& k, const TensorView& v, DType kv_dtype, const char* what) {
  check_aligned(k, what, 16);
  check_aligned(v, what, 16);
  for (int i = 0; i < k.ndim(); ++i) {
    check(k.stride(i) == v.stride(i), what, ": k and v must have the same strides (dim ", i, ": ",
          k.stride(i), " vs ", v.stride(i), ")");
    if (i + 1 < k.ndim()) {
      check(k.stride(i) * static_cast<int64_t>(dtype_size(kv_dtype)) % 16 == 0, what,
            ": strides must be multiples of 16 bytes for vector loads (dim ", i, ": ", k.stride(i),
            " elements)");
    }
  }
}

// The kernel keeps offsets within a page (or within a ragged row) in 32 bits.
void check_offsets_fit(int64_t page_extent, int64_t token_stride, int64_t head_stride,
                       int64_t num_kv_heads, int64_t head_dim, const char* what) {
  check(token_stride >= 0 && head_stride >= 0, what, ": expected non-negative strides");
  const int64_t max_off = page_extent * token_stride + (num_kv_heads - 1) * head_stride + head_dim;
  check(max_off < (int64_t{1} << 31), what, ": offsets within a page reach ", max_off,
        " elements; the prefill kernel needs them below 2^31");
}

}  // namespace

// ---- paged ----

size_t BatchPrefillPaged::workspace_bytes(const BatchPrefillConfig& cfg) {
  return ops::PrefillWorkspace::required_bytes(cfg);
}

size_t BatchPrefillPaged::min_workspace_bytes(const BatchPrefillConfig& cfg) {
  return ops::PrefillWorkspace::min_bytes(cfg);
}

BatchPrefillPaged::BatchPrefillPaged(const BatchPrefillConfig& cfg, void* workspace, size_t bytes)
    : core_(std::make_unique<detail::PrefillCore>(cfg, workspace, bytes, true,
                                                  "BatchPrefillPaged")) {}
BatchPrefillPaged::~BatchPrefillPaged() = default;

void BatchPrefillPaged::plan(const PrefillBatch& batch, const AttentionShape& shape,
                             const PrefillPlanOptions& opts, Stream stream) {
  core_->plan(batch, shape, opts, stream);
}

void BatchPrefillPaged::run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                            const TensorView& lse, Stream stream) {
  detail::PrefillCore& c = *core_;
  PrefillParams p{};
  c.check_io(q, out, lse, p);
  ops::PlannedPagedKV pages;
  pages.device = Device::cuda(c.cfg.device);
  pages.kv_dtype = c.shape.kv_dtype;
  pages.page_size = c.page_size;
  pages.num_kv_heads = c.shape.num_kv_heads;
  pages.head_dim = c.shape.head_dim;
  pages.batch = c.batch;
  pages.nnz_pages = c.nnz_kv;
  pages.page_ids = c.page_ids;
  pages.kv_indices_name = c.kv_indices_name.c_str();
  pages.graph = c.opts.enable_cuda_graph;
  ops::check_planned_paged_kv(kv, pages);
  check_kv_strides(kv.k, kv.v, c.shape.kv_dtype, "paged_kv");
  p.k = kv.k.data();
  p.v = kv.v.data();
  p.kv_indices = kv.indices.data_as<const int>();
  check_offsets_fit(kv.page_size() - 1, kv.token_stride(), kv.head_stride(), c.shape.num_kv_heads,
                    c.shape.head_dim, "paged_kv");
  check(kv.num_pages() < (int64_t{1} << 31), "paged_kv: at most 2^31 - 1 pages, got ",
        kv.num_pages());
  check(kv.page_stride() >= 0, "paged_kv: expected a non-negative page stride");
  p.page_stride = kv.page_stride();
  p.token_stride = static_cast<int>(kv.token_stride());
  p.head_stride = static_cast<int>(kv.head_stride());
  p.num_pages = static_cast<int>(kv.num_pages());
  p.scale = ops::kv_scale_params(kv.scale);  // checked by check_planned_paged_kv
  c.set_tma(p, q,
            {p.k, p.v, c.shape.kv_dtype, c.shape.head_dim, c.shape.num_kv_heads, kv.page_size(),
             kv.num_pages(), kv.page_stride(), kv.token_stride(), kv.head_stride()});
  c.launch(p, q, out, lse, kv.indices.size(0), stream);
}

void BatchPrefillPaged::forget_captured_graphs() { core_->captured = {}; }
PrefillPlanInfo BatchPrefillPaged::plan_info() const { return core_->info; }

// ---- ragged ----

size_t BatchPrefillRagged::workspace_bytes(const BatchPrefillConfig& cfg) {
  return ops::PrefillWorkspace::required_bytes(cfg);
}

size_t BatchPrefillRagged::min_workspace_bytes(const BatchPrefillConfig& cfg) {
  return ops::PrefillWorkspace::min_bytes(cfg);
}

BatchPrefillRagged::BatchPrefillRagged(const BatchPrefillConfig& cfg, void* workspace, size_t bytes)
    : core_(std::make_unique<detail::PrefillCore>(cfg, workspace, bytes, false,
                                                  "BatchPrefillRagged")) {}
BatchPrefillRagged::~BatchPrefillRagged() = default;

void BatchPrefillRagged::plan(const PrefillBatch& batch, const AttentionShape& shape,
                              const PrefillPlanOptions& opts, Stream stream) {
  check(opts.kv_indices_host == nullptr,
        "PrefillPlanOptions.kv_indices_host: ragged KV has no page table");
  core_->plan(batch, shape, opts, stream);
}

void BatchPrefillRagged::run(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const TensorView& lse, Stream stream) {
  run(q, k, v, out, lse, KVScale{}, stream);
}

void BatchPrefillRagged::run(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const TensorView& lse, const KVScale& scale,
                             Stream stream) {
  detail::PrefillCore& c = *core_;
  PrefillParams p{};
  c.check_io(q, out, lse, p);
  const Device dev = Device::cuda(c.cfg.device);
  for (auto [t, what] : {std::pair{&k, "k"}, {&v, "v"}}) {
    check_device(*t, what, dev);
    check_dtype(*t, what, c.shape.kv_dtype);
    check_ndim(*t, what, 3);
    check_shape(*t, what, {-1, c.shape.num_kv_heads, c.shape.head_dim});
    check_last_dim_contiguous(*t, what);
    check(t->size(0) >= c.nnz_kv, what, ": expected at least ", c.nnz_kv,
          " rows (kv_indptr[batch_size] of the plan), got ", t->size(0));
  }
  check(v.size(0) == k.size(0), "v: expected ", k.size(0), " rows (those of k), got ", v.size(0));
  check_kv_strides(k, v, c.shape.kv_dtype, "k/v");
  p.k = k.data();
  p.v = v.data();
  p.kv_indices = nullptr;
  check_offsets_fit(0, k.stride(0), k.stride(1), c.shape.num_kv_heads, c.shape.head_dim, "k/v");
  p.page_stride = 0;
  p.token_stride = static_cast<int>(k.stride(0));
  p.head_stride = static_cast<int>(k.stride(1));
  p.num_pages = 0;
  check_kv_scale(scale, c.shape.kv_dtype, c.shape.num_kv_heads, dev, true, "scale");
  p.scale = ops::kv_scale_params(scale);
  c.set_tma(p, q,
            {p.k, p.v, c.shape.kv_dtype, c.shape.head_dim, c.shape.num_kv_heads, 0, k.size(0), 0,
             k.stride(0), k.stride(1)});
  c.launch(p, q, out, lse, k.size(0), stream);
}

void BatchPrefillRagged::forget_captured_graphs() { core_->captured = {}; }
PrefillPlanInfo BatchPrefillRagged::plan_info() const { return core_->info; }

}  // namespace flashkv
