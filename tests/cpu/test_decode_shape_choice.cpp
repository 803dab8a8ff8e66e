// BatchDecode's auto kernel shape (ops/decode/decode_shape_choice.cpp): which CTAs per SM and warps
// a batch gets, and what keeps the default.
#include <gtest/gtest.h>

#include <vector>

#include "ops/decode/decode_shape_choice.h"

namespace flashkv::ops {
namespace {

constexpr int kSms = 132;

DecodeShapeChoice choose(const std::vector<int64_t>& lens, int kv_heads,
                         void (*edit)(DecodeShapeInputs&) = nullptr) {
  DecodeShapeInputs in;
  in.sms = kSms;
  in.num_kv_heads = kv_heads;
  in.kv_lens = lens;
  if (edit) edit(in);
  return choose_decode_shape(in);
}

void expect_shape(const DecodeShapeChoice& c, int ctas, DecodeTCTuning tuning) {
  EXPECT_EQ(c.ctas_per_sm, ctas);
  EXPECT_EQ(c.tuning, tuning) << c.tuning.stages << " " << c.tuning.warps << " " << c.tuning.ctas;
}

TEST(DecodeShapeChoice, TheBenchmarkWorkloadsGetTheShapesMeasuredFastest) {
  const std::vector<int64_t> d1(16, 1024), d4{32768}, d5(64, 4096), d6(256, 2048);
  std::vector<int64_t> d2;
  for (int i = 0; i < 16; ++i) d2.push_back(512 + 37 * i);
  expect_shape(choose(d1, 8), 1, kDecodeTCOneCta);      // GQA D1: 128 equal pairs <= 132 SMs
  expect_shape(choose(d4, 8), 1, kDecodeTCOneCta);      // GQA D4: one long request
  expect_shape(choose(d2, 8), 2, {});                   // GQA D2: unequal lengths
  expect_shape(choose(d5, 8), 4, kDecodeTCSmallCtas);   // GQA D5: 3971 tokens per small CTA
  expect_shape(choose(d6, 8), 4, kDecodeTCSmallCtas);   // GQA D6
  expect_shape(choose(d1, 32), 4, kDecodeTCSmallCtas);  // MHA D1: 993 per small CTA
  expect_shape(choose(d2, 32), 2, {});                  // MHA D2: ~750 per small CTA
  expect_shape(choose(d4, 32), 4, kDecodeTCSmallCtas);  // MHA D4: 1986
}

TEST(DecodeShapeChoice, TheSmallCtaThresholdIsTokensPerCta) {
  const int64_t per_sm = kDecodeSmallCtaMinTokens * kDecodeTCSmallCtas.ctas;
  // Unequal lengths (so never one CTA per SM) just below and at the threshold.
  std::vector<int64_t> lens = {per_sm * kSms - 1 - 100, 100};
  EXPECT_EQ(choose(lens, 1).ctas_per_sm, 2);
  lens[0] += 1;
  EXPECT_EQ(choose(lens, 1).ctas_per_sm, 4);
}

TEST(DecodeShapeChoice, OneCtaNeedsEqualPairsNoMoreThanSms) {
  EXPECT_EQ(choose(std::vector<int64_t>(kSms, 100), 1).ctas_per_sm, 1);
  EXPECT_EQ(choose(std::vector<int64_t>(kSms + 1, 100), 1).ctas_per_sm, 2);
  EXPECT_EQ(choose(std::vector<int64_t>(17, 100), 8).ctas_per_sm, 2);  // 136 pairs
  EXPECT_EQ(choose({100, 100, 101}, 8).ctas_per_sm, 2);
  EXPECT_EQ(choose({0, 0}, 8).ctas_per_sm, 2);  // nothing to stream
  EXPECT_EQ(choose({}, 8).ctas_per_sm, 2);
}

TEST(DecodeShapeChoice, AShapeTheGpuCannotFitKeepsTheDefault) {
  // The one-CTA shape needs 132 KB at head_dim 128; a GPU allowing ~100 KB per block keeps 2 x 4.
  const std::vector<int64_t> d1(16, 1024);
  expect_shape(choose(d1, 8, [](DecodeShapeInputs& in) { in.max_smem_bytes = 100 * 1024; }), 2, {});
  expect_shape(choose(d1, 8, [](DecodeShapeInputs& in) { in.max_smem_bytes = 132 * 1024; }), 1,
               kDecodeTCOneCta);
}

TEST(DecodeShapeChoice, GraphsFixedSplitsWideHeadsAndExplicitSettingsKeepTheirShape) {
  const std::vector<int64_t> d1(16, 1024), d6(256, 2048);
  for (const auto& lens : {d1, d6}) {
    expect_shape(choose(lens, 8, [](DecodeShapeInputs& in) { in.enable_cuda_graph = true; }), 2,
                 {});
    expect_shape(choose(lens, 8, [](DecodeShapeInputs& in) { in.fixed_split_size = 256; }), 2, {});
    expect_shape(choose(lens, 8, [](DecodeShapeInputs& in) { in.head_dim = 256; }), 2, {});
    // tc_warps set: auto leaves the grid at 2 CTAs per SM and runs the asked-for warps.
    expect_shape(choose(lens, 8, [](DecodeShapeInputs& in) { in.tc_warps = 4; }), 2, {0, 4, 0});
    expect_shape(choose(lens, 8, [](DecodeShapeInputs& in) { in.tc_stages = 3; }),
                 lens.size() == 16 ? 1 : 4,
                 {3, lens.size() == 16 ? 8 : 2, lens.size() == 16 ? 1 : 4});
  }
  // An explicit ctas_per_sm is kept, with ~8 warps per SM; the stated stages pass through.
  DecodeShapeInputs in;
  in.sms = kSms;
  in.num_kv_heads = 8;
  const std::vector<int64_t> lens(16, 1024);
  in.kv_lens = lens;
  for (auto [k, warps] : {std::pair{1, 8}, {2, 0}, {3, 2}, {4, 2}}) {
    in.config_ctas_per_sm = k;
    expect_shape(choose_decode_shape(in), k, {0, warps, k == 2 ? 0 : k});
  }
  in.config_ctas_per_sm = 2;
  in.tc_warps = 8;
  in.tc_stages = 5;
  expect_shape(choose_decode_shape(in), 2, {5, 8, 0});
}

}  // namespace
}  // namespace flashkv::ops
