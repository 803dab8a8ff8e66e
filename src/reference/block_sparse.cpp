// The CPU reference of block-sparse attention (flashkv/reference_block_sparse.h): the layout is
// expanded, row by row, into the sorted list of keys the row sees (the dense mask's nonzeros),
// and each (row, query head) is attended over exactly those keys in double. Independent of how a
// kernel gathers blocks: nothing here is shared with the GPU path but the layout checks.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "core/parallel.h"
#include "flashkv/error.h"
#include "flashkv/reference_block_sparse.h"
#include "reference/attend.h"

namespace flashkv::reference {
namespace {

using detail::kNegInf;

// The keys query row m (of M, over N keys) sees, for KV head h, in increasing order.
using RowKeys = std::function<void(int h, int64_t m, std::vector<int64_t>& keys)>;

struct Checked {
  detail::QOShape qo;
  int num_kv_heads = 0;
  double sm_scale = 0;
  std::vector<double> sinks;   // [H_qo] or empty
  std::vector<double> slopes;  // [H_qo] ALiBi or empty
  std::vector<double> freqs;   // [D / 2] RoPE or empty
};

Checked check_call(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const TensorView& lse, int64_t M, int64_t N,
                   const BlockSparseOptions& opts) {
  Checked c;
  c.qo = detail::check_qo(q, out, lse);
  check(c.qo.rows == M, "q: expected M = ", M, " query rows (the layout's), got ", c.qo.rows);
  const auto [kv_len, heads] = detail::check_contiguous_kv(k, v, KVLayout::NHD, c.qo);
  check(kv_len == N, "k: expected N = ", N, " key tokens (the layout's), got ", kv_len);
  c.num_kv_heads = heads;
  check_kv_scale(opts.kv_scale, k.dtype(), heads, Device::cpu(), false, "opts.kv_scale");
  check(std::isfinite(opts.logits_soft_cap) && opts.logits_soft_cap >= 0.f,
        "opts.logits_soft_cap: expected >= 0 (0: off), got ", opts.logits_soft_cap);
  c.sm_scale = resolve_sm_scale(opts.sm_scale, c.qo.head_dim);
  if (opts.sinks.defined()) {
    detail::check_cpu(opts.sinks, "opts.sinks");
    check_dtype(opts.sinks, "opts.sinks", DType::f32);
    check_shape(opts.sinks, "opts.sinks", {c.qo.num_qo_heads});
    for (int h = 0; h < c.qo.num_qo_heads; ++h)
      c.sinks.push_back(load_as_double(opts.sinks.data(), DType::f32, h * opts.sinks.stride(0)));
  }
  if (opts.alibi_slopes.defined()) {
    detail::check_cpu(opts.alibi_slopes, "opts.alibi_slopes");
    check_dtype(opts.alibi_slopes, "opts.alibi_slopes", DType::f32);
    check_shape(opts.alibi_slopes, "opts.alibi_slopes", {c.qo.num_qo_heads});
    for (int h = 0; h < c.qo.num_qo_heads; ++h)
      c.slopes.push_back(
          load_as_double(opts.alibi_slopes.data(), DType::f32, h * opts.alibi_slopes.stride(0)));
  }
  if (opts.rope.mode != RopeMode::none) {
    check(!opts.rope.q_rope_offset.defined() && !opts.rope.k_rope_offset.defined(),
          "opts.rope: block-sparse RoPE takes the tokens' own positions; q_rope_offset / "
          "k_rope_offset are not taken");
    c.freqs = rope_frequencies(opts.rope, c.qo.head_dim);
  }
  return c;
}

// RoPE (rotate-half pairs) of x[D] at position pos, exact (as the variant reference: the
// kernels' rounding of rotated q and k to 16 bits is within the tolerance).
void rope(std::span<double> x, const std::vector<double>& freqs, int64_t pos) {
  const size_t half = freqs.size();
  for (size_t i = 0; i < half; ++i) {
    const double a = static_cast<double>(pos) * freqs[i], c = std::cos(a), sn = std::sin(a);
    const double x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c - x2 * sn;
    x[i + half] = x2 * c + x1 * sn;
  }
}

// One query row of one query head over `keys` of `kv`: the state of reference_block_sparse.h.
// slope != 0: ALiBi, logit += slope * (key - qpos) (before the soft-cap, as the kernels).
detail::RowState attend_keys(std::span<const double> q, const detail::KVRows& kv,
                             const std::vector<int64_t>& keys, double sm_scale, double cap,
                             double sink, double slope, int64_t qpos) {
  const int dim = kv.dim;
  detail::RowState st;
  st.o.assign(dim, 0.0);
  std::vector<double> s(keys.size());
  double m = sink;
  for (size_t n = 0; n < keys.size(); ++n) {
    const double* k = kv.k.data() + keys[n] * dim;
    double dot = 0.0;
    for (int d = 0; d < dim; ++d) dot += q[d] * k[d];
    s[n] = sm_scale * dot + slope * static_cast<double>(keys[n] - qpos);
    if (cap > 0) s[n] = cap * std::tanh(s[n] / cap);
    m = std::max(m, s[n]);
  }
  if (m == kNegInf) return st;  // no key and no sink
  double denom = sink == kNegInf ? 0.0 : std::exp(sink - m);
  for (size_t n = 0; n < keys.size(); ++n) {
    const double p = std::exp(s[n] - m);
    const double* v = kv.v.data() + keys[n] * dim;
    denom += p;
    for (int d = 0; d < dim; ++d) st.o[d] += p * v[d];
  }
  for (int d = 0; d < dim; ++d) st.o[d] /= denom;
  st.lse = m + std::log(denom);
  return st;
}

void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
         const TensorView& lse, const BlockSparseOptions& opts, const Checked& c,
         const RowKeys& row_keys) {
  const int dim = c.qo.head_dim, group = c.qo.num_qo_heads / c.num_kv_heads;
  const detail::KVSource src =
      detail::contiguous_source(k, v, KVLayout::NHD, 0, k.size(0), opts.kv_scale);
  const int64_t shift = k.size(0) - c.qo.rows;  // N - M: query row m sits at m + N - M
  for (int h = 0; h < c.num_kv_heads; ++h) {
    detail::KVRows rows = detail::gather(src, h, dim);
    if (!c.freqs.empty())  // keys rotated at their token positions
      for (int64_t n = 0; n < rows.len; ++n)
        rope(std::span<double>(rows.k.data() + n * dim, dim), c.freqs, n);
    flashkv::detail::parallel_for(c.qo.rows, [&](int64_t m) {
      std::vector<int64_t> keys;
      row_keys(h, m, keys);
      std::vector<double> qr(dim);
      for (int qh = h * group; qh < (h + 1) * group; ++qh) {
        for (int d = 0; d < dim; ++d)
          qr[d] = load_as_double(q.data(), q.dtype(),
                                 m * q.stride(0) + qh * q.stride(1) + d * q.stride(2));
        if (!c.freqs.empty()) rope(qr, c.freqs, m + shift);
        const double sink = c.sinks.empty() ? kNegInf : c.sinks[qh];
        const double slope = c.slopes.empty() ? 0.0 : c.slopes[qh];
        const detail::RowState st =
            attend_keys(qr, rows, keys, c.sm_scale, opts.logits_soft_cap, sink, slope, m + shift);
        for (int d = 0; d < dim; ++d)
          store_from_double(out.data(), out.dtype(),
                            m * out.stride(0) + qh * out.stride(1) + d * out.stride(2), st.o[d]);
        if (lse.defined())
          store_from_double(lse.data(), lse.dtype(), m * lse.stride(0) + qh * lse.stride(1),
                            st.lse);
      }
    });
  }
}

// Causal (block_sparse.h): key n is visible to row m iff n <= m + N - M.
bool causal_ok(bool causal, int64_t m, int64_t n, int64_t M, int64_t N) {
  return !causal || n <= m + N - M;
}

}  // namespace

void block_sparse_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                            const BlockSparseLayout& l, const TensorView& out,
                            const TensorView& lse, const BlockSparseOptions& opts) {
  check_block_sparse_layout(l);
  const Checked c = check_call(q, k, v, out, lse, l.M, l.N, opts);
  run(q, k, v, out, lse, opts, c, [&](int, int64_t m, std::vector<int64_t>& keys) {
    const int64_t i = m / l.R, r = m % l.R;
    for (int64_t t = l.indptr[i]; t < l.indptr[i + 1]; ++t) {
      for (int64_t cc = 0; cc < l.C; ++cc) {
        const int64_t n = static_cast<int64_t>(l.indices[t]) * l.C + cc;
        if (l.block_mask != nullptr && l.block_mask[(t * l.R + r) * l.C + cc] == 0) continue;
        if (causal_ok(opts.causal, m, n, l.M, l.N)) keys.push_back(n);
      }
    }
    std::sort(keys.begin(), keys.end());
  });
}

void variable_block_sparse_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const VariableBlockSparseLayout& l, const TensorView& out,
                                     const TensorView& lse, const BlockSparseOptions& opts) {
  check_variable_block_sparse_layout(l);
  const Checked c = check_call(q, k, v, out, lse, l.M, l.N, opts);
  check(c.num_kv_heads == l.num_kv_heads,
        "VariableBlockSparseLayout.num_kv_heads: ", l.num_kv_heads, ", but k has ", c.num_kv_heads,
        " KV heads");
  // Each head's block starts: rows [row_start[a], row_start[a + 1]), keys likewise.
  std::vector<std::vector<int64_t>> row_start(l.num_kv_heads), col_start(l.num_kv_heads);
  for (int h = 0; h < l.num_kv_heads; ++h) {
    row_start[h].assign(1, 0);
    col_start[h].assign(1, 0);
    for (int64_t a = 0; a < l.MB; ++a)
      row_start[h].push_back(row_start[h].back() + l.block_row_sz[h * l.MB + a]);
    for (int64_t b = 0; b < l.NB; ++b)
      col_start[h].push_back(col_start[h].back() + l.block_col_sz[h * l.NB + b]);
  }
  run(q, k, v, out, lse, opts, c, [&](int h, int64_t m, std::vector<int64_t>& keys) {
    const std::vector<int64_t>& rs = row_start[h];
    // The block row holding m: the last start <= m (empty blocks share their start).
    const int64_t a = std::upper_bound(rs.begin(), rs.end(), m) - rs.begin() - 1;
    for (int64_t b = 0; b < l.NB; ++b) {
      if (l.block_mask_map[(h * l.MB + a) * l.NB + b] == 0) continue;
      for (int64_t n = col_start[h][b]; n < col_start[h][b + 1]; ++n)
        if (causal_ok(opts.causal, m, n, l.M, l.N)) keys.push_back(n);
    }
  });
}

}  // namespace flashkv::reference
