// The reference's variant ops, part 2: the hooks (VariantHooks), one row through them
// (attend_variant_row) and the parallel loop over (request, kv head) (run_variant_requests).
// The math is variants.h's, written out once here in double.
#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "flashkv/error.h"
#include "reference/variant.h"

namespace flashkv::reference::detail {

VariantHooks::VariantHooks(const ResolvedVariant& v, int64_t b, int64_t qo_len, int64_t kv_len,
                           int head)
    : v_(v), qo_len_(qo_len), kv_len_(kv_len) {
  if (!v.alibi_slopes.empty()) alibi_slope_ = v.alibi_slopes[head];
  sink_ = (!v.sinks.empty() && v.chunk.with_sinks) ? v.sinks[head] : kNegInf;
  if (v.mask != nullptr) mask_ = v.mask + v.mask_offset[b];
}

void VariantHooks::query_transform(std::span<double> q, int64_t row, int64_t i) const {
  if (v_.rope == RopeMode::none) return;
  apply_rope(q, v_.rope_freq, v_.q_rope_pos.empty() ? q_pos(i) : v_.q_rope_pos[row]);
}

void VariantHooks::key_transform(const ResolvedVariant& v, int64_t b, std::span<double> k,
                                 int64_t j) {
  if (v.rope == RopeMode::none) return;
  apply_rope(k, v.rope_freq, (v.k_rope_base.empty() ? 0 : v.k_rope_base[b]) + j);
}

bool VariantHooks::logits_mask(int64_t i, int64_t j) const {
  const int64_t qp = q_pos(i);
  if (v_.causal && j > qp) return false;
  if (v_.window_left >= 0 && j < qp - v_.window_left) return false;
  if (v_.window_right >= 0 && j > qp + v_.window_right) return false;
  if (mask_ != nullptr && !custom_mask_bit(mask_, kv_len_, i, j)) return false;
  return true;
}

double VariantHooks::logits_transform(double x, int64_t i, int64_t j) const {
  double s = v_.sm_scale * x;
  if (alibi_slope_ != 0) s += alibi_slope_ * static_cast<double>(j - q_pos(i));
  if (v_.soft_cap > 0) s = v_.soft_cap * std::tanh(s / v_.soft_cap);
  if (v_.sigmoid) s = 1.0 / (1.0 + std::exp(-(s + v_.sigmoid_bias)));
  return s;
}

RowState attend_variant_row(std::span<const double> q, const KVRows& kv, const VariantHooks& hooks,
                            int64_t i, const KVChunk& chunk) {
  const int dim = kv.dim;
  RowState state;
  state.o.assign(dim, 0.0);
  const int64_t begin = std::min(chunk.begin, kv.len);
  const int64_t end = chunk.end < 0 ? kv.len : std::min(chunk.end, kv.len);

  std::vector<int64_t> keys;  // kept keys of [begin, end)
  std::vector<double> logits;
  for (int64_t j = begin; j < end; ++j) {
    if (!hooks.logits_mask(i, j)) continue;
    const double* k = kv.k.data() + j * dim;
    double dot = 0.0;
    for (int d = 0; d < dim; ++d) dot += q[d] * k[d];
    keys.push_back(j);
    logits.push_back(hooks.logits_transform(dot, i, j));
  }

  if (!hooks.use_softmax()) {  // sigmoid: the weights are the transformed logits themselves
    for (size_t n = 0; n < keys.size(); ++n) {
      const double* v = kv.v.data() + keys[n] * dim;
      for (int d = 0; d < dim; ++d) state.o[d] += logits[n] * v[d];
    }
    return state;
  }

  // The sink is one more logit of the denominator whose value vector is zero.
  const double sink = hooks.sink_logit();
  double m = sink;
  for (double s : logits) m = std::max(m, s);
  if (m == kNegInf) return state;  // no kept key and no sink: (0, -inf)
  double denom = sink == kNegInf ? 0.0 : std::exp(sink - m);
  for (size_t n = 0; n < keys.size(); ++n) {
    const double p = std::exp(logits[n] - m);
    const double* v = kv.v.data() + keys[n] * dim;
    denom += p;
    for (int d = 0; d < dim; ++d) state.o[d] += p * v[d];
  }
  for (int d = 0; d < dim; ++d) state.o[d] /= denom;
  state.lse = m + std::log(denom);
  return state;
}

namespace {

// One (request b, kv head) of run_variant_requests(): the query heads of the kv head's group.
void run_variant_kv_head(const TensorView& q, const Request& req, int64_t b, int kv_head, int group,
                         const TensorView& out, const TensorView& lse, const ResolvedVariant& v) {
  const int dim = static_cast<int>(q.size(2));
  const int64_t kv_len = req.kv.len();
  const int64_t q_s[3] = {q.stride(0), q.stride(1), q.stride(2)};
  const int64_t out_s[3] = {out.stride(0), out.stride(1), out.stride(2)};
  const int64_t lse_s[2] = {lse.defined() ? lse.stride(0) : 0, lse.defined() ? lse.stride(1) : 0};
  KVRows rows = gather(req.kv, kv_head, dim);
  for (int64_t j = 0; j < rows.len; ++j) {
    VariantHooks::key_transform(v, b, std::span<double>(rows.k.data() + j * dim, dim), j);
  }
  std::vector<double> q_row(dim);
  for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
    const VariantHooks hooks(v, b, req.qo_len, kv_len, h);
    for (int64_t i = 0; i < req.qo_len; ++i) {
      const int64_t r = req.q_begin + i;
      for (int d = 0; d < dim; ++d) {
        q_row[d] = load_as_double(q.data(), q.dtype(), r * q_s[0] + h * q_s[1] + d * q_s[2]);
      }
      hooks.query_transform(q_row, r, i);
      const RowState st = attend_variant_row(q_row, rows, hooks, i, v.chunk);
      for (int d = 0; d < dim; ++d) {
        store_from_double(out.data(), out.dtype(), r * out_s[0] + h * out_s[1] + d * out_s[2],
                          st.o[d]);
      }
      if (lse.defined()) {
        store_from_double(lse.data(), lse.dtype(), r * lse_s[0] + h * lse_s[1], st.lse);
      }
    }
  }
}

}  // namespace

void run_variant_requests(const TensorView& q, const std::vector<Request>& requests,
                          const TensorView& out, const TensorView& lse, int num_kv_heads,
                          const ResolvedVariant& v) {
  for (size_t b = 0; b < requests.size(); ++b) {
    check_mask_extent(v, static_cast<int64_t>(b), requests[b].qo_len, requests[b].kv.len());
  }
  const int group = static_cast<int>(q.size(1)) / num_kv_heads;
  const int64_t num_items = static_cast<int64_t>(requests.size()) * num_kv_heads;
  flashkv::detail::parallel_for(num_items, [&](int64_t item) {
    const int64_t b = item / num_kv_heads;
    run_variant_kv_head(q, requests[b], b, static_cast<int>(item % num_kv_heads), group, out, lse,
                        v);
  });
}

}  // namespace flashkv::reference::detail
