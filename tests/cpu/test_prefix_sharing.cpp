// Tests of shared-prefix detection (scheduler/prefix_sharing.h): hand-built page tables with the
// expected levels written out, the layout invariants on random batches, determinism, and errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/test_util.h"
#include "cpu/prefix_sharing_test_util.h"
#include "scheduler/prefix_sharing.h"

namespace flashkv {
namespace {

using scheduler::CascadeLayout;
using scheduler::detect_shared_prefixes;
using scheduler::PrefixSharingOptions;
using test::PageTableHost;
using V = std::vector<int32_t>;

PageTableHost table(int page_size, const std::vector<std::pair<V, int32_t>>& reqs) {
  PageTableHost t;
  t.page_size = page_size;
  for (const auto& [pages, last] : reqs) t.add(pages, last);
  return t;
}

TEST(PrefixSharing, NoSharingIsOneLevelInBatchOrder) {
  const PageTableHost t = table(4, {{{5, 6}, 3}, {{7}, 4}, {{8, 9, 10}, 1}});
  const CascadeLayout c = detect_shared_prefixes(t.span());
  test::expect_valid_layout(t, c);
  ASSERT_EQ(c.num_levels(), 1);
  EXPECT_FALSE(c.has_shared_prefix());
  EXPECT_EQ(c.request_order, (V{0, 1, 2}));
  EXPECT_EQ(c.levels[0].kv_indptr, t.indptr);
  EXPECT_EQ(c.levels[0].kv_indices, t.indices);
  EXPECT_EQ(c.levels[0].kv_last_page_len, t.last_page_len);
}

TEST(PrefixSharing, AllShareOnePrefix) {
  const PageTableHost t = table(4, {{{1, 2, 3}, 2}, {{1, 2, 4, 5}, 4}, {{1, 2, 6}, 1}});
  const CascadeLayout c = detect_shared_prefixes(t.span());
  test::expect_valid_layout(t, c);
  ASSERT_EQ(c.num_levels(), 2);
  EXPECT_EQ(c.request_order, (V{0, 1, 2}));
  EXPECT_EQ(c.levels[0].request_indptr, (V{0, 3}));
  EXPECT_EQ(c.levels[0].kv_indices, (V{1, 2}));
  EXPECT_EQ(c.levels[0].kv_last_page_len, (V{4}));
  EXPECT_EQ(c.levels[1].kv_indptr, (V{0, 1, 3, 4}));
  EXPECT_EQ(c.levels[1].kv_indices, (V{3, 4, 5, 6}));
  EXPECT_EQ(c.levels[1].kv_last_page_len, (V{2, 4, 1}));
}

TEST(PrefixSharing, NestedGroupsInShuffledOrder) {
  // 0, 2, 3 share [1 2]; 0 and 3 also share [3]; 1 shares nothing.
  const PageTableHost t =
      table(2, {{{1, 2, 3, 5}, 1}, {{7, 8}, 2}, {{1, 2, 4, 6}, 2}, {{1, 2, 3, 9}, 2}});
  const CascadeLayout c = detect_shared_prefixes(t.span());
  test::expect_valid_layout(t, c);
  ASSERT_EQ(c.num_levels(), 3);
  EXPECT_EQ(c.request_order, (V{0, 3, 2, 1}));
  EXPECT_EQ(c.qo_rows, (V{0, 3, 2, 1}));
  EXPECT_EQ(c.levels[0].request_indptr, (V{0, 3, 4}));
  EXPECT_EQ(c.levels[0].kv_indptr, (V{0, 2, 2}));
  EXPECT_EQ(c.levels[0].kv_indices, (V{1, 2}));
  EXPECT_EQ(c.levels[0].kv_last_page_len, (V{2, 0}));
  EXPECT_EQ(c.levels[1].request_indptr, (V{0, 2, 3, 4}));
  EXPECT_EQ(c.levels[1].kv_indices, (V{3}));
  EXPECT_EQ(c.levels[1].kv_indptr, (V{0, 1, 1, 1}));
  EXPECT_EQ(c.levels[2].kv_indices, (V{5, 9, 4, 6, 7, 8}));

  // Two levels at most: [3] stays in the suffixes of 0 and 3.
  const CascadeLayout c2 = detect_shared_prefixes(t.span(), {.max_levels = 2});
  test::expect_valid_layout(t, c2);
  ASSERT_EQ(c2.num_levels(), 2);
  EXPECT_EQ(c2.levels[1].kv_indices, (V{3, 5, 4, 6, 3, 9, 7, 8}));
  // One level: sharing off.
  const CascadeLayout c1 = detect_shared_prefixes(t.span(), {.max_levels = 1});
  test::expect_valid_layout(t, c1);
  EXPECT_EQ(c1.num_levels(), 1);
  EXPECT_EQ(c1.request_order, (V{0, 1, 2, 3}));
}

TEST(PrefixSharing, PartialLastPageIsNeverShared) {
  // Same two pages, both partially filled at the end: only page 1 is shared.
  const PageTableHost t = table(16, {{{1, 2}, 5}, {{1, 2}, 5}});
  const CascadeLayout c = detect_shared_prefixes(t.span());
  test::expect_valid_layout(t, c);
  ASSERT_EQ(c.num_levels(), 2);
  EXPECT_EQ(c.levels[0].kv_indices, (V{1}));
  EXPECT_EQ(c.levels[1].kv_indices, (V{2, 2}));
  // Full last pages are shared whole; the suffixes are empty.
  const PageTableHost full = table(16, {{{1, 2}, 16}, {{1, 2}, 16}});
  const CascadeLayout f = detect_shared_prefixes(full.span());
  test::expect_valid_layout(full, f);
  EXPECT_EQ(f.levels[0].kv_indices, (V{1, 2}));
  EXPECT_EQ(f.levels[1].kv_indptr, (V{0, 0, 0}));
  // One full, one partial: the partial one's page 2 cannot be shared.
  const PageTableHost mixed = table(16, {{{1, 2}, 16}, {{1, 2}, 3}});
  EXPECT_EQ(detect_shared_prefixes(mixed.span()).levels[0].kv_indices, (V{1}));
}

TEST(PrefixSharing, EmptyRequestsAndOneRequestGroups) {
  const PageTableHost t = table(4, {{{}, 0}, {{1, 2, 3}, 4}, {{}, 0}, {{1, 2}, 2}, {{9}, 4}});
  const CascadeLayout c = detect_shared_prefixes(t.span());
  test::expect_valid_layout(t, c);
  ASSERT_EQ(c.num_levels(), 2);
  EXPECT_EQ(c.request_order, (V{0, 1, 3, 2, 4}));
  EXPECT_EQ(c.levels[0].kv_indices, (V{1}));
  // min_group_size 3: nothing is shared.
  EXPECT_EQ(detect_shared_prefixes(t.span(), {.min_group_size = 3}).num_levels(), 1);
  // A batch of one, and a batch of none.
  EXPECT_EQ(detect_shared_prefixes(table(4, {{{1, 2}, 4}}).span()).num_levels(), 1);
  const CascadeLayout none = detect_shared_prefixes(table(4, {}).span());
  EXPECT_EQ(none.num_levels(), 1);
  EXPECT_EQ(none.levels[0].num_groups(), 0);
}

TEST(PrefixSharing, CausalQueriesShareOnlyWhatEveryRowSees) {
  // kv_len 40, page 16: 2 full pages. 20 causal rows: the first sees 21 keys -> 1 whole page.
  const PageTableHost t = table(16, {{{1, 2, 3}, 8}, {{1, 2, 4}, 8}});
  const V qo{0, 20, 40};
  const CascadeLayout causal = detect_shared_prefixes(t.span(), {.qo_indptr = qo, .causal = true});
  test::expect_valid_layout(t, causal, qo);
  EXPECT_EQ(causal.levels[0].kv_indices, (V{1}));
  EXPECT_EQ(causal.qo_rows.size(), 40u);
  const CascadeLayout full = detect_shared_prefixes(t.span(), {.qo_indptr = qo});
  EXPECT_EQ(full.levels[0].kv_indices, (V{1, 2}));
  // A request with no query rows shares nothing.
  const V idle{0, 0, 1};
  EXPECT_EQ(detect_shared_prefixes(t.span(), {.qo_indptr = idle}).num_levels(), 1);
}

TEST(PrefixSharing, RandomBatchesSatisfyTheInvariants) {
  for (int ps : {1, 4, 16}) {
    for (uint64_t seed = 0; seed < 40; ++seed) {
      const PageTableHost t = test::random_shared_batch(seed * 7 + ps, ps, 1 + seed % 4, 8, 6, 40);
      SCOPED_TRACE("page_size " + std::to_string(ps) + " seed " + std::to_string(seed));
      const CascadeLayout c = detect_shared_prefixes(t.span());
      test::expect_valid_layout(t, c);
      EXPECT_LE(c.num_levels(), 3);
      const CascadeLayout c2 = detect_shared_prefixes(t.span(), {.max_levels = 2});
      test::expect_valid_layout(t, c2);
    }
  }
}

TEST(PrefixSharing, Deterministic) {
  const PageTableHost t = test::random_shared_batch(99, 16, 4, 8, 10, 100);
  const CascadeLayout a = detect_shared_prefixes(t.span());
  for (int rep = 0; rep < 3; ++rep) {
    const CascadeLayout b = detect_shared_prefixes(t.span());
    EXPECT_EQ(a.request_order, b.request_order);
    ASSERT_EQ(a.num_levels(), b.num_levels());
    for (int l = 0; l < a.num_levels(); ++l) {
      EXPECT_EQ(a.levels[l].request_indptr, b.levels[l].request_indptr);
      EXPECT_EQ(a.levels[l].kv_indices, b.levels[l].kv_indices);
      EXPECT_EQ(a.levels[l].kv_last_page_len, b.levels[l].kv_last_page_len);
    }
  }
}

TEST(PrefixSharing, BadInputNamesTheArgument) {
  PageTableHost t = table(4, {{{1, 2}, 4}, {{1, 3}, 4}});
  EXPECT_NE(test::error_of([&] {
              auto s = t.span();
              s.page_size = 0;
              detect_shared_prefixes(s);
            }).find("page_size"),
            std::string::npos);
  t.last_page_len[1] = 5;
  EXPECT_NE(test::error_of([&] { detect_shared_prefixes(t.span()); }).find("kv_last_page_len[1]"),
            std::string::npos);
  t.last_page_len[1] = 4;
  const V bad_qo{0, 1};
  EXPECT_NE(test::error_of([&] {
              detect_shared_prefixes(t.span(), {.qo_indptr = bad_qo});
            }).find("qo_indptr"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              detect_shared_prefixes(t.span(), {.max_levels = 0});
            }).find("max_levels"),
            std::string::npos);
}

}  // namespace
}  // namespace flashkv
