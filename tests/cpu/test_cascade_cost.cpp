// Tests of the cascade cost model (scheduler/cascade_cost.h): the clear-cut cases under any
// plausible parameters, the calibrated defaults on every measured H200 configuration, and the
// check `flashkv bench cascade` fails a configuration with (check_cascade_choice).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/test_util.h"
#include "cpu/prefix_sharing_test_util.h"
#include "scheduler/cascade_cost.h"
#include "scheduler/prefix_sharing.h"

namespace flashkv {
namespace {

using scheduler::CascadeCostModel;
using scheduler::CascadeEstimate;
using scheduler::CascadeProblemShape;
using scheduler::check_cascade_choice;
using scheduler::detect_shared_prefixes;
using scheduler::estimate_cascade;
using test::PageTableHost;

constexpr CascadeProblemShape kGqa{.num_qo_heads = 32, .num_kv_heads = 8, .head_dim = 128};

// n requests sharing `prompt` tokens (page 16), request r with its own suffix of
// suffix_min + (suffix_max - suffix_min) * r / (n - 1) tokens: the batch of `flashkv bench
// cascade` (apps/flashkv/bench_cascade.h, CascadeBenchCase::suffix_tokens).
PageTableHost shared_prompt(int n, int prompt, int suffix_min, int suffix_max) {
  PageTableHost t;
  t.page_size = 16;
  std::vector<int32_t> prefix((prompt + 15) / 16);
  for (size_t p = 0; p < prefix.size(); ++p) prefix[p] = static_cast<int32_t>(p);
  int32_t next = static_cast<int32_t>(prefix.size());
  for (int r = 0; r < n; ++r) {
    const int suffix = suffix_min + (suffix_max - suffix_min) * r / (n > 1 ? n - 1 : 1);
    std::vector<int32_t> pages = prefix;
    const int own = (suffix + 15) / 16;
    for (int p = 0; p < own; ++p) pages.push_back(next++);
    t.add(pages, own == 0 ? 16 : suffix - (own - 1) * 16);
  }
  return t;
}

// The decision under every model in a wide range of the measured parameters.
std::vector<CascadeCostModel> plausible_models() {
  std::vector<CascadeCostModel> models;
  for (double dram : {3.0e6, 4.5e6}) {
    for (double l2 : {6.0e6, 15.0e6}) {
      for (double fixed : {10.0, 40.0}) {
        for (double flops : {2.0e8, 1.5e9}) {
          CascadeCostModel m;
          m.dram_bytes_per_us = dram;
          m.l2_bytes_per_us = l2;
          m.cascade_fixed_us = fixed;
          m.prefix_flops_per_us = m.prefix_flops_per_us_wgmma = flops;
          models.push_back(m);
        }
      }
    }
  }
  return models;
}

TEST(CascadeCost, OneRequestNeverCascades) {
  const PageTableHost t = shared_prompt(1, 8192, 100, 100);
  const auto layout = detect_shared_prefixes(t.span());
  for (const CascadeCostModel& m : plausible_models()) {
    const CascadeEstimate e = estimate_cascade(layout, kGqa, m);
    EXPECT_FALSE(e.use_cascade);
    EXPECT_EQ(e.bytes_saved, 0);
  }
}

TEST(CascadeCost, NothingSharedNeverCascades) {
  PageTableHost t;
  t.page_size = 16;
  for (int i = 0; i < 64; ++i) t.add({2 * i, 2 * i + 1}, 7);
  const CascadeEstimate e = estimate_cascade(detect_shared_prefixes(t.span()), kGqa);
  EXPECT_FALSE(e.use_cascade);
  EXPECT_EQ(e.plain_kv_bytes, 64 * 23 * kGqa.kv_token_bytes());
}

TEST(CascadeCost, SixtyFourRequestsSharing8kAlwaysCascade) {
  const PageTableHost t = shared_prompt(64, 8192, 128, 128);
  const auto layout = detect_shared_prefixes(t.span());
  ASSERT_EQ(layout.num_levels(), 2);
  for (const CascadeCostModel& m : plausible_models()) {
    const CascadeEstimate e = estimate_cascade(layout, kGqa, m);
    EXPECT_TRUE(e.use_cascade) << e.plain_us << " vs " << e.cascade_us;
    EXPECT_EQ(e.bytes_saved, int64_t{63} * 8192 * kGqa.kv_token_bytes());
  }
  // MHA and fp8 too.
  EXPECT_TRUE(
      estimate_cascade(
          layout, {.num_qo_heads = 32, .num_kv_heads = 32, .head_dim = 128, .kv_dtype_bytes = 1})
          .use_cascade);
}

TEST(CascadeCost, TinySharedPrefixDoesNotPayForALevel) {
  // Two requests sharing one 16-token page: 64 KiB saved, far below one extra pass.
  const PageTableHost t = shared_prompt(2, 16, 1000, 1000);
  const auto layout = detect_shared_prefixes(t.span());
  ASSERT_EQ(layout.num_levels(), 2);
  for (const CascadeCostModel& m : plausible_models()) {
    EXPECT_FALSE(estimate_cascade(layout, kGqa, m).use_cascade);
  }
}

// Issue 22 item 5: the previous model chose the cascade for 4 x 8k (47.1 vs 28.2 us on the H200)
// and 16 x 8k (94.4 vs 75.6 us).
TEST(CascadeCost, DefaultsKeepPlainWhereTheIssueMeasuredItFaster) {
  for (int n : {4, 16}) {
    const CascadeEstimate e =
        estimate_cascade(detect_shared_prefixes(shared_prompt(n, 8192, 128, 1024).span()), kGqa);
    EXPECT_FALSE(e.use_cascade) << n << ": plain " << e.plain_us << " cascade " << e.cascade_us;
  }
}

// Misaligned members (lengths that differ) make plain re-fetch part of the prefix from DRAM.
TEST(CascadeCost, MisalignedMembersCostPlainMore) {
  const auto aligned = detect_shared_prefixes(shared_prompt(2, 32768, 576, 576).span());
  const auto spread = detect_shared_prefixes(shared_prompt(2, 32768, 128, 1024).span());
  const CascadeEstimate a = estimate_cascade(aligned, kGqa), s = estimate_cascade(spread, kGqa);
  EXPECT_EQ(a.misaligned_bytes, 0);
  EXPECT_GT(s.misaligned_bytes, 0);
  EXPECT_GT(s.plain_us, a.plain_us + 5.0);
}

// One configuration of `flashkv bench cascade` as measured on the H200 (median us).
struct Measured {
  int num_qo_heads, num_kv_heads, head_dim, suffix_min, suffix_max, n, prompt;
  double plain_us, cascade_us;
};

// bench/results/cascade-2026-12-02-2b1fc0a.json (f16, page 16): the data the defaults were fitted on.
const Measured kFitGrid[] = {
    {32, 8, 128, 128, 1024, 1, 1024, 9.57, 9.76},
    {32, 8, 128, 128, 1024, 2, 1024, 12.16, 26.08},
    {32, 8, 128, 128, 1024, 4, 1024, 14.02, 29.86},
    {32, 8, 128, 128, 1024, 8, 1024, 17.60, 36.19},
    {32, 8, 128, 128, 1024, 16, 1024, 24.35, 52.80},
    {32, 8, 128, 128, 1024, 32, 1024, 40.99, 70.18},
    {32, 8, 128, 128, 1024, 64, 1024, 64.58, 85.28},
    {32, 8, 128, 128, 1024, 1, 2048, 13.02, 12.61},
    {32, 8, 128, 128, 1024, 2, 2048, 14.56, 28.22},
    {32, 8, 128, 128, 1024, 4, 2048, 16.38, 31.94},
    {32, 8, 128, 128, 1024, 8, 2048, 20.83, 42.88},
    {32, 8, 128, 128, 1024, 16, 2048, 32.00, 63.30},
    {32, 8, 128, 128, 1024, 32, 2048, 52.13, 87.65},
    {32, 8, 128, 128, 1024, 64, 2048, 95.26, 86.11},
    {32, 8, 128, 128, 1024, 1, 4096, 14.37, 15.23},
    {32, 8, 128, 128, 1024, 2, 4096, 17.12, 34.30},
    {32, 8, 128, 128, 1024, 4, 4096, 19.90, 39.71},
    {32, 8, 128, 128, 1024, 8, 4096, 28.80, 56.29},
    {32, 8, 128, 128, 1024, 16, 4096, 46.08, 87.20},
    {32, 8, 128, 128, 1024, 32, 4096, 81.02, 88.96},
    {32, 8, 128, 128, 1024, 64, 4096, 152.64, 90.50},
    {32, 8, 128, 128, 1024, 1, 8192, 18.78, 18.46},
    {32, 8, 128, 128, 1024, 2, 8192, 21.89, 42.82},
    {32, 8, 128, 128, 1024, 4, 8192, 28.29, 48.06},
    {32, 8, 128, 128, 1024, 8, 8192, 44.45, 66.24},
    {32, 8, 128, 128, 1024, 16, 8192, 77.76, 97.73},
    {32, 8, 128, 128, 1024, 32, 8192, 139.07, 94.82},
    {32, 8, 128, 128, 1024, 64, 8192, 267.58, 99.42},
    {32, 8, 128, 128, 1024, 1, 16384, 26.24, 27.01},
    {32, 8, 128, 128, 1024, 2, 16384, 35.42, 51.42},
    {32, 8, 128, 128, 1024, 4, 16384, 51.94, 57.79},
    {32, 8, 128, 128, 1024, 8, 16384, 75.42, 75.46},
    {32, 8, 128, 128, 1024, 16, 16384, 136.64, 107.42},
    {32, 8, 128, 128, 1024, 32, 16384, 253.54, 104.38},
    {32, 8, 128, 128, 1024, 64, 16384, 493.02, 117.76},
    {32, 8, 128, 128, 1024, 1, 32768, 41.60, 40.99},
    {32, 8, 128, 128, 1024, 2, 32768, 69.02, 66.50},
    {32, 8, 128, 128, 1024, 4, 32768, 84.00, 72.83},
    {32, 8, 128, 128, 1024, 8, 32768, 134.62, 92.22},
    {32, 8, 128, 128, 1024, 16, 32768, 253.86, 127.84},
    {32, 8, 128, 128, 1024, 32, 32768, 480.35, 123.68},
    {32, 8, 128, 128, 1024, 64, 32768, 950.37, 154.62},
    {32, 32, 128, 128, 1024, 2, 1024, 19.14, 35.07},
    {32, 32, 128, 128, 1024, 4, 1024, 28.10, 41.95},
    {32, 32, 128, 128, 1024, 8, 1024, 42.88, 54.85},
    {32, 32, 128, 128, 1024, 16, 1024, 67.23, 65.54},
    {32, 32, 128, 128, 1024, 32, 1024, 129.73, 106.27},
    {32, 32, 128, 128, 1024, 64, 1024, 255.55, 184.54},
    {32, 32, 128, 128, 1024, 2, 2048, 24.48, 46.94},
    {32, 32, 128, 128, 1024, 4, 2048, 36.51, 53.25},
    {32, 32, 128, 128, 1024, 8, 2048, 56.64, 70.56},
    {32, 32, 128, 128, 1024, 16, 2048, 97.89, 82.75},
    {32, 32, 128, 128, 1024, 32, 2048, 186.85, 121.79},
    {32, 32, 128, 128, 1024, 64, 2048, 367.58, 226.69},
    {32, 32, 128, 128, 1024, 2, 4096, 37.63, 62.46},
    {32, 32, 128, 128, 1024, 4, 4096, 55.42, 65.76},
    {32, 32, 128, 128, 1024, 8, 4096, 82.50, 78.78},
    {32, 32, 128, 128, 1024, 16, 4096, 156.77, 96.19},
    {32, 32, 128, 128, 1024, 32, 4096, 307.14, 149.50},
    {32, 32, 128, 128, 1024, 64, 4096, 598.27, 221.89},
    {32, 32, 128, 128, 1024, 2, 8192, 67.14, 79.78},
    {32, 32, 128, 128, 1024, 4, 8192, 82.91, 85.18},
    {32, 32, 128, 128, 1024, 8, 8192, 144.26, 100.64},
    {32, 32, 128, 128, 1024, 16, 8192, 278.37, 115.17},
    {32, 32, 128, 128, 1024, 32, 8192, 531.14, 170.53},
    {32, 32, 128, 128, 1024, 64, 8192, 1054.78, 251.55},
    {32, 32, 128, 128, 1024, 2, 16384, 120.99, 119.52},
    {32, 32, 128, 128, 1024, 4, 16384, 145.89, 124.06},
    {32, 32, 128, 128, 1024, 8, 16384, 262.98, 137.34},
    {32, 32, 128, 128, 1024, 16, 16384, 518.88, 152.29},
    {32, 32, 128, 128, 1024, 32, 16384, 1026.05, 205.47},
    {32, 32, 128, 128, 1024, 64, 16384, 2030.72, 312.51},
    {32, 32, 128, 128, 1024, 2, 32768, 225.89, 197.31},
    {32, 32, 128, 128, 1024, 4, 32768, 268.38, 202.66},
    {32, 32, 128, 128, 1024, 8, 32768, 490.50, 219.23},
    {32, 32, 128, 128, 1024, 16, 32768, 1012.06, 234.46},
    {32, 32, 128, 128, 1024, 32, 32768, 1963.04, 301.98},
    {32, 32, 128, 128, 1024, 64, 32768, 4069.18, 454.40},
    {32, 8, 128, 16, 128, 2, 1024, 10.37, 22.30},
    {32, 8, 128, 16, 128, 4, 1024, 13.02, 24.32},
    {32, 8, 128, 16, 128, 8, 1024, 14.14, 30.14},
    {32, 8, 128, 16, 128, 16, 1024, 18.21, 37.60},
    {32, 8, 128, 16, 128, 32, 1024, 23.71, 45.25},
    {32, 8, 128, 16, 128, 64, 1024, 39.74, 53.41},
    {32, 8, 128, 16, 128, 2, 2048, 12.77, 24.29},
    {32, 8, 128, 16, 128, 4, 2048, 15.23, 27.62},
    {32, 8, 128, 16, 128, 8, 2048, 18.21, 36.06},
    {32, 8, 128, 16, 128, 16, 2048, 26.11, 46.78},
    {32, 8, 128, 16, 128, 32, 2048, 40.32, 58.78},
    {32, 8, 128, 16, 128, 64, 2048, 67.39, 54.72},
    {32, 8, 128, 16, 128, 2, 4096, 15.39, 31.07},
    {32, 8, 128, 16, 128, 4, 4096, 19.10, 34.91},
    {32, 8, 128, 16, 128, 8, 4096, 26.11, 47.78},
    {32, 8, 128, 16, 128, 16, 4096, 40.51, 70.78},
    {32, 8, 128, 16, 128, 32, 4096, 68.74, 62.40},
    {32, 8, 128, 16, 128, 64, 4096, 125.95, 60.26},
    {32, 8, 128, 16, 128, 2, 8192, 19.52, 35.90},
    {32, 8, 128, 16, 128, 4, 8192, 27.04, 41.63},
    {32, 8, 128, 16, 128, 8, 8192, 40.61, 59.26},
    {32, 8, 128, 16, 128, 16, 8192, 69.86, 81.25},
    {32, 8, 128, 16, 128, 32, 8192, 127.52, 67.14},
    {32, 8, 128, 16, 128, 64, 8192, 238.66, 69.44},
    {32, 8, 128, 16, 128, 2, 16384, 28.16, 45.57},
    {32, 8, 128, 16, 128, 4, 16384, 42.05, 50.30},
    {32, 8, 128, 16, 128, 8, 16384, 69.18, 66.85},
    {32, 8, 128, 16, 128, 16, 16384, 128.42, 92.26},
    {32, 8, 128, 16, 128, 32, 16384, 241.41, 77.44},
    {32, 8, 128, 16, 128, 64, 16384, 461.50, 87.97},
    {32, 8, 128, 16, 128, 2, 32768, 51.20, 60.51},
    {32, 8, 128, 16, 128, 4, 32768, 70.94, 66.34},
    {32, 8, 128, 16, 128, 8, 32768, 129.44, 84.48},
    {32, 8, 128, 16, 128, 16, 32768, 242.46, 110.85},
    {32, 8, 128, 16, 128, 32, 32768, 462.88, 97.06},
    {32, 8, 128, 16, 128, 64, 32768, 912.54, 124.61},
    {32, 8, 128, 2048, 4096, 2, 1024, 16.54, 33.34},
    {32, 8, 128, 2048, 4096, 4, 1024, 22.88, 40.93},
    {32, 8, 128, 2048, 4096, 8, 1024, 34.24, 56.96},
    {32, 8, 128, 2048, 4096, 16, 1024, 59.42, 88.06},
    {32, 8, 128, 2048, 4096, 32, 1024, 107.87, 143.26},
    {32, 8, 128, 2048, 4096, 64, 1024, 209.38, 236.83},
    {32, 8, 128, 2048, 4096, 2, 2048, 18.37, 35.52},
    {32, 8, 128, 2048, 4096, 4, 2048, 24.19, 45.02},
    {32, 8, 128, 2048, 4096, 8, 2048, 36.54, 64.58},
    {32, 8, 128, 2048, 4096, 16, 2048, 65.09, 98.21},
    {32, 8, 128, 2048, 4096, 32, 2048, 111.71, 158.94},
    {32, 8, 128, 2048, 4096, 64, 2048, 225.06, 237.73},
    {32, 8, 128, 2048, 4096, 2, 4096, 22.08, 43.90},
    {32, 8, 128, 2048, 4096, 4, 4096, 29.18, 51.81},
    {32, 8, 128, 2048, 4096, 8, 4096, 45.44, 76.48},
    {32, 8, 128, 2048, 4096, 16, 4096, 74.69, 119.81},
    {32, 8, 128, 2048, 4096, 32, 4096, 130.34, 161.92},
    {32, 8, 128, 2048, 4096, 64, 4096, 258.62, 241.86},
    {32, 8, 128, 2048, 4096, 2, 8192, 27.74, 49.22},
    {32, 8, 128, 2048, 4096, 4, 8192, 40.26, 59.10},
    {32, 8, 128, 2048, 4096, 8, 8192, 56.96, 86.59},
    {32, 8, 128, 2048, 4096, 16, 8192, 99.81, 132.51},
    {32, 8, 128, 2048, 4096, 32, 8192, 186.34, 166.24},
    {32, 8, 128, 2048, 4096, 64, 8192, 371.49, 250.78},
    {32, 8, 128, 2048, 4096, 2, 16384, 40.29, 59.30},
    {32, 8, 128, 2048, 4096, 4, 16384, 59.71, 66.66},
    {32, 8, 128, 2048, 4096, 8, 16384, 98.05, 93.66},
    {32, 8, 128, 2048, 4096, 16, 16384, 156.32, 142.37},
    {32, 8, 128, 2048, 4096, 32, 16384, 300.86, 175.17},
    {32, 8, 128, 2048, 4096, 64, 16384, 582.72, 268.58},
    {32, 8, 128, 2048, 4096, 2, 32768, 75.84, 72.80},
    {32, 8, 128, 2048, 4096, 4, 32768, 118.98, 83.07},
    {32, 8, 128, 2048, 4096, 8, 32768, 151.10, 111.42},
    {32, 8, 128, 2048, 4096, 16, 32768, 272.32, 162.40},
    {32, 8, 128, 2048, 4096, 32, 32768, 521.57, 194.82},
    {32, 8, 128, 2048, 4096, 64, 32768, 1053.63, 303.74},
    {32, 8, 64, 128, 1024, 2, 2048, 11.71, 25.98},
    {32, 8, 64, 128, 1024, 4, 2048, 13.34, 26.91},
    {32, 8, 64, 128, 1024, 16, 2048, 23.26, 39.01},
    {32, 8, 64, 128, 1024, 64, 2048, 62.18, 55.65},
    {32, 8, 64, 128, 1024, 2, 8192, 15.94, 32.86},
    {32, 8, 64, 128, 1024, 4, 8192, 21.34, 35.07},
    {32, 8, 64, 128, 1024, 16, 8192, 48.77, 57.76},
    {32, 8, 64, 128, 1024, 64, 8192, 165.31, 65.86},
    {32, 8, 64, 128, 1024, 2, 32768, 36.29, 48.58},
    {32, 8, 64, 128, 1024, 4, 32768, 49.02, 50.37},
    {32, 8, 64, 128, 1024, 16, 32768, 154.50, 76.10},
    {32, 8, 64, 128, 1024, 64, 32768, 567.23, 101.54},
    {32, 8, 256, 128, 1024, 2, 2048, 29.73, 48.32},
    {32, 8, 256, 128, 1024, 4, 2048, 41.50, 58.56},
    {32, 8, 256, 128, 1024, 16, 2048, 131.90, 118.50},
    {32, 8, 256, 128, 1024, 64, 2048, 435.01, 185.34},
    {32, 8, 256, 128, 1024, 2, 8192, 59.84, 95.14},
    {32, 8, 256, 128, 1024, 4, 8192, 106.91, 93.54},
    {32, 8, 256, 128, 1024, 16, 8192, 376.13, 190.43},
    {32, 8, 256, 128, 1024, 64, 8192, 1413.25, 218.50},
    {32, 8, 256, 128, 1024, 2, 32768, 188.19, 162.14},
    {32, 8, 256, 128, 1024, 4, 32768, 354.46, 174.53},
    {32, 8, 256, 128, 1024, 16, 32768, 1355.49, 242.88},
    {32, 8, 256, 128, 1024, 64, 32768, 5334.05, 573.73},
};

// Every measured configuration: where a prefix is shared, the defaults' choice is the faster
// path or within the bench's 3 % of it, except the known misses of the fit (within 6 %): two
// requests sharing 32k with differently long suffixes (the plain estimate is low: members out of
// step), and 64 requests sharing 2k with 2048-4096-token suffixes.
struct KnownMiss {
  int suffix_min, n, prompt;
};
constexpr KnownMiss kKnownMisses[] = {{128, 2, 32768}, {2048, 2, 32768}, {2048, 64, 2048}};

void expect_defaults_choose_well(const Measured* grid, size_t size, const char* source) {
  int checked = 0, wrong = 0;
  for (size_t i = 0; i < size; ++i) {
    const Measured& m = grid[i];
    const CascadeProblemShape shape{m.num_qo_heads, m.num_kv_heads, m.head_dim, 2};
    const auto layout =
        detect_shared_prefixes(shared_prompt(m.n, m.prompt, m.suffix_min, m.suffix_max).span());
    const CascadeEstimate e = estimate_cascade(layout, shape);
    if (m.n == 1) {
      EXPECT_FALSE(layout.has_shared_prefix());
      EXPECT_FALSE(e.use_cascade);
      continue;
    }
    ASSERT_TRUE(layout.has_shared_prefix());
    ++checked;
    const auto c = check_cascade_choice(m.plain_us, m.cascade_us, e.use_cascade);
    if (c.ok) continue;
    ++wrong;
    bool known = false;
    for (const KnownMiss& k : kKnownMisses)
      known = known || (m.num_kv_heads == 8 && m.head_dim == 128 && k.suffix_min == m.suffix_min &&
                        k.n == m.n && k.prompt == m.prompt && c.slowdown <= 0.06);
    EXPECT_TRUE(known) << source << ": H " << m.num_qo_heads << "/" << m.num_kv_heads << " D "
                       << m.head_dim << " suffix " << m.suffix_min << "-" << m.suffix_max << " n "
                       << m.n << " prompt " << m.prompt << ": plain " << m.plain_us << " (est "
                       << e.plain_us << ") cascade " << m.cascade_us << " (est " << e.cascade_us
                       << "): auto " << 100 * c.slowdown << " % slower";
  }
  EXPECT_GT(checked, 100);
  EXPECT_LE(wrong, static_cast<int>(std::size(kKnownMisses))) << source;
}

TEST(CascadeCost, DefaultsChooseTheFasterPathOnTheFitGrid) {
  expect_defaults_choose_well(kFitGrid, std::size(kFitGrid), "fit grid");
}

// The bench's check (apps/flashkv/bench_cascade.cpp): a configuration fails where the automatic
// choice is more than the tolerance slower than the faster path.
TEST(CascadeCost, ChoiceCheckFailsASlowerChoice) {
  // The issue's 4 x 8k: cascade chosen at 47.1 us, plain 28.2 us.
  auto c = check_cascade_choice(28.2, 47.1, /*chose_cascade=*/true);
  EXPECT_FALSE(c.ok);
  EXPECT_DOUBLE_EQ(c.chosen_us, 47.1);
  EXPECT_DOUBLE_EQ(c.best_us, 28.2);
  EXPECT_NEAR(c.slowdown, 47.1 / 28.2 - 1, 1e-12);
  EXPECT_TRUE(check_cascade_choice(28.2, 47.1, false).ok);
  // Plain chosen where the cascade is faster.
  EXPECT_FALSE(check_cascade_choice(95.3, 86.1, false).ok);
  EXPECT_TRUE(check_cascade_choice(95.3, 86.1, true).ok);
  // Within the tolerance either way; the boundary itself passes.
  EXPECT_TRUE(check_cascade_choice(100.0, 102.9, true).ok);
  EXPECT_TRUE(check_cascade_choice(100.0, 103.0, true).ok);
  EXPECT_FALSE(check_cascade_choice(100.0, 103.1, true).ok);
  EXPECT_FALSE(check_cascade_choice(100.0, 101.0, true, 0.005).ok);
  EXPECT_EQ(check_cascade_choice(50.0, 60.0, false).slowdown, 0.0);
  EXPECT_NE(test::error_of([] { check_cascade_choice(0.0, 1.0, true); }).find("positive"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { check_cascade_choice(1.0, 1.0, true, -0.1); }).find("tolerance"),
            std::string::npos);
}

TEST(CascadeCost, BadParametersAreErrors) {
  const auto layout = detect_shared_prefixes(shared_prompt(2, 32, 3, 3).span());
  EXPECT_NE(test::error_of([&] { estimate_cascade(layout, {}); }).find("head"), std::string::npos);
  CascadeCostModel m;
  m.dram_bytes_per_us = 0;
  EXPECT_NE(test::error_of([&] { estimate_cascade(layout, kGqa, m); }).find("bandwidth"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              estimate_cascade(layout, {.num_qo_heads = 30, .num_kv_heads = 8, .head_dim = 128});
            }).find("multiple"),
            std::string::npos);
}

}  // namespace
}  // namespace flashkv
