// CPU reference of the attention-state merge ⊕ (docs/design.md "Kernel families"), in double with
// the max trick: for states (o_s, lse_s), m = max_s lse_s, w_s = exp(lse_s - m),
// o = Σ w_s o_s / Σ w_s, lse = m + log Σ w_s. All-empty input (every lse -inf) gives (0, -inf).
#include <algorithm>
#include <cmath>
#include <vector>

#include "flashkv/error.h"
#include "flashkv/reference.h"
#include "reference/attend.h"

namespace flashkv::reference {
namespace {

using detail::kNegInf;

// ⊕ of `num_states` states given by lse_at(s) and v_at(s, d); writes o[dim] and returns the lse.
// Merging all states at once (rather than folding pairs) rounds once, which is what an oracle
// wants.
template <class LseAt, class VAt>
double merge_row(int64_t num_states, int dim, LseAt lse_at, VAt v_at, std::vector<double>& o) {
  o.assign(dim, 0.0);
  double m = kNegInf;
  for (int64_t s = 0; s < num_states; ++s) m = std::max(m, lse_at(s));
  if (m == kNegInf) return kNegInf;
  double denom = 0.0;
  for (int64_t s = 0; s < num_states; ++s) {
    const double lse = lse_at(s);
    // An empty state is the identity of ⊕: skip it rather than multiply its o (which the kernel
    // that produced it may have left unwritten) by zero.
    if (lse == kNegInf) continue;
    const double w = std::exp(lse - m);
    denom += w;
    for (int d = 0; d < dim; ++d) o[d] += w * v_at(s, d);
  }
  for (int d = 0; d < dim; ++d) o[d] /= denom;
  return m + std::log(denom);
}

void check_states(const TensorView& v, const char* v_name, const TensorView& s, const char* s_name,
                  int64_t n, int64_t h, int64_t d) {
  detail::check_cpu(v, v_name);
  detail::check_floating(v, v_name);
  check_shape(v, v_name, {n, h, d});
  detail::check_cpu(s, s_name);
  check_dtype(s, s_name, DType::f32);
  check_shape(s, s_name, {n, h});
}

double at2(const TensorView& t, int64_t i, int64_t j) {
  return load_as_double(t.data(), t.dtype(), i * t.stride(0) + j * t.stride(1));
}

double at3(const TensorView& t, int64_t i, int64_t j, int64_t k) {
  return load_as_double(t.data(), t.dtype(), i * t.stride(0) + j * t.stride(1) + k * t.stride(2));
}

void store_row(const TensorView& v_out, const TensorView& s_out, int64_t i, int64_t h,
               const std::vector<double>& o, double lse) {
  for (size_t d = 0; d < o.size(); ++d) {
    store_from_double(v_out.data(), v_out.dtype(),
                      i * v_out.stride(0) + h * v_out.stride(1) + d * v_out.stride(2), o[d]);
  }
  if (s_out.defined()) {
    store_from_double(s_out.data(), s_out.dtype(), i * s_out.stride(0) + h * s_out.stride(1), lse);
  }
}

}  // namespace

void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out) {
  detail::check_cpu(v_a, "v_a");
  check_ndim(v_a, "v_a", 3);
  const int64_t n = v_a.size(0), heads = v_a.size(1), dim = v_a.size(2);
  check_states(v_a, "v_a", s_a, "s_a", n, heads, dim);
  check_states(v_b, "v_b", s_b, "s_b", n, heads, dim);
  detail::check_cpu(v_out, "v_out");
  detail::check_floating(v_out, "v_out");
  check_shape(v_out, "v_out", {n, heads, dim});
  if (s_out.defined()) check_states(v_out, "v_out", s_out, "s_out", n, heads, dim);

  std::vector<double> o;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      const double lse[2] = {at2(s_a, i, h), at2(s_b, i, h)};
      const TensorView* v[2] = {&v_a, &v_b};
      const double out_lse = merge_row(
          2, static_cast<int>(dim), [&](int64_t s) { return lse[s]; },
          [&](int64_t s, int d) { return at3(*v[s], i, h, d); }, o);
      store_row(v_out, s_out, i, h, o, out_lse);
    }
  }
}

void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView& s_out) {
  detail::check_cpu(v, "v");
  detail::check_floating(v, "v");
  check_ndim(v, "v", 4);
  const int64_t n = v.size(0), num_states = v.size(1), heads = v.size(2), dim = v.size(3);
  detail::check_cpu(s, "s");
  check_dtype(s, "s", DType::f32);
  check_shape(s, "s", {n, num_states, heads});
  detail::check_cpu(v_out, "v_out");
  detail::check_floating(v_out, "v_out");
  check_shape(v_out, "v_out", {n, heads, dim});
  if (s_out.defined()) check_states(v_out, "v_out", s_out, "s_out", n, heads, dim);

  std::vector<double> o;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      auto lse_at = [&](int64_t k) {
        return load_as_double(s.data(), s.dtype(),
                              i * s.stride(0) + k * s.stride(1) + h * s.stride(2));
      };
      auto v_at = [&](int64_t k, int d) {
        return load_as_double(
            v.data(), v.dtype(),
            i * v.stride(0) + k * v.stride(1) + h * v.stride(2) + d * v.stride(3));
      };
      const double out_lse = merge_row(num_states, static_cast<int>(dim), lse_at, v_at, o);
      store_row(v_out, s_out, i, h, o, out_lse);
    }
  }
}

}  // namespace flashkv::reference
