// The reference's variant ops, part 3: the public ops of reference_variants.h. Each builds the
// requests of its KV storage exactly as its reference.h twin does, then runs them through the
// variant's hooks (variant_attend.cpp).
#include <vector>

#include "flashkv/error.h"
#include "flashkv/reference_variants.h"
#include "reference/variant.h"

namespace flashkv::reference {

using detail::QOShape;
using detail::Request;

void single_decode_variant(const TensorView& q, const TensorView& k, const TensorView& v,
                           const TensorView& out, const TensorView& lse, KVLayout layout,
                           const AttentionVariant& variant, const KVChunk& chunk) {
  detail::check_cpu(q, "q");
  detail::check_cpu(out, "out");
  check_ndim(q, "q", 2);
  check_shape(out, "out", {q.size(0), q.size(1)});
  if (lse.defined()) check_shape(lse, "lse", {q.size(0)});
  single_prefill_variant(detail::unsqueeze0(q), k, v, detail::unsqueeze0(out),
                         detail::unsqueeze0(lse), layout, variant, chunk);
}

void single_prefill_variant(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const TensorView& lse, KVLayout layout,
                            const AttentionVariant& variant, const KVChunk& chunk) {
  const QOShape qo = detail::check_qo(q, out, lse);
  const auto [kv_len, num_kv_heads] = detail::check_contiguous_kv(k, v, layout, qo);
  const detail::ResolvedVariant rv = detail::resolve_variant(variant, chunk, qo, 1, lse);
  const std::vector<Request> requests{
      {.q_begin = 0, .qo_len = qo.rows, .kv = detail::contiguous_source(k, v, layout, 0, kv_len)}};
  detail::run_variant_requests(q, requests, out, lse, num_kv_heads, rv);
}

void batch_prefill_ragged_variant(const TensorView& q, const TensorView& qo_indptr,
                                  const TensorView& k, const TensorView& v,
                                  const TensorView& kv_indptr, const TensorView& out,
                                  const TensorView& lse, const AttentionVariant& variant,
                                  const KVChunk& chunk) {
  const QOShape qo = detail::check_qo(q, out, lse);
  const auto [nnz_kv, num_kv_heads] = detail::check_contiguous_kv(k, v, KVLayout::NHD, qo);
  const std::vector<int64_t> qo_ptr =
      detail::read_indptr(qo_indptr, "qo_indptr", qo.rows, "q.size(0)");
  const std::vector<int64_t> kv_ptr =
      detail::read_indptr(kv_indptr, "kv_indptr", nnz_kv, "k.size(0)");
  check(kv_ptr.size() == qo_ptr.size(), "kv_indptr: expected batch + 1 = ", qo_ptr.size(),
        " entries (as qo_indptr), got ", kv_ptr.size());
  const int64_t batch = static_cast<int64_t>(qo_ptr.size()) - 1;
  const detail::ResolvedVariant rv = detail::resolve_variant(variant, chunk, qo, batch, lse);
  std::vector<Request> requests;
  for (int64_t i = 0; i < batch; ++i) {
    requests.push_back({.q_begin = qo_ptr[i],
                        .qo_len = qo_ptr[i + 1] - qo_ptr[i],
                        .kv = detail::contiguous_source(k, v, KVLayout::NHD, kv_ptr[i],
                                                        kv_ptr[i + 1] - kv_ptr[i])});
  }
  detail::run_variant_requests(q, requests, out, lse, num_kv_heads, rv);
}

void batch_decode_variant(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                          const TensorView& lse, const AttentionVariant& variant,
                          const KVChunk& chunk) {
  const QOShape qo = detail::check_qo(q, out, lse);
  const detail::PageTable table = detail::check_paged(kv, qo);
  if (!(qo.rows == kv.batch_size())) {
    fail("q: batch size ", qo.rows, " (shape ", q.shape_str(),
         ") does not match paged_kv's batch size ", kv.batch_size());
  }
  const detail::ResolvedVariant rv =
      detail::resolve_variant(variant, chunk, qo, kv.batch_size(), lse);
  std::vector<Request> requests;
  for (int i = 0; i < kv.batch_size(); ++i) {
    requests.push_back({.q_begin = i, .qo_len = 1, .kv = detail::paged_source(kv, table, i)});
  }
  detail::run_variant_requests(q, requests, out, lse, kv.num_kv_heads(), rv);
}

void batch_prefill_paged_variant(const TensorView& q, const TensorView& qo_indptr,
                                 const PagedKVCache& kv, const TensorView& out,
                                 const TensorView& lse, const AttentionVariant& variant,
                                 const KVChunk& chunk) {
  const QOShape qo = detail::check_qo(q, out, lse);
  const detail::PageTable table = detail::check_paged(kv, qo);
  const std::vector<int64_t> qo_ptr =
      detail::read_indptr(qo_indptr, "qo_indptr", qo.rows, "q.size(0)");
  check(static_cast<int>(qo_ptr.size()) == kv.batch_size() + 1,
        "qo_indptr: expected batch + 1 = ", kv.batch_size() + 1,
        " entries (as paged_kv.indptr), got ", qo_ptr.size());
  const detail::ResolvedVariant rv =
      detail::resolve_variant(variant, chunk, qo, kv.batch_size(), lse);
  std::vector<Request> requests;
  for (int i = 0; i < kv.batch_size(); ++i) {
    requests.push_back({.q_begin = qo_ptr[i],
                        .qo_len = qo_ptr[i + 1] - qo_ptr[i],
                        .kv = detail::paged_source(kv, table, i)});
  }
  detail::run_variant_requests(q, requests, out, lse, kv.num_kv_heads(), rv);
}

}  // namespace flashkv::reference
