// Tests of the decode scheduler (src/scheduler/decode_scheduler.h): exact coverage of the KV,
// slots and merges, load balance against the spec's plain greedy, reuse, determinism, batch
// invariance of fixed_split_size, and the workspace bounds. Errors, the byte image and plan time:
// test_decode_scheduler_limits.cpp; tail balancing: test_decode_scheduler_tail.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/test_util.h"
#include "decode_scheduler_test_util.h"
#include "flashkv/error.h"
#include "scheduler/decode_scheduler.h"

namespace flashkv::scheduler {
namespace {

using namespace sched_test;

using test::error_of;

TEST(DecodeScheduler, CoversEveryTokenOnceAndBalances) {
  const std::vector<std::vector<int64_t>> batches = {{1},
                                                     {7, 0, 4096},
                                                     {131072},
                                                     {113, 239, 799, 1, 5, 100000, 0, 65536},
                                                     std::vector<int64_t>(100, 3000)};
  for (const auto& lens : batches) {
    for (int heads : {1, 8}) {
      const DecodeScheduleOptions o = bounded_options(132, heads, lens.size());
      expect_valid(lens, o, plan_decode(lens, o));
    }
  }
}

TEST(DecodeScheduler, SplitsOneLongRequestAcrossCtas) {
  const std::vector<int64_t> lens = {131072};
  const DecodeScheduleOptions o = bounded_options(132, 1, 1);
  const DecodeSchedule s = plan_decode(lens, o);
  expect_valid(lens, o, s);
  EXPECT_EQ(s.chunk_bound, 993);   // ceil(131072 / 132)
  EXPECT_EQ(s.ctas_per_unit, 1);   // one KV head: a unit per CTA
  EXPECT_EQ(s.work.size(), 132u);  // ceil(131072 / 993) chunks, one per CTA
  for (int c = 0; c < 132; ++c) EXPECT_EQ(s.unit_work_indptr[c + 1] - s.unit_work_indptr[c], 1);
  ASSERT_EQ(s.merge.size(), 1u);
  EXPECT_EQ(s.merge[0].slot_begin, 0);
  EXPECT_EQ(s.merge[0].num_slots, 132);
  EXPECT_EQ(s.merge[0].slot_stride, 1);
}

// Benchmark D1 (16 x 1024 tokens, 8 KV heads, 264 CTAs): L_kv = 497 cuts each tile into three
// chunks of 341-342, 384 chunks, so 120 CTAs run two while the rest run one; the balanced bound
// cuts in two (512 tokens): 256 chunks, at most one per CTA, a 1.4x smaller makespan.
TEST(DecodeScheduler, BalancedBoundAvoidsCtasWithTwoChunks) {
  const std::vector<int64_t> lens(16, 1024);
  DecodeScheduleOptions o = bounded_options(264, 8, lens.size());
  const DecodeSchedule s = plan_decode(lens, o);
  expect_valid(lens, o, s);
  EXPECT_EQ(s.chunk_bound, 512);
  EXPECT_EQ(s.num_cta_work_items(), 256);
  EXPECT_EQ(s.work.size(), 32u);  // blocks of 8 CTAs: one template per request chunk
  for (int c = 0; c < 264; ++c) EXPECT_LE(cta_work_count(s, c), 1);
  o.balance_chunk_bound = false;
  const DecodeSchedule plain = plan_decode(lens, o);
  expect_valid(lens, o, plain);
  EXPECT_EQ(plain.chunk_bound, 497);
  EXPECT_EQ(plain.num_cta_work_items(), 384);
  const double mine = *std::max_element(s.cta_cost.begin(), s.cta_cost.end());
  const double theirs = *std::max_element(plain.cta_cost.begin(), plain.cta_cost.end());
  EXPECT_DOUBLE_EQ(mine, o.cost.cost(1, 512));
  EXPECT_DOUBLE_EQ(theirs, 2 * o.cost.cost(1, 341));  // chunks of 342, 341, 341
}

// The op's fields, written with the items: page_base[r], the full length, and for a request of
// which only the last keys are scheduled (a window), items in request positions.
TEST(DecodeScheduler, FillsTheOpsFieldsOfEachItem) {
  const std::vector<int64_t> full = {5000, 40, 0, 3000, 100000};
  const std::vector<int64_t> window = {1024, 40, 0, 1024, 1024};
  const std::vector<int32_t> page_base = {0, 313, 316, 316, 504};
  DecodeScheduleOptions o = bounded_options(132, 4, full.size());
  const DecodeSchedule plain = plan_decode(window, o);
  expect_valid(window, o, plain);
  o.page_base = page_base;
  o.full_kv_lens = full;
  const DecodeSchedule s = plan_decode(window, o);
  ASSERT_EQ(s.work.size(), plain.work.size());
  ASSERT_EQ(s.merge.size(), plain.merge.size());
  ASSERT_FALSE(s.merge.empty());
  for (size_t i = 0; i < s.work.size(); ++i) {
    const DecodeWorkItem& a = s.work[i];
    const DecodeWorkItem& b = plain.work[i];
    const int skip = static_cast<int>(full[a.request] - window[a.request]);
    EXPECT_EQ(a.request, b.request);
    EXPECT_EQ(a.kv_head, b.kv_head);
    EXPECT_EQ(a.kv_start, b.kv_start + skip);
    EXPECT_EQ(a.kv_end, b.kv_end + skip);
    EXPECT_EQ(a.slot, b.slot);
    EXPECT_EQ(a.merge, b.merge);
    EXPECT_EQ(a.page_base, page_base[a.request]);
    EXPECT_EQ(a.kv_len, full[a.request]);
  }
  for (const DecodeMergeItem& mi : s.merge) EXPECT_EQ(mi.kv_len, full[mi.request]);
  std::vector<int64_t> short_full = full;
  short_full[3] = 1000;  // shorter than its scheduled keys
  o.full_kv_lens = short_full;
  EXPECT_THROW(plan_decode(window, o), Error);
  o.full_kv_lens = full;
  o.page_base = std::span<const int32_t>(page_base.data(), 2);
  EXPECT_THROW(plan_decode(window, o), Error);
}

// A batch where the greedy puts three chunks on some CTAs (found by a review fuzzing the
// balanced bound): the bound it picks must not make the makespan worse than L_kv's.
TEST(DecodeScheduler, BalancedBoundNeverWorsensTheMakespan) {
  const std::vector<int64_t> lens = {1857, 30023, 1862, 1441,  1696,  794, 383,  1536,
                                     2009, 1422,  1609, 25408, 11423, 417, 1006, 1301};
  const DecodeScheduleOptions o = bounded_options(132, 8, lens.size());
  expect_valid(lens, o, plan_decode(lens, o));  // asserts makespan <= L_kv's
  std::mt19937_64 rng(99);
  for (int t = 0; t < 300; ++t) {
    std::vector<int64_t> batch(1 + rng() % 24);
    for (int64_t& l : batch) l = 16 + static_cast<int64_t>(rng() % (rng() % 4 == 0 ? 32768 : 2048));
    const int heads = 1 << (rng() % 4);
    const DecodeScheduleOptions bo = bounded_options(rng() % 2 ? 132 : 264, heads, batch.size());
    expect_valid(batch, bo, plan_decode(batch, bo));
  }
}

TEST(DecodeScheduler, EmptyRequestsGetOneEmptyItem) {
  const std::vector<int64_t> lens = {0, 50000, 0, 0};
  const DecodeScheduleOptions o = bounded_options(132, 4, lens.size());
  const DecodeSchedule s = plan_decode(lens, o);
  expect_valid(lens, o, s);
  int empty = 0;
  for (const DecodeWorkItem& w : expand_to_ctas(s).work) {
    if (w.request != 1) {
      EXPECT_EQ(w.kv_start, 0);
      EXPECT_EQ(w.kv_end, 0);
      EXPECT_EQ(w.slot, -1);
      ++empty;
    }
  }
  EXPECT_EQ(empty, 3 * 4);

  const std::vector<int64_t> all_empty(5, 0);
  const DecodeSchedule z = plan_decode(all_empty, o);
  expect_valid(all_empty, o, z);
  EXPECT_EQ(z.num_cta_work_items(), 5 * 4);
  EXPECT_TRUE(z.merge.empty());

  const DecodeSchedule none = plan_decode({}, o);
  expect_valid({}, o, none);
  EXPECT_TRUE(none.work.empty());
  EXPECT_EQ(none.num_cta_work_items(), 0);
}

TEST(DecodeScheduler, MatchesPlainPriorityQueueGreedy) {
  std::mt19937_64 rng(17);
  for (int t = 0; t < 40; ++t) {
    const std::vector<int64_t> lens = random_lens(rng, 1 + rng() % 600, 131072);
    const int heads = 1 + static_cast<int>(rng() % 16);
    int ctas = 132 + static_cast<int>(rng() % 400);
    if (t % 2 == 0) ctas -= ctas % heads;  // block mode
    DecodeScheduleOptions o = bounded_options(ctas, heads, lens.size());
    o.balance_tail = false;            // compared with the plain greedy
    if (t % 4 == 1) o.cost.alpha = 0;  // empty requests cost 0: greedy piles them on one unit
    if (t % 4 == 2) o.cost = {2.5, 0.75};
    for (bool blocks : {true, false}) {
      o.block_units = blocks;
      const DecodeSchedule s = plan_decode(lens, o);
      expect_valid(lens, o, s);
      expect_matches_reference_greedy(o, s);
    }
  }
  // Fewer chunks than CTAs, and zero-cost chunks before the CTAs are all used.
  DecodeScheduleOptions o = bounded_options(264, 2, 4);
  o.balance_tail = false;
  o.cost.alpha = 0;
  const std::vector<int64_t> lens = {0, 5, 0, 300};
  for (bool blocks : {true, false}) {
    o.block_units = blocks;
    const DecodeSchedule s = plan_decode(lens, o);
    expect_valid(lens, o, s);
    expect_matches_reference_greedy(o, s);
  }
}

// The assignment moves groups of equally loaded CTAs at once (decode_scheduler.cpp): cases that
// split, merge and fragment those groups must still give exactly the plain greedy's schedule.
TEST(DecodeScheduler, MatchesPlainGreedyWhereGroupsSplitAndMerge) {
  struct Case {
    const char* name;
    std::vector<int64_t> lens;
    int ctas, heads;
    double alpha = 64;
  };
  std::mt19937_64 rng(29);
  std::vector<Case> cases;
  cases.push_back({"equal lengths (every group ties)", std::vector<int64_t>(300, 3000), 264, 8});
  cases.push_back(
      {"equal lengths, heads do not divide CTAs", std::vector<int64_t>(97, 777), 132, 5});
  std::vector<int64_t> few(700);
  for (int64_t& l : few) l = 1000 + static_cast<int64_t>(rng() % 4) * 7;  // many equal loads
  cases.push_back({"four lengths", few, 264, 8});
  cases.push_back({"four lengths, 7 heads", few, 100, 7});
  std::vector<int64_t> bench(1024);
  for (int64_t& l : bench) l = 1024 + static_cast<int64_t>(rng() % 2048);
  cases.push_back({"benchmark batch", bench, 264, 8});
  cases.push_back({"benchmark batch, 3 heads", bench, 264, 3});
  cases.push_back({"one CTA", bench, 1, 8});
  cases.push_back({"two CTAs", {5, 9, 9, 5, 0, 300}, 2, 3});
  std::vector<int64_t> empty_tail(400, 0);
  for (int i = 0; i < 40; ++i) empty_tail[i * 10] = 500 + i;
  cases.push_back({"zero-cost chunks after filling", empty_tail, 64, 2, 0.0});
  cases.push_back({"zero-cost chunks during filling", {0, 0, 3000, 0}, 264, 4, 0.0});
  // Mostly one chunk per length, so the greedy goes chunk by chunk (GreedyLpt::pop_each), with
  // integer loads that tie often: ties must still go to the lower CTA (block).
  std::vector<int64_t> tying(700);
  for (int64_t& l : tying) l = 100 + static_cast<int64_t>(rng() % 1500);
  cases.push_back({"single chunks, tying loads, blocks", tying, 264, 8});
  cases.push_back({"single chunks, tying loads, one head", tying, 132, 1});
  cases.push_back({"single chunks, tying loads, alpha 0", tying, 264, 8, 0.0});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    DecodeScheduleOptions o = bounded_options(c.ctas, c.heads, c.lens.size());
    o.balance_tail = false;  // compared with the plain greedy
    o.cost.alpha = c.alpha;
    for (bool blocks : {true, false}) {
      o.block_units = blocks;
      const DecodeSchedule s = plan_decode(c.lens, o);
      expect_valid(c.lens, o, s);
      expect_matches_reference_greedy(o, s);
    }
  }
}

TEST(DecodeScheduler, RefillsAReusedSchedule) {
  std::mt19937_64 rng(31);
  DecodeSchedule reused;
  for (int t = 0; t < 12; ++t) {  // plans of growing and shrinking sizes into the same schedule
    const std::vector<int64_t> lens = random_lens(rng, rng() % 700, 131072);
    DecodeScheduleOptions o =
        bounded_options(t % 3 == 0 ? 132 : 264, 1 + static_cast<int>(rng() % 8), lens.size());
    if (t % 4 == 3) {
      o.fixed_split_size = 4096;
      o.max_slots = o.max_work_items = 1 << 20;
    }
    plan_decode(lens, o, &reused);
    expect_same(plan_decode(lens, o), reused);
  }
  // An error leaves the schedule as it was.
  const std::vector<int64_t> lens(8, 131072);
  DecodeScheduleOptions o = bounded_options(132, 8, lens.size());
  plan_decode(lens, o, &reused);
  const DecodeSchedule before = reused;
  o.max_work_items = 4;
  EXPECT_THROW(plan_decode(lens, o, &reused), Error);
  expect_same(before, reused);
  EXPECT_THROW(plan_decode(lens, o, nullptr), Error);
}

TEST(DecodeScheduler, IsDeterministic) {
  std::mt19937_64 rng(7);
  for (int t = 0; t < 10; ++t) {
    const std::vector<int64_t> lens = random_lens(rng, 1 + rng() % 512, 131072);
    const DecodeScheduleOptions o = bounded_options(264, 8, lens.size());
    expect_same(plan_decode(lens, o), plan_decode(lens, o));
  }
}

TEST(DecodeScheduler, FixedSplitSizeIsBatchInvariant) {
  constexpr int kFs = 1024;
  constexpr int64_t kLen = 100000;
  std::mt19937_64 rng(11);
  std::vector<std::vector<DecodeWorkItem>> seen;
  for (int t = 0; t < 6; ++t) {
    std::vector<int64_t> lens = random_lens(rng, t * 37, 131072);
    const size_t pos = rng() % (lens.size() + 1);
    lens.insert(lens.begin() + pos, kLen);
    DecodeScheduleOptions o = bounded_options(132 + 66 * t, 4, lens.size());
    o.fixed_split_size = kFs;
    o.max_slots = o.max_work_items = 1 << 22;
    const DecodeSchedule s = plan_decode(lens, o);
    expect_valid(lens, o, s);
    // The request's chunks, minus what depends on the batch (its index, the slot numbers), as
    // the CTAs run them (t even: blocks of 4 CTAs; odd: 4 does not divide the CTAs).
    EXPECT_EQ(s.ctas_per_unit, t % 2 == 0 ? 4 : 1);
    std::vector<DecodeWorkItem> mine;
    for (const DecodeWorkItem& w : expand_to_ctas(s).work) {
      if (w.request == static_cast<int>(pos))
        mine.push_back({0, w.kv_head, w.kv_start, w.kv_end, 0, 0});
    }
    std::sort(mine.begin(), mine.end(), [](const DecodeWorkItem& a, const DecodeWorkItem& b) {
      return a.kv_head != b.kv_head ? a.kv_head < b.kv_head : a.kv_start < b.kv_start;
    });
    ASSERT_EQ(mine.size(), 4u * ceil_div(kLen, kFs));
    EXPECT_EQ(mine[0].kv_end, kFs);
    EXPECT_EQ(mine.back().kv_start, kLen / kFs * kFs);
    if (!seen.empty()) {
      ASSERT_EQ(mine.size(), seen[0].size());
      EXPECT_EQ(0, std::memcmp(mine.data(), seen[0].data(), mine.size() * sizeof(DecodeWorkItem)));
    }
    seen.push_back(mine);
  }
}

TEST(DecodeScheduler, DisableSplitKvGivesOneItemPerTile) {
  std::mt19937_64 rng(3);
  const std::vector<int64_t> lens = random_lens(rng, 300, 131072);
  for (int ctas : {132, 264}) {  // 8 heads: CTAs, then blocks of 8 CTAs
    DecodeScheduleOptions o = bounded_options(ctas, 8, lens.size());
    o.disable_split_kv = true;
    const DecodeSchedule s = plan_decode(lens, o);
    expect_valid(lens, o, s);
    EXPECT_EQ(s.num_cta_work_items(), static_cast<int64_t>(lens.size()) * 8);
    EXPECT_EQ(s.work.size(), lens.size() * 8 / s.ctas_per_unit);
    EXPECT_EQ(s.num_slots, 0);
    EXPECT_TRUE(s.merge.empty());
    EXPECT_EQ(s.chunk_bound, *std::max_element(lens.begin(), lens.end()));
  }
}

TEST(DecodeScheduler, BoundsHoldOverRandomBatches) {
  std::mt19937_64 rng(2025);
  for (int t = 0; t < 150; ++t) {
    const size_t batch = 1 + rng() % 1024;
    int ctas = 132 + static_cast<int>(rng() % (528 - 132 + 1));
    const int heads = 1 + static_cast<int>(rng() % 32);
    if (t % 3 == 0) ctas -= ctas % heads;  // block mode
    const std::vector<int64_t> lens = random_lens(rng, batch, 131072);
    const DecodeScheduleOptions o = bounded_options(ctas, heads, batch);
    SCOPED_TRACE("batch " + std::to_string(batch) + ", ctas " + std::to_string(ctas) + ", heads " +
                 std::to_string(heads));
    DecodeSchedule s;
    ASSERT_NO_THROW(s = plan_decode(lens, o));  // capacities are the bounds: a throw breaks them
    expect_valid(lens, o, s);
  }
}

TEST(DecodeScheduler, BoundsHoldForAdversarialBatches) {
  struct Case {
    const char* name;
    std::vector<int64_t> lens;
    int ctas, heads;
  };
  std::vector<Case> cases;
  std::vector<int64_t> huge_and_tiny(1024, 1);
  huge_and_tiny[0] = INT32_MAX;
  cases.push_back({"int32-max request + 1023 of length 1", huge_and_tiny, 132, 32});
  std::vector<int64_t> huge_and_empty(1024, 0);
  huge_and_empty[517] = 131072;
  cases.push_back({"one long request + 1023 empty", huge_and_empty, 528, 1});
  cases.push_back({"1024 equal long requests", std::vector<int64_t>(1024, 131072), 528, 32});
  cases.push_back({"1024 requests of length 1", std::vector<int64_t>(1024, 1), 132, 32});
  cases.push_back({"min_chunk + 1", {129}, 132, 1});
  cases.push_back({"C + 1 equal tiles", std::vector<int64_t>(133, 1000), 132, 1});
  std::vector<int64_t> long_and_empty(131 + 500, 0);
  std::fill(long_and_empty.begin(), long_and_empty.begin() + 131, 10000);
  cases.push_back({"C - 1 tiles just above L + 500 empty", long_and_empty, 132, 1});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    // As given, and with the CTAs rounded down to a multiple of the heads (block mode).
    for (int ctas : {c.ctas, c.ctas - c.ctas % c.heads}) {
      const DecodeScheduleOptions o = bounded_options(ctas, c.heads, c.lens.size());
      DecodeSchedule s;
      ASSERT_NO_THROW(s = plan_decode(c.lens, o));
      expect_valid(c.lens, o, s);
    }
  }
}

TEST(DecodeScheduler, BoundsAreNearlyTight) {
  // C - 1 equal tiles of l > C tokens: L = ceil((C - 1) l / C) < l, so each splits in two; empty
  // tiles add work items but no tokens.
  for (int ctas : {132, 264, 528}) {
    std::vector<int64_t> lens(ctas - 1 + 300, 0);
    std::fill(lens.begin(), lens.begin() + ctas - 1, 10000);
    DecodeScheduleOptions o = bounded_options(ctas, 1, lens.size());
    o.balance_tail = false;         // the plain schedule's bounds
    o.balance_chunk_bound = false;  // the bounds are L_kv's (balancing only cuts fewer chunks)
    const DecodeSchedule s = plan_decode(lens, o);
    expect_valid(lens, o, s);
    EXPECT_EQ(s.num_slots, 2 * ctas - 2);
    EXPECT_LE(s.num_slots, max_split_slots(ctas));
    EXPECT_EQ(s.work.size(), lens.size() + ctas - 1);
    EXPECT_LE(s.work.size(), static_cast<size_t>(o.max_work_items));
  }
}

}  // namespace
}  // namespace flashkv::scheduler
