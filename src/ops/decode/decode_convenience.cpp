// single_decode and batch_decode: decode without managing a BatchDecode. Host tensors run on the
// CPU reference; CUDA tensors run through a BatchDecode and workspace the library keeps per
// device, re-planned on every call (so: not for CUDA-graph capture; allocates on first use and
// when a call needs a bigger workspace).
#include <algorithm>
#include <memory>
#include <mutex>
#include <numeric>
#include <vector>

#include "flashkv/decode.h"
#include "flashkv/error.h"
#include "flashkv/plan_checks.h"
#include "flashkv/reference.h"
#include "ops/common/cached_op.h"
#include "runtime/driver.h"

namespace flashkv {
namespace {

// One device's cached decoder (ops/common/cached_op.h), plus the page ids of contiguous KV.
struct CachedDecoder : ops::CachedOp<BatchDecode, BatchDecodeConfig> {
  DeviceBuffer arange;  // i32 0, 1, 2, ...: page ids of contiguous KV viewed as pages of one token
  int64_t arange_len = 0;
};

std::mutex g_mu;
std::vector<std::unique_ptr<CachedDecoder>>& g_decoders =
    *new std::vector<std::unique_ptr<CachedDecoder>>;

CachedDecoder& decoder_for(int device, int batch, int num_qo_heads, int head_dim) {
  check(is_supported_head_dim(head_dim), "head_dim: expected 64, 128 or 256, got ", head_dim);
  CachedDecoder& c = ops::device_entry(g_decoders, device);
  if (!c.op || batch > c.cfg.max_batch || num_qo_heads > c.cfg.num_qo_heads ||
      head_dim > c.cfg.head_dim) {
    BatchDecodeConfig cfg = c.cfg;
    cfg.device = device;
    cfg.max_batch = std::max({batch, c.op ? c.cfg.max_batch : 1, 1});
    cfg.num_qo_heads = std::max(num_qo_heads, c.op ? c.cfg.num_qo_heads : 1);
    cfg.head_dim = std::max(head_dim, c.op ? c.cfg.head_dim : 64);
    c.rebuild(cfg);
  }
  return c;
}

void ensure_arange(CachedDecoder& c, int64_t n, int device) {
  if (c.arange_len >= n) return;
  const int64_t len = std::max<int64_t>(n, 2 * c.arange_len);
  std::vector<int32_t> ids(len);
  std::iota(ids.begin(), ids.end(), 0);
  c.arange = DeviceBuffer(len * sizeof(int32_t), device);
  c.arange.copy_from_host(ids.data(), ids.size() * sizeof(int32_t));
  c.arange_len = len;
}

DecodePlanOptions plan_options(const AttentionOptions& opts) {
  check(!opts.causal, "opts.causal: decode has one query per request; causal does not apply");
  DecodePlanOptions p;
  p.sm_scale = opts.sm_scale;
  return p;
}

}  // namespace

void single_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const TensorView& lse, KVLayout layout,
                   const AttentionOptions& opts, Stream stream) {
  check_defined(q, "q");
  check_defined(k, "k");
  if (q.device().is_cpu()) return reference::single_decode(q, k, v, out, lse, layout, opts);
  check_ndim(q, "q", 2);
  check_ndim(k, "k", 3);
  check_ndim(v, "v", 3);
  check_shape(v, "v", {k.size(0), k.size(1), k.size(2)});
  check(k.stride(0) == v.stride(0) && k.stride(1) == v.stride(1), "v: expected the strides of k");
  check_contiguous_kv_heads(k, layout, static_cast<int>(q.size(0)));  // names the layout
  const int device = q.device().index;
  const int64_t kv_len = layout == KVLayout::NHD ? k.size(0) : k.size(1);
  const int64_t num_kv_heads = layout == KVLayout::NHD ? k.size(1) : k.size(0);
  const int64_t head_dim = k.size(2);
  check(kv_len < (int64_t{1} << 31), "k: kv_len ", kv_len, " does not fit the page table (int32)");
  // Contiguous KV as a paged cache of one-token pages: page t is token t.
  const int64_t tok = layout == KVLayout::NHD ? k.stride(0) : k.stride(1);
  const int64_t head = layout == KVLayout::NHD ? k.stride(1) : k.stride(0);
  const int64_t pages = std::max<int64_t>(kv_len, 1);
  const int64_t shape_nhd[4] = {pages, 1, num_kv_heads, head_dim},
                strides_nhd[4] = {tok, tok, head, 1};
  const int64_t shape_hnd[4] = {pages, num_kv_heads, 1, head_dim},
                strides_hnd[4] = {tok, head, tok, 1};
  const bool nhd = layout == KVLayout::NHD;
  std::lock_guard<std::mutex> lock(g_mu);
  CachedDecoder& c =
      decoder_for(device, 1, static_cast<int>(q.size(0)), static_cast<int>(head_dim));
  ensure_arange(c, pages, device);
  PagedKVCache kv;
  kv.layout = layout;
  kv.k = TensorView(k.data(), k.dtype(), 4, nhd ? shape_nhd : shape_hnd,
                    nhd ? strides_nhd : strides_hnd, k.device());
  kv.v = TensorView(v.data(), v.dtype(), 4, nhd ? shape_nhd : shape_hnd,
                    nhd ? strides_nhd : strides_hnd, v.device());
  kv.scale = opts.kv_scale;
  const int32_t indptr[2] = {0, static_cast<int32_t>(kv_len)}, last[1] = {1};
  kv.indices = TensorView(c.arange.data(), DType::i32, {pages}, Device::cuda(device));
  // indptr / last_page_len are read on the host by plan(); their views only carry the batch size.
  kv.indptr = TensorView(c.arange.data(), DType::i32, {2}, Device::cuda(device));
  kv.last_page_len = TensorView(c.arange.data(), DType::i32, {1}, Device::cuda(device));
  c.op->plan({.kv_indptr = indptr, .kv_last_page_len = last, .batch_size = 1, .page_size = 1},
             {.num_qo_heads = static_cast<int>(q.size(0)),
              .num_kv_heads = static_cast<int>(num_kv_heads),
              .head_dim = static_cast<int>(head_dim),
              .q_dtype = q.dtype(),
              .kv_dtype = k.dtype(),
              .o_dtype = out.dtype()},
             plan_options(opts), stream);
  const int64_t q_shape[3] = {1, q.size(0), q.size(1)},
                q_strides[3] = {q.size(0) * q.stride(0), q.stride(0), q.stride(1)};
  const int64_t o_shape[3] = {1, out.size(0), out.size(1)},
                o_strides[3] = {out.size(0) * out.stride(0), out.stride(0), out.stride(1)};
  TensorView lse3;
  if (lse.defined()) {
    const int64_t l_shape[2] = {1, lse.size(0)}, l_strides[2] = {lse.size(0), lse.stride(0)};
    lse3 = TensorView(lse.data(), lse.dtype(), 2, l_shape, l_strides, lse.device());
  }
  c.op->run(TensorView(q.data(), q.dtype(), 3, q_shape, q_strides, q.device()), kv,
            TensorView(out.data(), out.dtype(), 3, o_shape, o_strides, out.device()), lse3, stream);
}

void batch_decode(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                  const TensorView& lse, const AttentionOptions& opts, Stream stream) {
  check_defined(q, "q");
  if (q.device().is_cpu()) return reference::batch_decode(q, kv, out, lse, opts);
  check_ndim(q, "q", 3);
  check(opts.kv_scale.is_identity(), "opts.kv_scale: the paged ops take the cache's scales ",
        "(paged_kv.scale)");
  check(kv.indptr.device().is_cpu() && kv.last_page_len.device().is_cpu(),
        "paged_kv.indptr / paged_kv.last_page_len: batch_decode plans on every call and reads them "
        "on the "
        "host; pass host copies (kv.indices stays on the device), or use BatchDecode");
  check_dtype(kv.indptr, "paged_kv.indptr", DType::i32);
  check_dtype(kv.last_page_len, "paged_kv.last_page_len", DType::i32);
  check_contiguous(kv.indptr, "paged_kv.indptr");
  check_contiguous(kv.last_page_len, "paged_kv.last_page_len");
  kv.validate_shapes();
  const int batch = kv.batch_size();
  std::lock_guard<std::mutex> lock(g_mu);
  CachedDecoder& c =
      decoder_for(q.device().index, batch, static_cast<int>(q.size(1)), kv.head_dim());
  c.op->plan({.kv_indptr = kv.indptr.data_as<const int32_t>(),
              .kv_last_page_len = kv.last_page_len.data_as<const int32_t>(),
              .batch_size = batch,
              .page_size = kv.page_size()},
             {.num_qo_heads = static_cast<int>(q.size(1)),
              .num_kv_heads = kv.num_kv_heads(),
              .head_dim = kv.head_dim(),
              .q_dtype = q.dtype(),
              .kv_dtype = kv.k.dtype(),
              .o_dtype = out.dtype()},
             plan_options(opts), stream);
  c.op->run(q, kv, out, lse, stream);
}

}  // namespace flashkv
