// Helpers of the variant reference tests (test_variants*.cpp): running the reference's variant ops
// on small host tensors, and a naive formula of variants.h written without any reference code
// (no max trick, masks written out as the doc states them), the independent oracle.
#pragma once

#include <cmath>
#include <limits>
#include <vector>

#include "common/test_util.h"
#include "flashkv/reference_variants.h"

namespace flashkv::test {

inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct VResult {
  std::vector<double> o, lse;
};

// single_prefill_variant over NHD q[qo, hq, d], k/v[kv, hkv, d]; f32 outputs poisoned first.
inline VResult run_single(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                          const AttentionVariant& var, const reference::KVChunk& chunk = {},
                          bool want_lse = true) {
  HostTensor out(DType::f32, q.shape()), lse(DType::f32, {q.shape()[0], q.shape()[1]});
  out.fill_poison();
  lse.fill_poison();
  reference::single_prefill_variant(q.view(), k.view(), v.view(), out.view(),
                                    want_lse ? lse.view() : TensorView(), KVLayout::NHD, var,
                                    chunk);
  return {out.to_doubles(), want_lse ? lse.to_doubles() : std::vector<double>{}};
}

// The variant math of variants.h in plain terms, for one request (no RoPE).
struct NaiveSpec {
  double scale = 1.0;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  double cap = 0;
  std::vector<double> alibi{}, sinks{};  // [hq] or empty
  bool sigmoid = false;
  double bias = 0;
  std::vector<bool> mask{};  // [qo, kv] or empty
};

inline VResult naive_variant(const std::vector<double>& q, int64_t qo, int hq,
                             const std::vector<double>& k, const std::vector<double>& v, int64_t kv,
                             int hkv, int d, const NaiveSpec& s) {
  VResult r{std::vector<double>(qo * hq * d, 0.0), std::vector<double>(qo * hq, kNegInf)};
  for (int64_t i = 0; i < qo; ++i) {
    const int64_t qpos = kv - qo + i;
    for (int h = 0; h < hq; ++h) {
      const int g = h / (hq / hkv);
      double denom = s.sinks.empty() ? 0.0 : std::exp(s.sinks[h]);
      std::vector<double> acc(d, 0.0);
      for (int64_t j = 0; j < kv; ++j) {
        const bool keep = !(s.causal && j > qpos) &&
                          !(s.window_left >= 0 && j < qpos - s.window_left) &&
                          !(s.window_right >= 0 && j > qpos + s.window_right) &&
                          (s.mask.empty() || s.mask[i * kv + j]);
        if (!keep) continue;
        double x = 0;
        for (int c = 0; c < d; ++c) x += q[(i * hq + h) * d + c] * k[(j * hkv + g) * d + c];
        double logit = s.scale * x;
        if (!s.alibi.empty()) logit += s.alibi[h] * static_cast<double>(j - qpos);
        if (s.cap > 0) logit = s.cap * std::tanh(logit / s.cap);
        const double w = s.sigmoid ? 1.0 / (1.0 + std::exp(-(logit + s.bias))) : std::exp(logit);
        denom += w;
        for (int c = 0; c < d; ++c) acc[c] += w * v[(j * hkv + g) * d + c];
      }
      for (int c = 0; c < d; ++c) {
        r.o[(i * hq + h) * d + c] = s.sigmoid ? acc[c] : (denom > 0 ? acc[c] / denom : 0.0);
      }
      if (!s.sigmoid && denom > 0) r.lse[i * hq + h] = std::log(denom);
    }
  }
  return r;
}

}  // namespace flashkv::test
