// CPU reference attention: the core routine (attend_row), the helpers every op shares, and the
// ops over contiguous KV (single_decode, single_prefill, batch_prefill_ragged). The paged ops are
// in attention_paged.cpp. Everything accumulates in double; outputs are rounded once, at the end.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/kv_quant_rows.h"
#include "core/parallel.h"
#include "flashkv/error.h"
#include "flashkv/plan_checks.h"
#include "flashkv/reference.h"
#include "reference/attend.h"

namespace flashkv::reference {
namespace detail {
namespace {

// Every value of a 1- or 2-byte dtype, indexed by its bits, as load_as_double() reads it.
std::vector<double> decode_table(DType t) {
  std::vector<double> table(size_t{1} << (8 * dtype_size(t)));
  for (size_t bits = 0; bits < table.size(); ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);  // little-endian: a u8 is its low byte
    table[bits] = load_as_double(&b, t, 0);
  }
  return table;
}

template <DType T>
const double* cached_decode_table() {
  static const std::vector<double> table = decode_table(T);  // built once, thread-safe
  return table.data();
}

// Reads elements of one dtype as double, returning exactly what load_as_double() returns. The 8-
// and 16-bit dtypes are looked up in a table of every bit pattern: decoding an f16 element
// costs about 27 ns, and gather() decodes every K/V element (2 x 134M of them for one 128k-token
// request with 8 kv heads of 128).
class Decoder {
 public:
  explicit Decoder(DType t) : dtype_(t), bytes_(dtype_size(t)) {
    switch (t) {
      case DType::f16:
        table_ = cached_decode_table<DType::f16>();
        break;
      case DType::bf16:
        table_ = cached_decode_table<DType::bf16>();
        break;
      case DType::e4m3:
        table_ = cached_decode_table<DType::e4m3>();
        break;
      case DType::e5m2:
        table_ = cached_decode_table<DType::e5m2>();
        break;
      default:
        break;  // f32, i32: load_as_double is a plain load
    }
  }

  // Element i of `data`.
  double operator()(const void* data, int64_t i) const {
    if (table_ == nullptr) return load_as_double(data, dtype_, i);
    const char* p = static_cast<const char*>(data) + i * static_cast<int64_t>(bytes_);
    if (bytes_ == 1) return table_[static_cast<uint8_t>(*p)];
    uint16_t bits;
    std::memcpy(&bits, p, sizeof(bits));
    return table_[bits];
  }

 private:
  DType dtype_;
  size_t bytes_;
  const double* table_ = nullptr;  // [2^(8 * bytes_)] for the 1- and 2-byte dtypes
};

}  // namespace

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
                           int64_t len, const KVScale& scale) {
  const int token_dim = layout == KVLayout::NHD ? 0 : 1;
  const int head_dim = 1 - token_dim;
  KVSource src;
  src.k = k;
  src.v = v;
  src.k_token.resize(len);
  src.v_token.resize(len);
  const int64_t k_token_stride = k.stride(token_dim), v_token_stride = v.stride(token_dim);
  for (int64_t t = 0; t < len; ++t) {
    src.k_token[t] = (begin + t) * k_token_stride;
    src.v_token[t] = (begin + t) * v_token_stride;
  }
  src.k_head_stride = k.stride(head_dim);
  src.v_head_stride = v.stride(head_dim);
  src.k_dim_stride = k.stride(2);
  src.v_dim_stride = v.stride(2);
  src.scale = scale;
  return src;
}

float head_scale(float factor, const TensorView& t, int head) {
  if (!t.defined()) return factor;
  const float entry = t.data_as<const float>()[t.size(0) == 1 ? 0 : head];
  return factor * entry;  // in f32, as the kernels form it
}

namespace {

// Token t's group entries of `pool` for kv head `head`.
flashkv::detail::GroupEntries pool_entries(const GroupPool& pool, int64_t t, int head) {
  if (!pool.t.defined()) return {};
  const int64_t offset = pool.token[t] + head * pool.head_stride;
  auto* p =
      static_cast<char*>(pool.t.data()) + offset * static_cast<int64_t>(dtype_size(pool.t.dtype()));
  return {p, pool.t.dtype(), pool.group_stride};
}

// gather() over a quantized format: each row dequantized exactly (kv_quant.h) by the one copy of
// the formats' arithmetic the host quantizers use.
KVRows gather_quantized(const KVSource& src, int head, int dim) {
  KVRows rows;
  rows.len = src.len();
  rows.dim = dim;
  rows.k.resize(rows.len * dim);
  rows.v.resize(rows.len * dim);
  const KVQuantFormat& f = src.scale.format;
  const float k_g = head_scale(src.scale.k, src.scale.k_tensor, head);
  const float v_g = head_scale(src.scale.v, src.scale.v_tensor, head);
  const auto* k_bytes = static_cast<const char*>(src.k.data());  // 1-byte elements
  const auto* v_bytes = static_cast<const char*>(src.v.data());
  for (int64_t t = 0; t < rows.len; ++t) {
    flashkv::detail::dequantize_row(f, src.k.dtype(),
                                    k_bytes + src.k_token[t] + head * src.k_head_stride, dim, k_g,
                                    pool_entries(src.k_scales, t, head),
                                    pool_entries(src.k_zeros, t, head), rows.k.data() + t * dim);
    flashkv::detail::dequantize_row(f, src.v.dtype(),
                                    v_bytes + src.v_token[t] + head * src.v_head_stride, dim, v_g,
                                    pool_entries(src.v_scales, t, head),
                                    pool_entries(src.v_zeros, t, head), rows.v.data() + t * dim);
  }
  return rows;
}

}  // namespace

KVRows gather(const KVSource& src, int head, int dim) {
  if (!src.scale.format.is_none()) return gather_quantized(src, head, dim);
  KVRows rows;
  rows.len = src.len();
  rows.dim = dim;
  rows.k.resize(rows.len * dim);
  rows.v.resize(rows.len * dim);
  const Decoder k_at(src.k.dtype()), v_at(src.v.dtype());
  const int64_t k_head = head * src.k_head_stride;
  const int64_t v_head = head * src.v_head_stride;
  // Exact: an fp8 value times an f32 scale fits a double's 53 bits.
  const double k_scale = head_scale(src.scale.k, src.scale.k_tensor, head);
  const double v_scale = head_scale(src.scale.v, src.scale.v_tensor, head);
  for (int64_t t = 0; t < rows.len; ++t) {
    for (int d = 0; d < dim; ++d) {
      rows.k[t * dim + d] =
          k_scale * k_at(src.k.data(), src.k_token[t] + k_head + d * src.k_dim_stride);
      rows.v[t * dim + d] =
          v_scale * v_at(src.v.data(), src.v_token[t] + v_head + d * src.v_dim_stride);
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
  if (!(s.head_dim > 0)) {
    fail("q: head_dim (the last dimension) must be positive, got shape ", q.shape_str());
  }
  check_shape(out, "out", {s.rows, s.num_qo_heads, s.head_dim});
  if (lse.defined()) {
    check_device(lse, "lse", Device::cpu());
    check_dtype(lse, "lse", DType::f32);
    check_shape(lse, "lse", {s.rows, s.num_qo_heads});
  }
  return s;
}

namespace {

// One (request, kv head) of run_requests(): the query heads of the kv head's GQA group, over all
// of the request's query rows.
void run_kv_head(const TensorView& q, const Request& req, int kv_head, int group,
                 const TensorView& out, const TensorView& lse, double sm_scale, bool causal) {
  const int dim = static_cast<int>(q.size(2));
  const int64_t kv_len = req.kv.len();
  const Decoder q_at(q.dtype());
  // Strides read once: TensorView::stride() formats an error message on every call.
  const int64_t q_s[3] = {q.stride(0), q.stride(1), q.stride(2)};
  const int64_t out_s[3] = {out.stride(0), out.stride(1), out.stride(2)};
  const int64_t lse_s[2] = {lse.defined() ? lse.stride(0) : 0, lse.defined() ? lse.stride(1) : 0};
  const KVRows rows = gather(req.kv, kv_head, dim);
  std::vector<double> q_row(dim);
  // GQA: query heads [kv_head * group, (kv_head + 1) * group) share this kv head.
  for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
    for (int64_t i = 0; i < req.qo_len; ++i) {
      const int64_t r = req.q_begin + i;
      for (int d = 0; d < dim; ++d) {
        q_row[d] = q_at(q.data(), r * q_s[0] + h * q_s[1] + d * q_s[2]);
      }
      // Causal, aligned to the end of the KV: row i sees keys j <= kv_len - qo_len + i.
      const int64_t visible = causal ? kv_len - req.qo_len + i + 1 : kv_len;
      const RowState st = attend_row(q_row, rows, visible, sm_scale);
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

void run_requests(const TensorView& q, const std::vector<Request>& requests, const TensorView& out,
                  const TensorView& lse, int num_kv_heads, double sm_scale, bool causal) {
  const int group = static_cast<int>(q.size(1)) / num_kv_heads;
  const int64_t num_items = static_cast<int64_t>(requests.size()) * num_kv_heads;
  flashkv::detail::parallel_for(num_items, [&](int64_t item) {
    run_kv_head(q, requests[item / num_kv_heads], static_cast<int>(item % num_kv_heads), group, out,
                lse, sm_scale, causal);
  });
}

std::vector<int64_t> read_indptr(const TensorView& t, const char* name, int64_t total,
                                 const char* total_name) {
  check_cpu(t, name);
  check_dtype(t, name, DType::i32);
  check_ndim(t, name, 1);
  if (!(t.size(0) >= 1)) {
    fail(name, ": expected batch + 1 >= 1 entries, got shape ", t.shape_str());
  }
  std::vector<int64_t> vals(t.size(0));
  const int64_t stride = t.stride(0);
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = t.data_as<const int32_t>()[i * stride];
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

std::pair<int64_t, int> check_contiguous_kv(const TensorView& k, const TensorView& v,
                                            KVLayout layout, const QOShape& qo) {
  check_cpu(k, "k");
  check_cpu(v, "v");
  check_floating(k, "k");
  check_floating(v, "v");
  check_ndim(k, "k", 3);
  if (!(k.size(2) == qo.head_dim)) {
    fail("k: head_dim ", k.size(2), " (shape ", k.shape_str(), ") does not match q's head_dim ",
         qo.head_dim);
  }
  check_shape(v, "v", {k.size(0), k.size(1), k.size(2)});
  // The heads k's shape reads in this layout; the message names the layout.
  return check_contiguous_kv_heads(k, layout, qo.num_qo_heads);
}

}  // namespace detail

using detail::check_contiguous_kv;
using detail::check_cpu;
using detail::check_qo;
using detail::contiguous_source;
using detail::QOShape;
using detail::read_indptr;
using detail::Request;
using detail::run_requests;
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
  check_kv_scale(opts.kv_scale, k.dtype(), num_kv_heads, Device::cpu(), false, "opts.kv_scale");
  const double sm_scale = resolve_sm_scale(opts.sm_scale, qo.head_dim);
  const std::vector<Request> requests{
      {.q_begin = 0,
       .qo_len = qo.rows,
       .kv = contiguous_source(k, v, layout, 0, kv_len, opts.kv_scale)}};
  run_requests(q, requests, out, lse, num_kv_heads, sm_scale, opts.causal);
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
  check_kv_scale(opts.kv_scale, k.dtype(), num_kv_heads, Device::cpu(), false, "opts.kv_scale");
  const double sm_scale = resolve_sm_scale(opts.sm_scale, qo.head_dim);
  std::vector<Request> requests;
  for (size_t i = 0; i + 1 < qo_ptr.size(); ++i) {
    requests.push_back({.q_begin = qo_ptr[i],
                        .qo_len = qo_ptr[i + 1] - qo_ptr[i],
                        .kv = contiguous_source(k, v, KVLayout::NHD, kv_ptr[i],
                                                kv_ptr[i + 1] - kv_ptr[i], opts.kv_scale)});
  }
  run_requests(q, requests, out, lse, num_kv_heads, sm_scale, opts.causal);
}

}  // namespace flashkv::reference
