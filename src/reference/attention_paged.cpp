// CPU reference attention over a paged KV cache: batch_decode and batch_prefill_paged.
// Request i's token t lives on page indices[indptr[i] + t / page_size], slot t % page_size; the
// gathered rows then go through the same attend_row() as every other op.
#include <vector>

#include "flashkv/error.h"
#include "flashkv/reference.h"
#include "reference/attend.h"

namespace flashkv::reference {
namespace {

using detail::KVSource;
using detail::QOShape;

std::vector<int64_t> read_i32(const TensorView& t) {
  std::vector<int64_t> vals(t.size(0));
  const int64_t stride = t.stride(0);  // read once: stride() formats an error message per call
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = t.data_as<const int32_t>()[i * stride];
  return vals;
}

}  // namespace

namespace detail {

PageTable check_paged(const PagedKVCache& kv, const QOShape& qo) {
  // Device first: validate() reads the index arrays, which must be host memory.
  detail::check_cpu(kv.k, "paged_kv.k");
  detail::check_cpu(kv.v, "paged_kv.v");
  detail::check_cpu(kv.indptr, "paged_kv.indptr");
  detail::check_cpu(kv.indices, "paged_kv.indices");
  detail::check_cpu(kv.last_page_len, "paged_kv.last_page_len");
  kv.validate();  // a quantized format's pools too (check_kv_group_scales)
  if (kv.scale.format.is_none()) {
    detail::check_floating(kv.k, "paged_kv.k");
    detail::check_floating(kv.v, "paged_kv.v");
  }
  if (!(kv.head_dim() == qo.head_dim)) {
    fail("paged_kv.k: head_dim ", kv.head_dim(), " (shape ", kv.k.shape_str(),
         ") does not match q's head_dim ", qo.head_dim);
  }
  check_heads(qo.num_qo_heads, kv.num_kv_heads());
  PageTable table;
  table.indptr = read_i32(kv.indptr);
  table.indices = read_i32(kv.indices);
  for (int i = 0; i < kv.batch_size(); ++i) table.kv_len.push_back(kv.kv_len(i));
  return table;
}

namespace {

// Request i's rows of a scale or zero-point pool laid out as the cache (kv_quant.h).
GroupPool paged_pool(const TensorView& t, const PagedKVCache& kv, const PageTable& table, int i) {
  GroupPool pool;
  if (!t.defined()) return pool;
  const bool nhd = kv.layout == KVLayout::NHD;
  const int64_t page_size = kv.page_size(), len = table.kv_len[i];
  const int64_t page_stride = t.stride(0), slot_stride = t.stride(nhd ? 1 : 2);
  pool.t = t;
  pool.token.resize(len);
  for (int64_t tok = 0; tok < len; ++tok) {
    const int64_t page = table.indices[table.indptr[i] + tok / page_size];
    pool.token[tok] = page * page_stride + (tok % page_size) * slot_stride;
  }
  pool.head_stride = t.stride(nhd ? 2 : 1);
  pool.group_stride = t.stride(3);
  return pool;
}

}  // namespace

KVSource paged_source(const PagedKVCache& kv, const PageTable& table, int i) {
  const bool nhd = kv.layout == KVLayout::NHD;
  const int token_dim = nhd ? 1 : 2;
  const int head_dim = nhd ? 2 : 1;
  const int64_t page_size = kv.page_size();
  const int64_t len = table.kv_len[i];
  KVSource src;
  src.k = kv.k;
  src.v = kv.v;
  src.k_token.resize(len);
  src.v_token.resize(len);
  const int64_t k_page = kv.k.stride(0), k_slot = kv.k.stride(token_dim);
  const int64_t v_page = kv.v.stride(0), v_slot = kv.v.stride(token_dim);
  for (int64_t t = 0; t < len; ++t) {
    const int64_t page = table.indices[table.indptr[i] + t / page_size];
    const int64_t slot = t % page_size;
    src.k_token[t] = page * k_page + slot * k_slot;
    src.v_token[t] = page * v_page + slot * v_slot;
  }
  src.k_head_stride = kv.k.stride(head_dim);
  src.v_head_stride = kv.v.stride(head_dim);
  src.k_dim_stride = kv.k.stride(3);
  src.v_dim_stride = kv.v.stride(3);
  src.scale = kv.scale;
  if (!kv.scale.format.is_none()) {
    src.k_scales = paged_pool(kv.scale.k_group_scale, kv, table, i);
    src.v_scales = paged_pool(kv.scale.v_group_scale, kv, table, i);
    src.k_zeros = paged_pool(kv.scale.k_zero, kv, table, i);
    src.v_zeros = paged_pool(kv.scale.v_zero, kv, table, i);
  }
  return src;
}

}  // namespace detail

using detail::check_paged;
using detail::paged_source;
using detail::PageTable;

void batch_decode(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                  const TensorView& lse, const AttentionOptions& opts) {
  const QOShape qo = detail::check_qo(q, out, lse);
  const PageTable table = check_paged(kv, qo);
  if (!(qo.rows == kv.batch_size())) {
    fail("q: batch size ", qo.rows, " (shape ", q.shape_str(),
         ") does not match paged_kv's batch size ", kv.batch_size());
  }
  check(opts.kv_scale.is_identity(), "opts.kv_scale: the paged ops take the cache's scales ",
        "(paged_kv.scale)");
  const double sm_scale = resolve_sm_scale(opts.sm_scale, qo.head_dim);
  std::vector<detail::Request> requests;
  for (int i = 0; i < kv.batch_size(); ++i) {
    requests.push_back({.q_begin = i, .qo_len = 1, .kv = paged_source(kv, table, i)});
  }
  // One query row per request: the causal mask (aligned to the end of the KV) hides nothing.
  detail::run_requests(q, requests, out, lse, kv.num_kv_heads(), sm_scale, /*causal=*/false);
}

void batch_prefill_paged(const TensorView& q, const TensorView& qo_indptr, const PagedKVCache& kv,
                         const TensorView& out, const TensorView& lse,
                         const AttentionOptions& opts) {
  const QOShape qo = detail::check_qo(q, out, lse);
  const PageTable table = check_paged(kv, qo);
  const std::vector<int64_t> qo_ptr =
      detail::read_indptr(qo_indptr, "qo_indptr", qo.rows, "q.size(0)");
  check(static_cast<int>(qo_ptr.size()) == kv.batch_size() + 1,
        "qo_indptr: expected batch + 1 = ", kv.batch_size() + 1,
        " entries (as paged_kv.indptr), got ", qo_ptr.size());
  check(opts.kv_scale.is_identity(), "opts.kv_scale: the paged ops take the cache's scales ",
        "(paged_kv.scale)");
  const double sm_scale = resolve_sm_scale(opts.sm_scale, qo.head_dim);
  std::vector<detail::Request> requests;
  for (int i = 0; i < kv.batch_size(); ++i) {
    requests.push_back({.q_begin = qo_ptr[i],
                        .qo_len = qo_ptr[i + 1] - qo_ptr[i],
                        .kv = paged_source(kv, table, i)});
  }
  detail::run_requests(q, requests, out, lse, kv.num_kv_heads(), sm_scale, opts.causal);
}

}  // namespace flashkv::reference
