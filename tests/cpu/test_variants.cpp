// Each built-in variant of the CPU reference (variants.h) against a tiny hand computation, the
// fully-masked-row definition, the custom mask bit layout, and argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cpu/variant_test_util.h"
#include "flashkv/error.h"

namespace flashkv {
namespace {

using test::HostTensor;
using test::kNegInf;
using test::make_tensor;
using test::run_single;
using test::VResult;

constexpr double kTol = 1e-6;  // f32-rounded outputs

// One head, head_dim 1: q = 0 makes every logit 0 before the variant's own terms, so the weights
// are the variant's alone and outputs are weighted means of v.
struct Tiny {
  HostTensor q, k, v;
  Tiny(std::vector<double> qs, std::vector<double> ks, std::vector<double> vs)
      : q(make_tensor(DType::f32, {static_cast<int64_t>(qs.size()), 1, 1}, qs)),
        k(make_tensor(DType::f32, {static_cast<int64_t>(ks.size()), 1, 1}, ks)),
        v(make_tensor(DType::f32, {static_cast<int64_t>(vs.size()), 1, 1}, vs)) {}
};

TEST(VariantHand, SoftCapAppliesAfterTheScale) {
  // s_j = cap * tanh(scale * q k_j / cap): scale 0.5, cap 0.7, logits x = 2 and -1.
  const Tiny t({1}, {2, -1}, {3, -5});
  AttentionVariant var;
  var.sm_scale = 0.5f;
  var.logits_soft_cap = 0.7f;
  const VResult r = run_single(t.q, t.k, t.v, var);
  const double cap = static_cast<double>(0.7f);
  const double s0 = cap * std::tanh(0.5 * 2 / cap), s1 = cap * std::tanh(0.5 * -1 / cap);
  const double e0 = std::exp(s0), e1 = std::exp(s1);
  EXPECT_NEAR(r.o[0], (3 * e0 - 5 * e1) / (e0 + e1), kTol);
  EXPECT_NEAR(r.lse[0], std::log(e0 + e1), kTol);
  // Capping the raw logit and scaling afterwards would give another answer.
  const double w0 = std::exp(0.5 * cap * std::tanh(2 / cap));
  const double w1 = std::exp(0.5 * cap * std::tanh(-1 / cap));
  EXPECT_GT(std::abs(r.o[0] - (3 * w0 - 5 * w1) / (w0 + w1)), 1e-3);
}

TEST(VariantHand, WindowLeftIsRelativeToTheCausalDiagonal) {
  // qo_len 2 over kv_len 5: rows sit at positions 3 and 4. window_left 1 keeps 2 keys.
  const Tiny t({0, 0}, {0, 0, 0, 0, 0}, {1, 2, 4, 8, 16});
  AttentionVariant var;
  var.causal = true;
  var.window_left = 1;
  VResult r = run_single(t.q, t.k, t.v, var);
  EXPECT_NEAR(r.o[0], (4 + 8) / 2.0, kTol);   // keys 2, 3
  EXPECT_NEAR(r.o[1], (8 + 16) / 2.0, kTol);  // keys 3, 4
  EXPECT_NEAR(r.lse[0], std::log(2.0), kTol);
  // window_left 0: only the diagonal key.
  var.window_left = 0;
  r = run_single(t.q, t.k, t.v, var);
  EXPECT_NEAR(r.o[0], 8, kTol);
  EXPECT_NEAR(r.o[1], 16, kTol);
  // Not causal, window [pos - 1, pos + 1]: row 0 sees keys 2..4, row 1 keys 3..4.
  var = {};
  var.window_left = 1;
  var.window_right = 1;
  r = run_single(t.q, t.k, t.v, var);
  EXPECT_NEAR(r.o[0], (4 + 8 + 16) / 3.0, kTol);
  EXPECT_NEAR(r.o[1], (8 + 16) / 2.0, kTol);
  // A window alone does not imply causal: window_left 1 without causal sees the future too.
  var = {};
  var.window_left = 1;
  r = run_single(t.q, t.k, t.v, var);
  EXPECT_NEAR(r.o[0], (4 + 8 + 16) / 3.0, kTol);
}

TEST(VariantHand, AlibiPenalisesKeysBehindTheQuery) {
  // Query at position 2 over keys 0..2; slope ln 2: biases -2 ln2, -ln2, 0 -> weights 1/4, 1/2, 1.
  const HostTensor q = make_tensor(DType::f32, {1, 2, 1}, {0, 0});
  const HostTensor k = make_tensor(DType::f32, {3, 1, 1}, {0, 0, 0});
  const HostTensor v = make_tensor(DType::f32, {3, 1, 1}, {1, 2, 4});
  const HostTensor slopes = make_tensor(DType::f32, {2}, {std::log(2.0), 0.0});
  AttentionVariant var;
  var.alibi_slopes = slopes.view();
  const VResult r = run_single(q, k, v, var);
  const double ln2 = static_cast<double>(static_cast<float>(std::log(2.0)));
  const double w[3] = {std::exp(-2 * ln2), std::exp(-ln2), 1.0};
  EXPECT_NEAR(r.o[0], (w[0] * 1 + w[1] * 2 + w[2] * 4) / (w[0] + w[1] + w[2]), kTol);
  EXPECT_NEAR(r.o[0], 3.0, 1e-6);  // (0.25 + 1 + 4) / 1.75: the nearest key weighs most
  EXPECT_NEAR(r.lse[0], std::log(1.75), kTol);
  EXPECT_NEAR(r.o[1], 7.0 / 3.0, kTol);  // slope 0: plain mean
}

TEST(VariantHand, SinkJoinsOnlyTheDenominator) {
  // Logits 0, 0 and a sink of ln 2: denominator 1 + 1 + 2 = 4, numerator 2 + 6.
  const Tiny t({0}, {0, 0}, {2, 6});
  const HostTensor sinks = make_tensor(DType::f32, {1}, {std::log(2.0)});
  AttentionVariant var;
  var.sinks = sinks.view();
  const VResult r = run_single(t.q, t.k, t.v, var);
  EXPECT_NEAR(r.o[0], 8.0 / 4.0, kTol);
  EXPECT_NEAR(r.lse[0], std::log(4.0), kTol);
}

TEST(VariantHand, SigmoidWeightsAreNotNormalised) {
  const Tiny t({1}, {1, -1}, {3, 5});
  AttentionVariant var;
  var.sm_scale = 1.0f;
  var.sigmoid = true;
  var.sigmoid_bias = -0.5f;
  const VResult r = run_single(t.q, t.k, t.v, var, {}, /*want_lse=*/false);
  auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  EXPECT_NEAR(r.o[0], sig(0.5) * 3 + sig(-1.5) * 5, kTol);
  // Masked keys weigh 0: causal over qo 1 hides nothing; window 0 keeps only the last key.
  var.window_left = 0;
  EXPECT_NEAR(run_single(t.q, t.k, t.v, var, {}, false).o[0], sig(-1.5) * 5, kTol);
}

TEST(VariantHand, FullyMaskedRows) {
  // qo_len 3 > kv_len 2 with causal: row 0 sits at position -1 and sees nothing.
  const Tiny t({0, 0, 0}, {0, 0}, {2, 6});
  AttentionVariant var;
  var.causal = true;
  VResult r = run_single(t.q, t.k, t.v, var);
  EXPECT_EQ(r.o[0], 0.0);
  EXPECT_EQ(r.lse[0], kNegInf);
  EXPECT_NEAR(r.o[1], 2, kTol);
  // With a sink the empty row keeps the sink alone: out 0, lse = sink.
  const HostTensor sinks = make_tensor(DType::f32, {1}, {0.75});
  var.sinks = sinks.view();
  r = run_single(t.q, t.k, t.v, var);
  EXPECT_EQ(r.o[0], 0.0);
  EXPECT_NEAR(r.lse[0], 0.75, kTol);
  EXPECT_NEAR(r.o[1], 2 / (1 + std::exp(0.75)), kTol);
  // Empty KV: the same definitions.
  const HostTensor k0(DType::f32, {0, 1, 1}), v0(DType::f32, {0, 1, 1});
  r = run_single(t.q, k0, v0, var);
  EXPECT_EQ(r.o, std::vector<double>(3, 0.0));
  EXPECT_NEAR(r.lse[2], 0.75, kTol);
  var.sinks = {};
  r = run_single(t.q, k0, v0, var);
  EXPECT_EQ(r.lse, std::vector<double>(3, kNegInf));
  // Sigmoid: out 0.
  AttentionVariant sig;
  sig.sigmoid = true;
  sig.causal = true;
  EXPECT_EQ(run_single(t.q, t.k, t.v, sig, {}, false).o[0], 0.0);
}

TEST(VariantMask, PackedBitLayoutRoundTrips) {
  // Request 0: 2 x 5, request 1: 1 x 3. Bits little-endian within a byte, row-major, each request
  // starting on a byte boundary (FlashInfer's segment_packbits(bitorder="little")).
  const std::vector<bool> mask = {1, 0, 1, 1, 0,  //
                                  0, 1, 1, 0, 1,  //
                                  1, 1, 0};
  std::vector<int32_t> indptr;
  const std::vector<uint8_t> bytes = pack_custom_mask(mask, {2, 1}, {5, 3}, indptr);
  EXPECT_EQ(bytes, (std::vector<uint8_t>{0xCD, 0x02, 0x03}));
  EXPECT_EQ(indptr, (std::vector<int32_t>{0, 2, 3}));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 5; ++j) EXPECT_EQ(custom_mask_bit(bytes.data(), 5, i, j), mask[i * 5 + j]);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(custom_mask_bit(bytes.data() + 2, 3, 0, j), mask[10 + j]);
}

TEST(VariantMask, AttentionKeepsExactlyTheSetBits) {
  // Two requests (ragged), q = 0: each row's output is the mean of its kept values.
  const std::vector<bool> mask = {1, 0, 1, 1, 0,  //
                                  0, 0, 0, 0, 0,  // a row with no kept key
                                  0, 1, 1};
  std::vector<int32_t> indptr;
  const std::vector<uint8_t> bytes = pack_custom_mask(mask, {2, 1}, {5, 3}, indptr);
  const HostTensor q = make_tensor(DType::f32, {3, 1, 1}, {0, 0, 0});
  const HostTensor k = make_tensor(DType::f32, {8, 1, 1}, std::vector<double>(8, 0.0));
  const HostTensor v = make_tensor(DType::f32, {8, 1, 1}, {1, 2, 4, 8, 16, 32, 64, 128});
  const HostTensor qo_indptr = test::make_i32({0, 2, 3}), kv_indptr = test::make_i32({0, 5, 8});
  const HostTensor mask_indptr = test::make_i32({indptr[0], indptr[1], indptr[2]});
  AttentionVariant var;
  var.custom_mask = {.bits = bytes.data(),
                     .num_bytes = static_cast<int64_t>(bytes.size()),
                     .mask_indptr = mask_indptr.view()};
  HostTensor out(DType::f32, {3, 1, 1}), lse(DType::f32, {3, 1});
  reference::batch_prefill_ragged_variant(q.view(), qo_indptr.view(), k.view(), v.view(),
                                          kv_indptr.view(), out.view(), lse.view(), var);
  EXPECT_NEAR(out.get(0), (1 + 4 + 8) / 3.0, kTol);
  EXPECT_EQ(out.get(1), 0.0);
  EXPECT_EQ(lse.get(1), kNegInf);
  EXPECT_NEAR(out.get(2), (64 + 128) / 2.0, kTol);
  EXPECT_NEAR(lse.get(2), std::log(2.0), kTol);
  // Masks AND: row 0 sits at position 3; causal keeps keys <= 3, window_left 1 keys >= 2.
  var.causal = true;
  var.window_left = 1;
  reference::batch_prefill_ragged_variant(q.view(), qo_indptr.view(), k.view(), v.view(),
                                          kv_indptr.view(), out.view(), lse.view(), var);
  EXPECT_NEAR(out.get(0), (4 + 8) / 2.0, kTol);
}

TEST(VariantErrors, NameTheArgument) {
  const Tiny t({0}, {0, 0}, {2, 6});
  auto msg = [&](const AttentionVariant& var) {
    return test::error_of([&] { run_single(t.q, t.k, t.v, var); });
  };
  AttentionVariant var;
  var.sigmoid = true;
  EXPECT_NE(msg(var).find("lse"), std::string::npos);
  const HostTensor two = make_tensor(DType::f32, {2}, {0, 0});
  var = {};
  var.sinks = two.view();
  EXPECT_NE(msg(var).find("variant.sinks"), std::string::npos);
  var = {};
  var.alibi_slopes = two.view();
  EXPECT_NE(msg(var).find("variant.alibi_slopes"), std::string::npos);
  var = {};
  var.window_left = -2;
  EXPECT_NE(msg(var).find("window_left"), std::string::npos);
  var = {};
  var.logits_soft_cap = -1;
  EXPECT_NE(msg(var).find("logits_soft_cap"), std::string::npos);
  const uint8_t byte = 0xff;  // 1 x 2 needs 1 byte: fine; claim 0 bytes instead
  var = {};
  var.custom_mask = {.bits = &byte, .num_bytes = 0};
  EXPECT_NE(msg(var).find("custom_mask"), std::string::npos);
  var = {};
  var.rope.mode = RopeMode::llama;
  const HostTensor q3 = make_tensor(DType::f32, {1, 1, 3}, {0, 0, 0});
  const HostTensor k3 = make_tensor(DType::f32, {1, 1, 3}, {0, 0, 0});
  EXPECT_NE(test::error_of([&] { run_single(q3, k3, k3, var); }).find("even"), std::string::npos);
}

}  // namespace
}  // namespace flashkv
