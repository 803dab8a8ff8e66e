// Tests of the cascade cost model (scheduler/cascade_cost.h) on the clear-cut cases, which must
// not depend on the to-be-measured parameters.
#include <gtest/gtest.h>

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
using scheduler::detect_shared_prefixes;
using scheduler::estimate_cascade;
using test::PageTableHost;

constexpr CascadeProblemShape kGqa{.num_qo_heads = 32, .num_kv_heads = 8, .head_dim = 128};

// n requests sharing `prefix_tokens` (page 16), each with its own `suffix_tokens`.
PageTableHost parallel_sampling(int n, int prefix_tokens, int suffix_tokens) {
  PageTableHost t;
  t.page_size = 16;
  std::vector<int32_t> prefix(prefix_tokens / 16);
  for (size_t p = 0; p < prefix.size(); ++p) prefix[p] = static_cast<int32_t>(p);
  int32_t next = static_cast<int32_t>(prefix.size());
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> pages = prefix;
    const int own = (suffix_tokens + 15) / 16;
    for (int p = 0; p < own; ++p) pages.push_back(next++);
    t.add(pages, own == 0 ? 16 : suffix_tokens - (own - 1) * 16);
  }
  return t;
}

// The decision under every model in a wide range of the to-be-measured parameters.
std::vector<CascadeCostModel> plausible_models() {
  std::vector<CascadeCostModel> models;
  for (double bw : {1.0e6, 4.5e6}) {
    for (double eff : {0.5, 1.0}) {
      for (double overhead : {2.0, 20.0}) {
        models.push_back({.read_bytes_per_us = bw,
                          .prefix_read_efficiency = eff,
                          .state_bytes_per_us = bw,
                          .level_overhead_us = overhead});
      }
    }
  }
  return models;
}

TEST(CascadeCost, OneRequestNeverCascades) {
  const PageTableHost t = parallel_sampling(1, 8192, 100);
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
  const PageTableHost t = parallel_sampling(64, 8192, 128);
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
  const PageTableHost t = parallel_sampling(2, 16, 1000);
  const auto layout = detect_shared_prefixes(t.span());
  ASSERT_EQ(layout.num_levels(), 2);
  for (const CascadeCostModel& m : plausible_models()) {
    EXPECT_FALSE(estimate_cascade(layout, kGqa, m).use_cascade);
  }
}

TEST(CascadeCost, BadParametersAreErrors) {
  const auto layout = detect_shared_prefixes(parallel_sampling(2, 32, 3).span());
  EXPECT_NE(test::error_of([&] { estimate_cascade(layout, {}); }).find("head"), std::string::npos);
  EXPECT_NE(test::error_of([&] {
              estimate_cascade(layout, kGqa, {.read_bytes_per_us = 0});
            }).find("bandwidth"),
            std::string::npos);
}

}  // namespace
}  // namespace flashkv
