// single_prefill: prefill without managing a BatchPrefillRagged. Host tensors run on the CPU
// reference; CUDA tensors run through a BatchPrefillRagged and workspace the library keeps per
// device, re-planned on every call (so: not for CUDA-graph capture; allocates on first use and
// when a call needs a bigger workspace).
#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

#include "flashkv/error.h"
#include "flashkv/plan_checks.h"
#include "flashkv/prefill.h"
#include "flashkv/reference.h"
#include "ops/common/cached_op.h"

namespace flashkv {
namespace {

using CachedPrefill = ops::CachedOp<BatchPrefillRagged, BatchPrefillConfig>;

std::mutex g_mu;
std::vector<std::unique_ptr<CachedPrefill>>& g_cache =
    *new std::vector<std::unique_ptr<CachedPrefill>>;

CachedPrefill& prefill_for(int device, int64_t qo_len, int num_qo_heads, int head_dim) {
  check(is_supported_head_dim(head_dim), "head_dim: expected 64, 128 or 256, got ", head_dim);
  CachedPrefill& c = ops::device_entry(g_cache, device);
  if (!c.op || qo_len > c.cfg.max_qo_tokens || num_qo_heads > c.cfg.num_qo_heads ||
      head_dim > c.cfg.head_dim) {
    BatchPrefillConfig cfg;
    cfg.device = device;
    cfg.max_batch = 1;
    cfg.max_qo_tokens = std::max<int64_t>({qo_len, c.op ? c.cfg.max_qo_tokens : 1, 1});
    cfg.num_qo_heads = std::max(num_qo_heads, c.op ? c.cfg.num_qo_heads : 1);
    cfg.head_dim = std::max(head_dim, c.op ? c.cfg.head_dim : 64);
    c.rebuild(cfg);
  }
  return c;
}

}  // namespace

void single_prefill(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const TensorView& lse, KVLayout layout,
                    const AttentionOptions& opts, Stream stream) {
  check_defined(q, "q");
  check_defined(k, "k");
  check_defined(v, "v");
  if (q.device().is_cpu()) return reference::single_prefill(q, k, v, out, lse, layout, opts);
  check_ndim(q, "q", 3);
  check_ndim(k, "k", 3);
  check_ndim(v, "v", 3);
  check_shape(v, "v", {k.size(0), k.size(1), k.size(2)});
  check_contiguous_kv_heads(k, layout, static_cast<int>(q.size(1)));  // names the layout
  const bool nhd = layout == KVLayout::NHD;
  const int64_t kv_len = nhd ? k.size(0) : k.size(1);
  const int64_t num_kv_heads = nhd ? k.size(1) : k.size(0);
  const int64_t qo_len = q.size(0);
  check(kv_len < (int64_t{1} << 31) && qo_len < (int64_t{1} << 31),
        "single_prefill: qo_len and kv_len must fit int32 (got ", qo_len, ", ", kv_len, ")");
  // HND [H, L, D] is the same KV as NHD [L, H, D] with the first two strides swapped.
  const auto as_nhd = [&](const TensorView& t) {
    if (nhd) return t;
    const int64_t shape[3] = {t.size(1), t.size(0), t.size(2)};
    const int64_t strides[3] = {t.stride(1), t.stride(0), t.stride(2)};
    return TensorView(t.data(), t.dtype(), 3, shape, strides, t.device());
  };
  const int32_t qo_indptr[2] = {0, static_cast<int32_t>(qo_len)};
  const int32_t kv_indptr[2] = {0, static_cast<int32_t>(kv_len)};
  std::lock_guard<std::mutex> lock(g_mu);
  CachedPrefill& c = prefill_for(q.device().index, qo_len, static_cast<int>(q.size(1)),
                                 static_cast<int>(k.size(2)));
  PrefillPlanOptions po;
  po.causal = opts.causal;
  po.sm_scale = opts.sm_scale;
  c.op->plan({.qo_indptr = qo_indptr,
              .kv_indptr = kv_indptr,
              .kv_last_page_len = nullptr,
              .batch_size = 1,
              .page_size = 0},
             {.num_qo_heads = static_cast<int>(q.size(1)),
              .num_kv_heads = static_cast<int>(num_kv_heads),
              .head_dim = static_cast<int>(k.size(2)),
              .q_dtype = q.dtype(),
              .kv_dtype = k.dtype(),
              .o_dtype = out.dtype()},
             po, stream);
  c.op->run(q, as_nhd(k), as_nhd(v), out, lse, opts.kv_scale, stream);
}

}  // namespace flashkv
