// CPU reference of RoPE (rope.h): every op reduces to one position per token and one (cos, sin)
// per rotary pair, then rotate_row() turns each head's pairs in double and rounds once.
#include <cmath>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "core/kv_ops_checks.h"
#include "core/parallel.h"
#include "flashkv/error.h"
#include "flashkv/reference_kv_ops.h"
#include "reference/attend.h"

namespace flashkv::reference {
namespace {

using flashkv::detail::RopeShape;

int64_t i32_at(const TensorView& t, int64_t i) {
  return t.data_as<const int32_t>()[i * t.stride(0)];
}

void check_host_tensors(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                        const TensorView& k_rope) {
  detail::check_cpu(q, "q");
  detail::check_cpu(k, "k");
  detail::check_cpu(q_rope, "q_rope");
  detail::check_cpu(k_rope, "k_rope");
}

// Position of every token from indptr i32[batch + 1] and offsets i32[batch]: token j of request
// i has offsets[i] + j.
std::vector<int64_t> positions_from_offsets(const TensorView& indptr, const TensorView& offsets,
                                            int64_t nnz) {
  const std::vector<int64_t> ptr = detail::read_indptr(indptr, "indptr", nnz, "nnz (q.size(0))");
  const int64_t batch = static_cast<int64_t>(ptr.size()) - 1;
  detail::check_cpu(offsets, "offsets");
  flashkv::detail::check_i32_vector(offsets, "offsets", batch);
  std::vector<int64_t> pos(nnz);
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t off = i32_at(offsets, i);
    check(off >= 0 || ptr[i] == ptr[i + 1], "offsets[", i, "] = ", off,
          ": expected >= 0 (positions are non-negative)");
    for (int64_t t = ptr[i]; t < ptr[i + 1]; ++t) pos[t] = off + (t - ptr[i]);
  }
  return pos;
}

// pos_ids i32[nnz] named `name`, each in [0, limit) (limit < 0: no upper bound).
std::vector<int64_t> read_positions(const TensorView& pos_ids, const char* name, int64_t nnz,
                                    int64_t limit, const char* limit_name) {
  detail::check_cpu(pos_ids, name);
  flashkv::detail::check_i32_vector(pos_ids, name, nnz);
  std::vector<int64_t> pos(nnz);
  for (int64_t t = 0; t < nnz; ++t) {
    pos[t] = i32_at(pos_ids, t);
    check(pos[t] >= 0, name, "[", t, "] = ", pos[t], ": expected >= 0");
    check(limit < 0 || pos[t] < limit, name, "[", t, "] = ", pos[t],
          " is out of range: expected < ", limit, " (", limit_name, ")");
  }
  return pos;
}

// Rotates row (t, h) of `in` into `out` by the pairs' (cos, sin); dims >= rotary_dim are copied.
void rotate_row(const TensorView& in, const TensorView& out, int64_t t, int64_t h, int head_dim,
                int rotary_dim, bool interleave, const std::vector<double>& cos,
                const std::vector<double>& sin, std::vector<double>& x) {
  const int64_t in_base = t * in.stride(0) + h * in.stride(1);
  const int64_t out_base = t * out.stride(0) + h * out.stride(1);
  x.resize(head_dim);
  for (int d = 0; d < head_dim; ++d) x[d] = load_as_double(in.data(), in.dtype(), in_base + d);
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const int a = interleave ? 2 * i : i;  // index of x1 of pair i
    const int b = interleave ? 2 * i + 1 : i + half;
    const double x1 = x[a], x2 = x[b];
    x[a] = x1 * cos[i] - x2 * sin[i];
    x[b] = x2 * cos[i] + x1 * sin[i];
  }
  for (int d = 0; d < head_dim; ++d) store_from_double(out.data(), out.dtype(), out_base + d, x[d]);
}

// cos_sin(position, cos, sin) fills the rotary_dim / 2 entries of cos and sin.
using CosSinFn = std::function<void(int64_t, std::vector<double>&, std::vector<double>&)>;

void rotate_all(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                const TensorView& k_rope, const RopeShape& s, const std::vector<int64_t>& pos,
                int rotary_dim, bool interleave, const CosSinFn& cos_sin) {
  // Each token reads and writes only its own rows, so tokens run in parallel.
  flashkv::detail::parallel_for(s.nnz, [&](int64_t t) {
    std::vector<double> c(rotary_dim / 2), sn(rotary_dim / 2), x;
    cos_sin(pos[t], c, sn);
    for (int h = 0; h < s.num_qo_heads; ++h)
      rotate_row(q, q_rope, t, h, s.head_dim, rotary_dim, interleave, c, sn, x);
    for (int h = 0; h < s.num_kv_heads; ++h)
      rotate_row(k, k_rope, t, h, s.head_dim, rotary_dim, interleave, c, sn, x);
  });
}

CosSinFn from_frequencies(std::vector<double> freq) {
  return [freq = std::move(freq)](int64_t p, std::vector<double>& c, std::vector<double>& s) {
    for (size_t i = 0; i < freq.size(); ++i) {
      const double angle = static_cast<double>(p) * freq[i];
      c[i] = std::cos(angle);
      s[i] = std::sin(angle);
    }
  };
}

template <class Options>
void rope_with_positions(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                         const TensorView& k_rope, const RopeShape& s,
                         const std::vector<int64_t>& pos, const Options& opts) {
  const int rotary_dim =
      flashkv::detail::resolve_rotary_dim(opts.rotary_dim, s.head_dim, "rotary_dim");
  rotate_all(q, k, q_rope, k_rope, s, pos, rotary_dim, opts.interleave,
             from_frequencies(rope_frequencies(rotary_dim, opts)));
}

template <class Options>
void rope_by_offsets(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                     const TensorView& k_rope, const TensorView& indptr, const TensorView& offsets,
                     const Options& opts) {
  check_host_tensors(q, k, q_rope, k_rope);
  const RopeShape s = flashkv::detail::check_rope_tensors(q, k, q_rope, k_rope);
  rope_with_positions(q, k, q_rope, k_rope, s, positions_from_offsets(indptr, offsets, s.nnz),
                      opts);
}

template <class Options>
void rope_by_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                     const TensorView& k_rope, const TensorView& pos_ids, const Options& opts) {
  check_host_tensors(q, k, q_rope, k_rope);
  const RopeShape s = flashkv::detail::check_rope_tensors(q, k, q_rope, k_rope);
  rope_with_positions(q, k, q_rope, k_rope, s, read_positions(pos_ids, "pos_ids", s.nnz, -1, ""),
                      opts);
}

}  // namespace

void apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                const TensorView& k_rope, const TensorView& indptr, const TensorView& offsets,
                const RopeOptions& opts) {
  rope_by_offsets(q, k, q_rope, k_rope, indptr, offsets, opts);
}

void apply_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                        const TensorView& k_rope, const TensorView& pos_ids,
                        const RopeOptions& opts) {
  rope_by_pos_ids(q, k, q_rope, k_rope, pos_ids, opts);
}

void apply_llama31_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                        const TensorView& k_rope, const TensorView& indptr,
                        const TensorView& offsets, const Llama31RopeOptions& opts) {
  rope_by_offsets(q, k, q_rope, k_rope, indptr, offsets, opts);
}

void apply_llama31_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                                const TensorView& k_rope, const TensorView& pos_ids,
                                const Llama31RopeOptions& opts) {
  rope_by_pos_ids(q, k, q_rope, k_rope, pos_ids, opts);
}

void apply_rope_with_cos_sin_cache(const TensorView& q, const TensorView& k,
                                   const TensorView& q_rope, const TensorView& k_rope,
                                   const TensorView& positions, const TensorView& cos_sin_cache,
                                   bool is_neox) {
  check_host_tensors(q, k, q_rope, k_rope);
  detail::check_cpu(cos_sin_cache, "cos_sin_cache");
  const RopeShape s = flashkv::detail::check_rope_tensors(q, k, q_rope, k_rope);
  const int rotary_dim = flashkv::detail::check_cos_sin_cache(cos_sin_cache, s.head_dim);
  const int64_t max_position = cos_sin_cache.size(0);
  const std::vector<int64_t> pos =
      read_positions(positions, "positions", s.nnz, max_position, "cos_sin_cache.size(0)");
  const int half = rotary_dim / 2;
  auto from_cache = [&](int64_t p, std::vector<double>& c, std::vector<double>& sn) {
    const float* row = cos_sin_cache.data_as<const float>() + p * cos_sin_cache.stride(0);
    for (int i = 0; i < half; ++i) {
      c[i] = row[i];
      sn[i] = row[half + i];
    }
  };
  rotate_all(q, k, q_rope, k_rope, s, pos, rotary_dim, /*interleave=*/!is_neox, from_cache);
}

}  // namespace flashkv::reference
