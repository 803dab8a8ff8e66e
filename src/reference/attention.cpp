// CPU reference attention: the core routine (attend_row), the helpers every op shares, and the
// ops over contiguous KV (single_decode, single_prefill, batch_prefill_ragged). The paged ops are
// in attention_paged.cpp. Everything accumulates in double; outputs are rounded once, at the end.
#include <algorithm>
#include <cmath>
#include <utility>

#include "flashkv/error.h"
#include "flashkv/reference.h"
#include "reference/attend.h"

namespace flashkv::reference {
namespace detail {

RowState attend_row(std::span<const double> q, const KVRows& kv, int64_t num_keys,
                    double sm_scale) {
  const int dim = kv.dim;
  RowState state;
  state.o.assign(dim, 0.0);
  num_keys = std::min(num_keys, kv.len);
  if (num_keys <= 0) return state;

  std::vector<double> logits(num_keys);
  double max_logit = kNegInf;
  for (int64_t j = 0; j < num_keys; ++j) {
    const double* k = kv.k.data() + j * dim;
    double dot = 0.0;
    for (int d = 0; d < dim; ++d) dot += q[d] * k[d];
    logits[j] = sm_scale * dot;
    max_logit = std::max(max_logit, logits[j]);
  }
  // Subtracting the max keeps every exp() <= 1, so nothing overflows whatever the logit range.
  double denom = 0.0;
  for (int64_t j = 0; j < num_keys; ++j) {
    const double p = std::exp(logits[j] - max_logit);
    const double* v = kv.v.data() + j * dim;
    denom += p;
    for (int d = 0; d < dim; ++d) state.o[d] += p * v[d];
  }
  for (int d = 0; d < dim; ++d) state.o[d] /= denom;
  state.lse = max_logit + std::log(denom);
  return state;
}

KVSource contiguous_source(const TensorView& k, const TensorView& v, KVLayout layout, int64_t begin,
                           int64_t len) {
  const int token_dim = layout == KVLayout::NHD ? 0 : 1;
  const int head_dim = 1 - token_dim;
  KVSource src;
  src.k = k;
  src.v = v;
  src.k_token.resize(len);
  src.v_token.resize(len);
  for (int64_t t = 0; t < len; ++t) {
    src.k_token[t] = (begin + t) * k.stride(token_dim);
    src.v_token[t] = (begin + t) * v.stride(token_dim);
  }
  src.k_head_stride = k.stride(head_dim);
  src.v_head_stride = v.stride(head_dim);
  src.k_dim_stride = k.stride(2);
  src.v_dim_stride = v.stride(2);
  return src;
}

KVRows gather(const KVSource& src, int head, int dim) {
  KVRows rows;
  rows.len = src.len();
  rows.dim = dim;
  rows.k.resize(rows.len * dim);
  rows.v.resize(rows.len * dim);
  const int64_t k_head = head * src.k_head_stride;
  const int64_t v_head = head * src.v_head_stride;
  for (int64_t t = 0; t < rows.len; ++t) {
    for (int d = 0; d < dim; ++d) {
      rows.k[t * dim + d] = load_as_double(src.k.data(), src.k.dtype(),
                                           src.k_token[t] + k_head + d * src.k_dim_stride);
      rows.v[t * dim + d] = load_as_double(src.v.data(), src.v.dtype(),
                                           src.v_token[t] + v_head + d * src.v_dim_stride);
    }
  }
  return rows;
}

void check_cpu(const TensorView& t, const char* name) {
  check_defined(t, name);
  check_device(t, name, Device::cpu());
}

void check_floating(const TensorView& t, const char* name) {
  check_dtype_in(t, name, {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2});
}

QOShape check_qo(const TensorView& q, const TensorView& out, const TensorView& lse) {
  check_cpu(q, "q");
  check_cpu(out, "out");
  check_floating(q, "q");
  check_floating(out, "out");
  check_ndim(q, "q", 3);
  const QOShape s{.rows = q.size(0),
                  .num_qo_heads = static_cast<int>(q.size(1)),
                  .head_dim = static_cast<int>(q.size(2))};
  check(s.head_dim > 0, "q: head_dim (the last dimension) must be positive, got shape ",
        q.shape_str());
  check_shape(out, "out", {s.rows, s.num_qo_heads, s.head_dim});
  if (lse.defined()) {
    check_device(lse, "lse", Device::cpu());
    check_dtype(lse, "lse", DType::f32);
    check_shape(lse, "lse", {s.rows, s.num_qo_heads});
  }
  return s;
}

void run_request(const TensorView& q, int64_t q_begin, int64_t qo_len, const KVSource& src,
                 const TensorView& out, const TensorView& lse, int num_kv_heads, double sm_scale,
                 bool causal) {
  const int num_qo_heads = static_cast<int>(q.size(1));
  const int dim = static_cast<int>(q.size(2));
  const int group = num_qo_heads / num_kv_heads;
  const int64_t kv_len = src.len();
  std::vector<double> q_row(dim);
  for (int kv_head = 0; kv_head < num_kv_heads; ++kv_head) {
    const KVRows rows = gather(src, kv_head, dim);
    // GQA: query heads [kv_head * group, (kv_head + 1) * group) share this kv head.
    for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
      for (int64_t i = 0; i < qo_len; ++i) {
        const int64_t r = q_begin + i;
        for (int d = 0; d < dim; ++d) {
          q_row[d] = load_as_double(q.data(), q.dtype(),
                                    r * q.stride(0) + h * q.stride(1) + d * q.stride(2));
        }
        // Causal, aligned to the end of the KV: row i sees keys j <= kv_len - qo_len + i.
        const int64_t visible = causal ? kv_len - qo_len + i + 1 : kv_len;
        const RowState st = attend_row(q_row, rows, visible, sm_scale);
        for (int d = 0; d < dim; ++d) {
          store_from_double(out.data(), out.dtype(),
                            r * out.stride(0) + h * out.stride(1) + d * out.stride(2), st.o[d]);
        }
        if (lse.defined()) {
          store_from_double(lse.data(), lse.dtype(), r * lse.stride(0) + h * lse.stride(1), st.lse);
        }
      }
    }
  }
}

std::vector<int64_t> read_indptr(const TensorView& t, const char* name, int64_t total,
                                 const char* total_name) {
  check_cpu(t, name);
  check_dtype(t, name, DType::i32);
  check_ndim(t, name, 1);
  check(t.size(0) >= 1, name, ": expected batch + 1 >= 1 entries, got shape ", t.shape_str());
  std::vector<int64_t> vals(t.size(0));
  for (int64_t i = 0; i < t.size(0); ++i) vals[i] = t.data_as<const int32_t>()[i * t.stride(0)];
  check(vals[0] == 0, name, "[0] must be 0, got ", vals[0]);
  for (size_t i = 1; i < vals.size(); ++i) {
    check(vals[i] >= vals[i - 1], name, " must be non-decreasing, but ", name, "[", i,
          "] = ", vals[i], " < ", name, "[", i - 1, "] = ", vals[i - 1]);
  }
  check(vals.back() == total, name, "[batch] = ", vals.back(), " must equal ", total_name, " = ",
        total);
  return vals;
}

TensorView unsqueeze0(const TensorView& t) {
  if (!t.defined()) return t;
  int64_t shape[TensorView::kMaxDims];
  int64_t strides[TensorView::kMaxDims];
  check(t.ndim() < TensorView::kMaxDims, "unsqueeze0: tensor ", t.str(), " has too many dims");
  shape[0] = 1;
  strides[0] = 0;  // never stepped over: the new dimension has size 1
  for (int d = 0; d < t.ndim(); ++d) {
    shape[d + 1] = t.size(d);
    strides[d + 1] = t.stride(d);
  }
  return TensorView(t.data(), t.dtype(), t.ndim() + 1, shape, strides, t.device());
}

namespace {

// Checks contiguous k, v ([kv_len, H_kv, D] NHD / [H_kv, kv_len, D] HND) against q's head_dim
// and head count; returns {kv_len, H_kv}.
std::pair<int64_t, int> check_contiguous_kv(const TensorView& k, const TensorView& v,
                                            KVLayout layout, const QOShape& qo) {
  check_cpu(k, "k");
  check_cpu(v, "v");
  check_floating(k, "k");
  check_floating(v, "v");
  check_ndim(k, "k", 3);
  check(k.size(2) == qo.head_dim, "k: head_dim ", k.size(2), " (shape ", k.shape_str(),
        ") does not match q's head_dim ", qo.head_dim);
  check_shape(v, "v", {k.size(0), k.size(1), k.size(2)});
  const bool nhd = layout == KVLayout::NHD;
  const int num_kv_heads = static_cast<int>(k.size(nhd ? 1 : 0));
  check_heads(qo.num_qo_heads, num_kv_heads);
  return {k.size(nhd ? 0 : 1), num_kv_heads};
}

}  // namespace
}  // namespace detail

using detail::check_contiguous_kv;
using detail::check_cpu;
using detail::check_qo;
using detail::contiguous_source;
using detail::KVSource;
using detail::QOShape;
using detail::read_indptr;
using detail::run_request;
using detail::unsqueeze0;

void single_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const TensorView& lse, KVLayout layout,
                   const AttentionOptions& opts) {
  // Decode is prefill with one query row; check the 2-d shapes here so messages show them.
  check_cpu(q, "q");
  check_cpu(out, "out");
  check_ndim(q, "q", 2);
  check_shape(out, "out", {q.size(0), q.size(1)});
  if (lse.defined()) check_shape(lse, "lse", {q.size(0)});
  single_prefill(unsqueeze0(q), k, v, unsqueeze0(out), unsqueeze0(lse), layout, opts);
}

void single_prefill(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const TensorView& lse, KVLayout layout,
                    const AttentionOptions& opts) {
  const QOShape qo = check_qo(q, out, lse);
  const auto [kv_len, num_kv_heads] = check_contiguous_kv(k, v, layout, qo);
  const double sm_scale = resolve_sm_scale(opts.sm_scale, qo.head_dim);
  run_request(q, 0, qo.rows, contiguous_source(k, v, layout, 0, kv_len), out, lse, num_kv_heads,
              sm_scale, opts.causal);
}

void batch_prefill_ragged(const TensorView& q, const TensorView& qo_indptr, const TensorView& k,
                          const TensorView& v, const TensorView& kv_indptr, const TensorView& out,
                          const TensorView& lse, const AttentionOptions& opts) {
  const QOShape qo = check_qo(q, out, lse);
  const auto [nnz_kv, num_kv_heads] = check_contiguous_kv(k, v, KVLayout::NHD, qo);
  const std::vector<int64_t> qo_ptr = read_indptr(qo_indptr, "qo_indptr", qo.rows, "q.size(0)");
  const std::vector<int64_t> kv_ptr = read_indptr(kv_indptr, "kv_indptr", nnz_kv, "k.size(0)");
  check(kv_ptr.size() == qo_ptr.size(), "kv_indptr: expected batch + 1 = ", qo_ptr.size(),
        " entries (as qo_indptr), got ", kv_ptr.size());
  const double sm_scale = resolve_sm_scale(opts.sm_scale, qo.head_dim);
  for (size_t i = 0; i + 1 < qo_ptr.size(); ++i) {
    const KVSource src =
        contiguous_source(k, v, KVLayout::NHD, kv_ptr[i], kv_ptr[i + 1] - kv_ptr[i]);
    run_request(q, qo_ptr[i], qo_ptr[i + 1] - qo_ptr[i], src, out, lse, num_kv_heads, sm_scale,
                opts.causal);
  }
}

}  // namespace flashkv::reference
