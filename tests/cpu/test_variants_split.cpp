// The variant reference on random data: combinations (Gemma, gpt-oss) against the naive formula,
// RoPE in attention against rotate-then-attend, every storage (single, ragged, paged, decode)
// agreeing, and split-KV states merging with ⊕ into the whole, sinks counted once.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "cpu/variant_test_util.h"
#include "flashkv/reference.h"

namespace flashkv {
namespace {

using test::HostTensor;
using test::make_tensor;
using test::naive_variant;
using test::NaiveSpec;
using test::rel_err;
using test::run_single;
using test::VResult;

constexpr double kTol = 2e-6;  // f32-rounded outputs

HostTensor random(std::vector<int64_t> shape, uint64_t seed, double lo = -1, double hi = 1) {
  HostTensor t(DType::f32, std::move(shape));
  t.fill_random(seed, lo, hi);
  return t;
}

struct Data {
  int64_t qo = 4, kv = 11;
  int hq = 2, hkv = 1, d = 8;
  HostTensor q, k, v;
  explicit Data(uint64_t seed, int64_t qo_ = 4, int64_t kv_ = 11)
      : qo(qo_),
        kv(kv_),
        q(random({qo_, 2, 8}, seed, -2, 2)),
        k(random({kv_, 1, 8}, seed + 1, -2, 2)),
        v(random({kv_, 1, 8}, seed + 2)) {}
  VResult naive(const NaiveSpec& s) const {
    return naive_variant(q.to_doubles(), qo, hq, k.to_doubles(), v.to_doubles(), kv, hkv, d, s);
  }
};

void expect_close(const VResult& got, const VResult& want, bool lse = true) {
  EXPECT_LT(rel_err(got.o, want.o), kTol);
  if (lse) EXPECT_LT(rel_err(got.lse, want.lse), kTol);
}

TEST(VariantCombos, GemmaAndGptOssAgainstTheNaiveFormula) {
  const Data x(11);
  const HostTensor sinks = make_tensor(DType::f32, {2}, {0.5, -1.25});
  const HostTensor slopes = make_tensor(DType::f32, {2}, {0.25, 0.0625});
  const std::vector<double> sinks_d = sinks.to_doubles(), slopes_d = slopes.to_doubles();
  // gpt-oss: causal sliding window with sinks.
  AttentionVariant oss;
  oss.causal = true;
  oss.window_left = 3;
  oss.sinks = sinks.view();
  const double scale = 1 / std::sqrt(8.0);
  expect_close(run_single(x.q, x.k, x.v, oss),
               x.naive({.scale = scale, .causal = true, .window_left = 3, .sinks = sinks_d}));
  // Gemma 2: causal sliding window with a soft-cap small enough to bite (scale 3).
  AttentionVariant gemma;
  gemma.sm_scale = 3.0f;
  gemma.causal = true;
  gemma.window_left = 4;
  gemma.logits_soft_cap = 1.5f;
  expect_close(run_single(x.q, x.k, x.v, gemma),
               x.naive({.scale = 3.0, .causal = true, .window_left = 4, .cap = 1.5}));
  // Everything at once: both windows, ALiBi, soft-cap, sinks.
  AttentionVariant all = gemma;
  all.causal = false;
  all.window_right = 2;
  all.alibi_slopes = slopes.view();
  all.sinks = sinks.view();
  expect_close(run_single(x.q, x.k, x.v, all), x.naive({.scale = 3.0,
                                                        .window_left = 4,
                                                        .window_right = 2,
                                                        .cap = 1.5,
                                                        .alibi = slopes_d,
                                                        .sinks = sinks_d}));
  // Sigmoid with a window and ALiBi.
  AttentionVariant sig;
  sig.causal = true;
  sig.window_left = 5;
  sig.alibi_slopes = slopes.view();
  sig.sigmoid = true;
  sig.sigmoid_bias = -2.0f;
  expect_close(run_single(x.q, x.k, x.v, sig, {}, false),
               x.naive({.scale = scale,
                        .causal = true,
                        .window_left = 5,
                        .alibi = slopes_d,
                        .sigmoid = true,
                        .bias = -2.0}),
               /*lse=*/false);
}

// RoPE written out directly in the test: rotate-half pairs (c, c + D/2) by pos * freq[c].
void rotate(HostTensor& t, int64_t row, int heads, int d, const std::vector<double>& freq,
            int64_t pos) {
  for (int h = 0; h < heads; ++h) {
    const int64_t base = (row * heads + h) * d;
    for (int c = 0; c < d / 2; ++c) {
      const double a = t.get(base + c), b = t.get(base + c + d / 2);
      const double ang = static_cast<double>(pos) * freq[c];
      t.set(base + c, a * std::cos(ang) - b * std::sin(ang));
      t.set(base + c + d / 2, b * std::cos(ang) + a * std::sin(ang));
    }
  }
}

TEST(VariantRope, Llama31FrequenciesFollowMetasWavelengthRule) {
  const RopeParams p{.mode = RopeMode::llama31,
                     .rope_scale = 8,
                     .rope_theta = 5e5f,
                     .low_freq_factor = 1,
                     .high_freq_factor = 4,
                     .old_context_len = 8192};
  const int d = 128;
  const std::vector<double> f = rope_frequencies(p, d);
  int scaled = 0, kept = 0, blended = 0;
  for (int c = 0; c < d / 2; ++c) {
    const double base = std::pow(5e5, -2.0 * c / d);
    const double wavelen = 2 * std::numbers::pi / base;
    double want;
    if (wavelen < 8192.0 / 4) {
      want = base, ++kept;
    } else if (wavelen > 8192.0 / 1) {
      want = base / 8, ++scaled;
    } else {
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      want = (1 - smooth) * base / 8 + smooth * base, ++blended;
    }
    EXPECT_NEAR(f[c], want, 1e-12 * base) << c;
  }
  EXPECT_GT(scaled, 0);
  EXPECT_GT(kept, 0);
  EXPECT_GT(blended, 0);
  // Plain llama: theta^(-2c/D) / rope_scale.
  const std::vector<double> g = rope_frequencies({.mode = RopeMode::llama, .rope_scale = 2}, 8);
  EXPECT_NEAR(g[3], std::pow(1e4, -6.0 / 8) / 2, 1e-15);
}

TEST(VariantRope, InAttentionEqualsRotateThenAttend) {
  const Data x(21, 3, 7);
  const HostTensor q_off = test::make_i32({10, 11, 15}), k_off = test::make_i32({4});
  for (RopeMode mode : {RopeMode::llama, RopeMode::llama31}) {
    for (bool offsets : {false, true}) {
      SCOPED_TRACE(std::string(rope_mode_name(mode)) + (offsets ? " offsets" : ""));
      AttentionVariant var;
      var.causal = true;
      var.rope = {.mode = mode, .rope_scale = 2, .rope_theta = 100, .old_context_len = 16};
      if (offsets) {
        var.rope.q_rope_offset = q_off.view();
        var.rope.k_rope_offset = k_off.view();
      }
      const std::vector<double> freq = rope_frequencies(var.rope, x.d);
      HostTensor q = x.q, k = x.k;  // rotated copies (rounded to f32 once)
      for (int64_t i = 0; i < x.qo; ++i) {
        rotate(q, i, x.hq, x.d, freq,
               offsets ? static_cast<int64_t>(q_off.get(i)) : x.kv - x.qo + i);
      }
      for (int64_t j = 0; j < x.kv; ++j) rotate(k, j, x.hkv, x.d, freq, (offsets ? 4 : 0) + j);
      HostTensor out(DType::f32, q.shape()), lse(DType::f32, {x.qo, x.hq});
      reference::single_prefill(q.view(), k.view(), x.v.view(), out.view(), lse.view(),
                                KVLayout::NHD, {.causal = true});
      expect_close(run_single(x.q, x.k, x.v, var), {out.to_doubles(), lse.to_doubles()});
    }
  }
}

TEST(VariantStorage, SingleRaggedPagedAndDecodeAgree) {
  const std::vector<int64_t> kv_lens = {5, 0, 13, 1}, qo_lens = {3, 2, 13, 1};
  const int hq = 4, hkv = 2, d = 8;
  const test::PagedCacheHost c =
      test::make_paged_cache(kv_lens, 4, hkv, d, KVLayout::HND, DType::f16, 31);
  const HostTensor q = random({19, hq, d}, 32, -2, 2);
  const HostTensor qo_indptr = test::make_i32({0, 3, 5, 18, 19});
  const HostTensor sinks = make_tensor(DType::f32, {hq}, {0.5, -1, 2, 0});
  const HostTensor slopes = make_tensor(DType::f32, {hq}, {0.5, 0.25, 0.125, 0.0625});
  std::vector<bool> bits;
  for (size_t b = 0; b < kv_lens.size(); ++b)
    for (int64_t n = 0; n < qo_lens[b] * kv_lens[b]; ++n)
      bits.push_back((n * 7 + static_cast<int64_t>(b)) % 5 != 0);
  std::vector<int32_t> mask_ptr;
  const std::vector<uint8_t> mask = pack_custom_mask(bits, qo_lens, kv_lens, mask_ptr);
  const HostTensor mask_indptr =
      test::make_i32(std::vector<int64_t>(mask_ptr.begin(), mask_ptr.end()));
  AttentionVariant var;
  var.causal = true;
  var.window_left = 6;
  var.logits_soft_cap = 1.0f;
  var.sm_scale = 2.0f;
  var.alibi_slopes = slopes.view();
  var.sinks = sinks.view();
  var.custom_mask = {.bits = mask.data(),
                     .num_bytes = static_cast<int64_t>(mask.size()),
                     .mask_indptr = mask_indptr.view()};
  var.rope = {.mode = RopeMode::llama};

  HostTensor out_p(DType::f32, {19, hq, d}), lse_p(DType::f32, {19, hq});
  HostTensor out_r(DType::f32, {19, hq, d}), lse_r(DType::f32, {19, hq});
  out_p.fill_poison();
  out_r.fill_poison();
  reference::batch_prefill_paged_variant(q.view(), qo_indptr.view(), c.cache, out_p.view(),
                                         lse_p.view(), var);
  reference::batch_prefill_ragged_variant(q.view(), qo_indptr.view(), c.k_ragged.view(),
                                          c.v_ragged.view(), c.kv_indptr.view(), out_r.view(),
                                          lse_r.view(), var);
  EXPECT_EQ(out_p.to_doubles(), out_r.to_doubles());
  EXPECT_EQ(lse_p.to_doubles(), lse_r.to_doubles());
  EXPECT_FALSE(test::any_nan(out_p.to_doubles()));

  // Without RoPE, request 2 (13 x 13) against the naive formula.
  var.rope = {};
  reference::batch_prefill_paged_variant(q.view(), qo_indptr.view(), c.cache, out_p.view(),
                                         lse_p.view(), var);
  const std::vector<double> kr = c.k_ragged.to_doubles(), vr = c.v_ragged.to_doubles();
  const std::vector<double> qd = q.to_doubles();
  const VResult want = naive_variant(
      std::vector<double>(qd.begin() + 5 * hq * d, qd.begin() + 18 * hq * d), 13, hq,
      std::vector<double>(kr.begin() + 5 * hkv * d, kr.begin() + 18 * hkv * d),
      std::vector<double>(vr.begin() + 5 * hkv * d, vr.begin() + 18 * hkv * d), 13, hkv, d,
      {.scale = 2.0,
       .causal = true,
       .window_left = 6,
       .cap = 1.0,
       .alibi = slopes.to_doubles(),
       .sinks = sinks.to_doubles(),
       .mask = std::vector<bool>(bits.begin() + 15, bits.begin() + 15 + 169)});
  const std::vector<double> o = out_p.to_doubles(), l = lse_p.to_doubles();
  EXPECT_LT(rel_err(std::vector<double>(o.begin() + 5 * hq * d, o.begin() + 18 * hq * d), want.o),
            kTol);
  EXPECT_LT(rel_err(std::vector<double>(l.begin() + 5 * hq, l.begin() + 18 * hq), want.lse), kTol);

  // Decode is paged prefill with one query per request.
  var.custom_mask = {};
  var.rope = {.mode = RopeMode::llama31, .rope_scale = 4, .old_context_len = 32};
  const HostTensor qd4 = random({4, hq, d}, 33);
  HostTensor out_d(DType::f32, {4, hq, d}), lse_d(DType::f32, {4, hq});
  reference::batch_decode_variant(qd4.view(), c.cache, out_d.view(), lse_d.view(), var);
  const HostTensor ones = test::make_i32({0, 1, 2, 3, 4});
  HostTensor out_1(DType::f32, {4, hq, d}), lse_1(DType::f32, {4, hq});
  reference::batch_prefill_paged_variant(qd4.view(), ones.view(), c.cache, out_1.view(),
                                         lse_1.view(), var);
  EXPECT_EQ(out_d.to_doubles(), out_1.to_doubles());
  EXPECT_EQ(lse_d.to_doubles(), lse_1.to_doubles());
  EXPECT_NEAR(lse_d.get(1 * hq + 2), 2.0, 1e-6);  // request 1 is empty: lse = its head's sink

  // The plain options as a variant reproduce the plain reference.
  const AttentionVariant plain = AttentionVariant::from({.sm_scale = 0.5f, .causal = true});
  reference::batch_prefill_paged_variant(q.view(), qo_indptr.view(), c.cache, out_p.view(),
                                         lse_p.view(), plain);
  reference::batch_prefill_paged(q.view(), qo_indptr.view(), c.cache, out_r.view(), lse_r.view(),
                                 {.sm_scale = 0.5f, .causal = true});
  EXPECT_LT(rel_err(out_p.to_doubles(), out_r.to_doubles()), 1e-12);
  EXPECT_EQ(lse_p.to_doubles(), lse_r.to_doubles());
}

struct State {
  HostTensor o, lse;
};

State chunk_state(const Data& x, const AttentionVariant& var, reference::KVChunk chunk) {
  State s{HostTensor(DType::f32, {x.qo, x.hq, x.d}), HostTensor(DType::f32, {x.qo, x.hq})};
  reference::single_prefill_variant(x.q.view(), x.k.view(), x.v.view(), s.o.view(), s.lse.view(),
                                    KVLayout::NHD, var, chunk);
  return s;
}

State merge(const State& a, const State& b) {
  State s{HostTensor(DType::f32, a.o.shape()), HostTensor(DType::f32, a.lse.shape())};
  reference::merge_state(a.o.view(), a.lse.view(), b.o.view(), b.lse.view(), s.o.view(),
                         s.lse.view());
  return s;
}

TEST(VariantSplit, SinksStayExactThroughTheMerge) {
  const Data x(41, 5, 12);
  const HostTensor sinks = make_tensor(DType::f32, {2}, {1.5, -0.5});
  const HostTensor slopes = make_tensor(DType::f32, {2}, {0.3, 0.1});
  AttentionVariant var;
  var.causal = true;
  var.window_left = 4;  // row 0 (position 7) sees keys 3..7: chunk [8, 12) is empty for it
  var.alibi_slopes = slopes.view();
  var.logits_soft_cap = 2.0f;
  var.sinks = sinks.view();
  const State whole = chunk_state(x, var, {});
  for (int64_t cut : {0, 5, 8, 12}) {
    SCOPED_TRACE(cut);
    // The chunk holding key 0 carries the sink; the other does not.
    const State a = chunk_state(x, var, {.begin = 0, .end = cut, .with_sinks = true});
    const State b = chunk_state(x, var, {.begin = cut, .end = -1, .with_sinks = false});
    const State m = merge(a, b);
    EXPECT_LT(rel_err(m.o.to_doubles(), whole.o.to_doubles()), kTol);
    EXPECT_LT(rel_err(m.lse.to_doubles(), whole.lse.to_doubles()), kTol);
    // Or: no chunk carries it and the sink joins the merge as the state (0, sink).
    const State a0 = chunk_state(x, var, {.begin = 0, .end = cut, .with_sinks = false});
    State sink{HostTensor(DType::f32, {x.qo, x.hq, x.d}), HostTensor(DType::f32, {x.qo, x.hq})};
    sink.o.fill(0);
    for (int64_t i = 0; i < x.qo; ++i)
      for (int h = 0; h < x.hq; ++h) sink.lse.set(i * x.hq + h, sinks.get(h));
    const State m3 = merge(merge(a0, b), sink);
    EXPECT_LT(rel_err(m3.o.to_doubles(), whole.o.to_doubles()), kTol);
    EXPECT_LT(rel_err(m3.lse.to_doubles(), whole.lse.to_doubles()), kTol);
    // Counting the sink in both chunks is wrong.
    const State twice = merge(a, chunk_state(x, var, {.begin = cut, .end = -1}));
    EXPECT_GT(rel_err(twice.o.to_doubles(), whole.o.to_doubles()), 1e-3);
  }
  // Sigmoid partial outputs add up to the whole.
  AttentionVariant sig;
  sig.causal = true;
  sig.sigmoid = true;
  const VResult w = run_single(x.q, x.k, x.v, sig, {}, false);
  const VResult a = run_single(x.q, x.k, x.v, sig, {.begin = 0, .end = 6}, false);
  const VResult b = run_single(x.q, x.k, x.v, sig, {.begin = 6, .end = -1}, false);
  std::vector<double> sum(w.o.size());
  for (size_t n = 0; n < sum.size(); ++n) sum[n] = a.o[n] + b.o[n];
  EXPECT_LT(rel_err(sum, w.o), kTol);
}

}  // namespace
}  // namespace flashkv
