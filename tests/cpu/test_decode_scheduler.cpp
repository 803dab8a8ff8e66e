// Tests of the decode scheduler (src/scheduler/decode_scheduler.h): exact coverage of the KV,
// slots and merges, load balance, workspace bounds, determinism, batch invariance of
// fixed_split_size, error messages, the serialized byte image, and plan time.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <queue>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/schedule_checks.h"
#include "common/test_util.h"
#include "flashkv/error.h"
#include "scheduler/decode_scheduler.h"

namespace flashkv::scheduler {

namespace {

// Options whose capacities are exactly the documented dynamic-splitting bounds, so a plan that
// broke the bounds would throw.
DecodeScheduleOptions bounded_options(int num_ctas, int num_kv_heads, size_t batch) {
  DecodeScheduleOptions o;
  o.num_ctas = num_ctas;
  o.num_kv_heads = num_kv_heads;
  o.max_slots = max_decode_slots(num_ctas);
  o.max_work_items =
      max_decode_work_items(std::max<int>(1, static_cast<int>(batch)), num_kv_heads, num_ctas);
  return o;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What dynamic splitting must use as L_kv: max(min_chunk_tokens, ceil(T / C)).
int64_t expected_dynamic_bound(std::span<const int64_t> lens, const DecodeScheduleOptions& o) {
  int64_t total = 0;
  for (int64_t l : lens) total += l * o.num_kv_heads;
  return std::max<int64_t>(o.min_chunk_tokens,
                           std::min<int64_t>(INT32_MAX, ceil_div(total, o.num_ctas)));
}

double item_cost(const DecodeScheduleOptions& o, const DecodeWorkItem& w) {
  return o.cost.cost(1, w.kv_end - w.kv_start);
}

// Checks every promise of decode_scheduler.h for `s` = plan_decode(lens, o).
void expect_valid(std::span<const int64_t> lens, const DecodeScheduleOptions& o,
                  const DecodeSchedule& s) {
  const int ctas = o.num_ctas;
  const int heads = o.num_kv_heads;
  const int batch = static_cast<int>(lens.size());
  ASSERT_EQ(s.num_ctas, ctas);
  ASSERT_EQ(s.cta_work_indptr.size(), static_cast<size_t>(ctas) + 1);
  ASSERT_EQ(s.cta_cost.size(), static_cast<size_t>(ctas));
  ASSERT_EQ(s.cta_work_indptr[0], 0);
  for (int c = 0; c < ctas; ++c) ASSERT_LE(s.cta_work_indptr[c], s.cta_work_indptr[c + 1]);
  ASSERT_EQ(static_cast<size_t>(s.cta_work_indptr[ctas]), s.work.size());
  EXPECT_LE(static_cast<int64_t>(s.work.size()), o.max_work_items);
  EXPECT_LE(s.num_slots, o.max_slots);

  // Each item is inside its request, no longer than L_kv, and empty only for an empty request.
  for (const DecodeWorkItem& w : s.work) {
    ASSERT_GE(w.request, 0);
    ASSERT_LT(w.request, batch);
    ASSERT_GE(w.kv_head, 0);
    ASSERT_LT(w.kv_head, heads);
    ASSERT_LE(0, w.kv_start);
    ASSERT_LE(w.kv_end, lens[w.request]);
    ASSERT_LE(w.kv_end - w.kv_start, s.chunk_bound);
    if (lens[w.request] == 0) {
      ASSERT_EQ(w.kv_start, 0);
      ASSERT_EQ(w.kv_end, 0);
    } else {
      ASSERT_LT(w.kv_start, w.kv_end);
    }
    // Without the op's fields given: page_base 0, kv_len the scheduled length.
    ASSERT_EQ(w.page_base, 0);
    ASSERT_EQ(w.kv_len, lens[w.request]);
  }
  for (const DecodeMergeItem& mi : s.merge) ASSERT_EQ(mi.kv_len, lens[mi.request]);

  // Per CTA: costs in assignment order, recorded loads, and the LPT balance bound.
  test::expect_balanced_cta_loads(s, ctas, [&](const auto& w) { return item_cost(o, w); });

  // Coverage: sorted by (request, kv_head, kv_start), each tile's chunks tile [0, l) exactly.
  std::vector<DecodeWorkItem> items = s.work;
  std::sort(items.begin(), items.end(), [](const DecodeWorkItem& a, const DecodeWorkItem& b) {
    if (a.request != b.request) return a.request < b.request;
    if (a.kv_head != b.kv_head) return a.kv_head < b.kv_head;
    return a.kv_start < b.kv_start;
  });
  // Dynamic splitting cuts at L_kv, or with balance_chunk_bound at a larger bound (so the
  // workspace bounds still hold) whose greedy makespan is no larger than L_kv's.
  const bool dynamic = o.fixed_split_size == 0 && !o.disable_split_kv;
  const int64_t dyn_bound = dynamic ? s.chunk_bound : expected_dynamic_bound(lens, o);
  if (dynamic && !o.balance_chunk_bound) {
    EXPECT_EQ(s.chunk_bound, expected_dynamic_bound(lens, o));
  } else if (dynamic) {
    EXPECT_GE(s.chunk_bound, expected_dynamic_bound(lens, o));
    DecodeScheduleOptions plain = o;
    plain.balance_chunk_bound = false;
    const DecodeSchedule p = plan_decode(lens, plain);
    const double mine = *std::max_element(s.cta_cost.begin(), s.cta_cost.end());
    const double theirs = *std::max_element(p.cta_cost.begin(), p.cta_cost.end());
    EXPECT_LE(mine, theirs) << "the balanced bound made the makespan worse";
  }
  std::vector<char> slot_seen(std::max(0, s.num_slots), 0);
  size_t i = 0, m = 0;
  for (int r = 0; r < batch; ++r) {
    const int64_t l = lens[r];
    for (int h = 0; h < heads; ++h) {
      size_t end = i;
      int64_t pos = 0;
      while (end < items.size() && items[end].request == r && items[end].kv_head == h) {
        ASSERT_EQ(items[end].kv_start, pos) << "gap or overlap in tile (" << r << ", " << h << ")";
        pos = items[end].kv_end;
        ++end;
      }
      ASSERT_EQ(pos, l) << "tile (" << r << ", " << h << ") not fully covered";
      const size_t n = end - i;
      ASSERT_GE(n, 1u) << "tile (" << r << ", " << h << ") has no work item";
      // Chunking by mode.
      if (o.disable_split_kv || l == 0) {
        ASSERT_EQ(n, 1u);
      } else if (o.fixed_split_size > 0) {
        ASSERT_EQ(static_cast<int64_t>(n), ceil_div(l, o.fixed_split_size));
        for (size_t k = i; k + 1 < end; ++k)
          ASSERT_EQ(items[k].kv_end - items[k].kv_start, o.fixed_split_size);
      } else {
        ASSERT_EQ(static_cast<int64_t>(n), ceil_div(l, dyn_bound));
        int lo = INT_MAX, hi = 0;
        for (size_t k = i; k < end; ++k) {
          lo = std::min(lo, items[k].kv_end - items[k].kv_start);
          hi = std::max(hi, items[k].kv_end - items[k].kv_start);
        }
        ASSERT_LE(hi - lo, 1) << "chunks of tile (" << r << ", " << h << ") are not near-equal";
      }
      // Slots: write-through when unsplit; else consecutive slots in KV order and a merge item.
      if (n == 1) {
        ASSERT_EQ(items[i].slot, -1);
        ASSERT_EQ(items[i].merge, -1);
      } else {
        ASSERT_LT(m, s.merge.size()) << "missing merge item for (" << r << ", " << h << ")";
        const DecodeMergeItem& mi = s.merge[m++];
        ASSERT_EQ(mi.request, r);
        ASSERT_EQ(mi.kv_head, h);
        ASSERT_EQ(mi.slot_end - mi.slot_begin, static_cast<int>(n));
        for (size_t k = i; k < end; ++k) {
          const int slot = items[k].slot;
          ASSERT_EQ(slot, mi.slot_begin + static_cast<int>(k - i));
          ASSERT_EQ(items[k].merge, static_cast<int>(m - 1)) << "item names another merge item";
          ASSERT_GE(slot, 0);
          ASSERT_LT(slot, s.num_slots);
          ASSERT_FALSE(slot_seen[slot]) << "slot " << slot << " used twice";
          slot_seen[slot] = 1;
        }
      }
      i = end;
    }
  }
  EXPECT_EQ(i, items.size());
  EXPECT_EQ(m, s.merge.size()) << "merge items for unsplit tiles, or out of (request, head) order";
  EXPECT_EQ(std::count(slot_seen.begin(), slot_seen.end(), 1), s.num_slots) << "unused slots";
}

std::vector<int64_t> random_lens(std::mt19937_64& rng, size_t batch, int64_t max_len) {
  std::vector<int64_t> lens(batch);
  const int shape = static_cast<int>(rng() % 3);
  std::uniform_int_distribution<int64_t> uniform(0, max_len);
  std::uniform_real_distribution<double> log_len(0.0, std::log(static_cast<double>(max_len)));
  for (int64_t& l : lens) {
    if (shape == 0) {
      l = uniform(rng);
    } else if (shape == 1) {  // log-uniform: mostly short, some long
      l = static_cast<int64_t>(std::exp(log_len(rng)));
    } else {  // short requests, a few very long, some empty
      const uint64_t p = rng() % 100;
      l = p < 5    ? 0
          : p < 90 ? static_cast<int64_t>(rng() % 2048)
                   : max_len - static_cast<int64_t>(rng() % 1024);
    }
  }
  return lens;
}

void expect_same(const DecodeSchedule& a, const DecodeSchedule& b) {
  EXPECT_EQ(a.num_ctas, b.num_ctas);
  EXPECT_EQ(a.num_slots, b.num_slots);
  EXPECT_EQ(a.chunk_bound, b.chunk_bound);
  EXPECT_EQ(a.cta_work_indptr, b.cta_work_indptr);
  EXPECT_EQ(a.cta_cost, b.cta_cost);
  ASSERT_EQ(a.work.size(), b.work.size());
  ASSERT_EQ(a.merge.size(), b.merge.size());
  // Both structs are packed ints (static_assert in decode_plan_serialize.cpp): bytes compare.
  EXPECT_EQ(0, std::memcmp(a.work.data(), b.work.data(), a.work.size() * sizeof(DecodeWorkItem)));
  EXPECT_EQ(0,
            std::memcmp(a.merge.data(), b.merge.data(), a.merge.size() * sizeof(DecodeMergeItem)));
}

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
  EXPECT_EQ(s.work.size(), 132u);  // ceil(131072 / 993) chunks, one per CTA
  for (int c = 0; c < 132; ++c) EXPECT_EQ(s.cta_work_indptr[c + 1] - s.cta_work_indptr[c], 1);
  ASSERT_EQ(s.merge.size(), 1u);
  EXPECT_EQ(s.merge[0].slot_begin, 0);
  EXPECT_EQ(s.merge[0].slot_end, 132);
}

// Benchmark D1 (16 x 1024 tokens, 8 KV heads, 264 CTAs): L_kv = 497 cuts each tile into three
// chunks of 341-342, 384 chunks, so 120 CTAs run two while the rest run one; the balanced bound cuts
// in two (512 tokens): 256 chunks, at most one per CTA, a 1.4x smaller makespan.
TEST(DecodeScheduler, BalancedBoundAvoidsCtasWithTwoChunks) {
  const std::vector<int64_t> lens(16, 1024);
  DecodeScheduleOptions o = bounded_options(264, 8, lens.size());
  const DecodeSchedule s = plan_decode(lens, o);
  expect_valid(lens, o, s);
  EXPECT_EQ(s.chunk_bound, 512);
  EXPECT_EQ(s.work.size(), 256u);
  for (int c = 0; c < 264; ++c) EXPECT_LE(s.cta_work_indptr[c + 1] - s.cta_work_indptr[c], 1);
  o.balance_chunk_bound = false;
  const DecodeSchedule plain = plan_decode(lens, o);
  expect_valid(lens, o, plain);
  EXPECT_EQ(plain.chunk_bound, 497);
  EXPECT_EQ(plain.work.size(), 384u);
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
  const std::vector<int64_t> lens = {1857, 30023, 1862, 1441, 1696, 794,   383,  1536,
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
  for (const DecodeWorkItem& w : s.work) {
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
  EXPECT_EQ(z.work.size(), 5u * 4);
  EXPECT_TRUE(z.merge.empty());

  const DecodeSchedule none = plan_decode({}, o);
  expect_valid({}, o, none);
  EXPECT_TRUE(none.work.empty());
}

// The spec's greedy, written plainly: chunks sorted by (cost desc, request, kv_start, kv_head),
// each popped onto the least-loaded CTA of a std::priority_queue of (load, cta), then grouped by
// CTA in assignment order. The chunks are taken from `s` itself (expect_valid checks them).
void expect_matches_reference_greedy(const DecodeScheduleOptions& o, const DecodeSchedule& s) {
  std::vector<DecodeWorkItem> chunks = s.work;
  std::sort(chunks.begin(), chunks.end(), [&](const DecodeWorkItem& a, const DecodeWorkItem& b) {
    const double ca = item_cost(o, a), cb = item_cost(o, b);
    if (ca != cb) return ca > cb;
    if (a.request != b.request) return a.request < b.request;
    if (a.kv_start != b.kv_start) return a.kv_start < b.kv_start;
    return a.kv_head < b.kv_head;
  });
  using Load = std::pair<double, int>;
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> heap;
  for (int c = 0; c < o.num_ctas; ++c) heap.push({0.0, c});
  std::vector<std::vector<DecodeWorkItem>> per_cta(o.num_ctas);
  std::vector<double> load(o.num_ctas, 0.0);
  for (const DecodeWorkItem& w : chunks) {
    auto [l, c] = heap.top();
    heap.pop();
    per_cta[c].push_back(w);
    load[c] = l + item_cost(o, w);
    heap.push({load[c], c});
  }
  std::vector<DecodeWorkItem> expected;
  for (const auto& items : per_cta) expected.insert(expected.end(), items.begin(), items.end());
  ASSERT_EQ(expected.size(), s.work.size());
  EXPECT_EQ(0, std::memcmp(expected.data(), s.work.data(), s.work.size() * sizeof(DecodeWorkItem)));
  EXPECT_EQ(load, s.cta_cost);
}

TEST(DecodeScheduler, MatchesPlainPriorityQueueGreedy) {
  std::mt19937_64 rng(17);
  for (int t = 0; t < 40; ++t) {
    const std::vector<int64_t> lens = random_lens(rng, 1 + rng() % 600, 131072);
    DecodeScheduleOptions o =
        bounded_options(132 + static_cast<int>(rng() % 400), 1 + rng() % 16, lens.size());
    if (t % 4 == 1) o.cost.alpha = 0;  // empty requests cost 0: greedy piles them on one CTA
    if (t % 4 == 2) o.cost = {2.5, 0.75};
    const DecodeSchedule s = plan_decode(lens, o);
    expect_valid(lens, o, s);
    expect_matches_reference_greedy(o, s);
  }
  // Fewer chunks than CTAs, and zero-cost chunks before the CTAs are all used.
  DecodeScheduleOptions o = bounded_options(264, 2, 4);
  o.cost.alpha = 0;
  const std::vector<int64_t> lens = {0, 5, 0, 300};
  const DecodeSchedule s = plan_decode(lens, o);
  expect_valid(lens, o, s);
  expect_matches_reference_greedy(o, s);
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
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    DecodeScheduleOptions o = bounded_options(c.ctas, c.heads, c.lens.size());
    o.cost.alpha = c.alpha;
    const DecodeSchedule s = plan_decode(c.lens, o);
    expect_valid(c.lens, o, s);
    expect_matches_reference_greedy(o, s);
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
  o.max_slots = 4;
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
    // The request's chunks, minus what depends on the batch (its index, the slot numbers).
    std::vector<DecodeWorkItem> mine;
    for (const DecodeWorkItem& w : s.work) {
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
  DecodeScheduleOptions o = bounded_options(132, 8, lens.size());
  o.disable_split_kv = true;
  const DecodeSchedule s = plan_decode(lens, o);
  expect_valid(lens, o, s);
  EXPECT_EQ(s.work.size(), lens.size() * 8);
  EXPECT_EQ(s.num_slots, 0);
  EXPECT_TRUE(s.merge.empty());
  EXPECT_EQ(s.chunk_bound, *std::max_element(lens.begin(), lens.end()));
}

TEST(DecodeScheduler, BoundsHoldOverRandomBatches) {
  std::mt19937_64 rng(2025);
  for (int t = 0; t < 150; ++t) {
    const size_t batch = 1 + rng() % 1024;
    const int ctas = 132 + static_cast<int>(rng() % (528 - 132 + 1));
    const int heads = 1 + static_cast<int>(rng() % 32);
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
    const DecodeScheduleOptions o = bounded_options(c.ctas, c.heads, c.lens.size());
    DecodeSchedule s;
    ASSERT_NO_THROW(s = plan_decode(c.lens, o));
    expect_valid(c.lens, o, s);
  }
}

TEST(DecodeScheduler, BoundsAreNearlyTight) {
  // C - 1 equal tiles of l > C tokens: L = ceil((C - 1) l / C) < l, so each splits in two; empty
  // tiles add work items but no tokens.
  for (int ctas : {132, 264, 528}) {
    std::vector<int64_t> lens(ctas - 1 + 300, 0);
    std::fill(lens.begin(), lens.begin() + ctas - 1, 10000);
    DecodeScheduleOptions o = bounded_options(ctas, 1, lens.size());
    o.balance_chunk_bound = false;  // the bounds are L_kv's (balancing only cuts fewer chunks)
    const DecodeSchedule s = plan_decode(lens, o);
    expect_valid(lens, o, s);
    EXPECT_EQ(s.num_slots, 2 * ctas - 2);
    EXPECT_LE(s.num_slots, max_decode_slots(ctas));
    EXPECT_EQ(s.work.size(), lens.size() + ctas - 1);
    EXPECT_LE(s.work.size(), static_cast<size_t>(o.max_work_items));
  }
}

TEST(DecodeScheduler, CapacityErrorsSayWhatIsMissing) {
  const std::vector<int64_t> lens(8, 131072);
  DecodeScheduleOptions o = bounded_options(132, 8, lens.size());
  o.fixed_split_size = 16;  // 8 * 8 * 8192 = 524288 chunks
  std::string msg = error_of([&] { plan_decode(lens, o); });
  EXPECT_NE(msg.find("524288 partial-state slots"), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_slots = 264"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fixed_split_size"), std::string::npos) << msg;

  o.max_slots = 1 << 20;
  msg = error_of([&] { plan_decode(lens, o); });
  EXPECT_NE(msg.find("524288 work items"), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_work_items = 196"), std::string::npos) << msg;

  DecodeScheduleOptions small = bounded_options(132, 8, lens.size());
  small.max_slots = 4;
  msg = error_of([&] { plan_decode(lens, small); });
  EXPECT_NE(msg.find("max_slots = 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_decode_slots"), std::string::npos) << msg;
}

TEST(DecodeScheduler, RejectsInvalidOptions) {
  const std::vector<int64_t> lens = {100};
  const auto expect_error = [&](DecodeScheduleOptions o, std::span<const int64_t> l,
                                const char* needle) {
    const std::string msg = error_of([&] { plan_decode(l, o); });
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  };
  const DecodeScheduleOptions ok = bounded_options(132, 8, 1);
  DecodeScheduleOptions o = ok;
  o.num_ctas = 0;
  expect_error(o, lens, "num_ctas");
  o = ok;
  o.num_kv_heads = 0;
  expect_error(o, lens, "num_kv_heads");
  o = ok;
  o.fixed_split_size = -1;
  expect_error(o, lens, "fixed_split_size");
  o = ok;
  o.fixed_split_size = 256;
  o.disable_split_kv = true;
  expect_error(o, lens, "mutually exclusive");
  o = ok;
  o.min_chunk_tokens = 0;
  expect_error(o, lens, "min_chunk_tokens");
  o = ok;
  o.max_slots = 0;
  expect_error(o, lens, "max_slots");
  o = ok;
  o.max_work_items = -3;
  expect_error(o, lens, "max_work_items");
  o = ok;
  o.cost.beta = 0;
  expect_error(o, lens, "cost.beta");
  o = ok;
  o.cost.alpha = NAN;
  expect_error(o, lens, "cost.alpha");
  const std::vector<int64_t> negative = {5, -1};
  expect_error(ok, negative, "kv_lens[1] = -1");
  const std::vector<int64_t> too_long = {int64_t{INT32_MAX} + 1};
  expect_error(ok, too_long, "kv_lens[0] = 2147483648");
  o = ok;
  o.fixed_split_size = 64;  // lengths are checked in every mode
  expect_error(o, negative, "kv_lens[1]");

  EXPECT_THROW(max_decode_slots(0), Error);
  EXPECT_THROW(max_decode_work_items(1 << 20, 1 << 12, 132), Error);
  EXPECT_EQ(max_decode_work_items(256, 8, 264), 256 * 8 + 264);
  EXPECT_EQ(max_decode_merge_items(528), 264);
}

TEST(DecodeScheduler, SerializationRoundTrips) {
  std::mt19937_64 rng(5);
  const std::vector<int64_t> lens = random_lens(rng, 200, 131072);
  const DecodeScheduleOptions o = bounded_options(264, 8, lens.size());
  const DecodeSchedule s = plan_decode(lens, o);
  ASSERT_FALSE(s.merge.empty());
  const DecodePlanLayout l =
      decode_plan_layout(o.num_ctas, o.max_work_items, max_decode_merge_items(o.max_slots));
  for (size_t off : {l.header, l.cta_work_indptr, l.work, l.bytes}) {
    EXPECT_EQ(off % 16, 0u);
  }
  EXPECT_LE(l.header + sizeof(DecodePlanHeader), l.cta_work_indptr);
  EXPECT_LE(l.cta_work_indptr + (o.num_ctas + 1) * sizeof(int), l.work);
  EXPECT_LE(l.work + o.max_work_items * sizeof(DecodeWorkItem) +
                l.max_merge_items * sizeof(DecodeMergeItem),
            l.bytes);

  std::vector<std::byte> bytes(l.bytes, std::byte{0xAB});
  const size_t used = serialize_decode_schedule(s, l, bytes.data());
  EXPECT_LE(used, l.bytes);

  // Parse the image back as the kernels would read it (only the first `used` bytes are copied).
  bytes.resize(used);
  DecodePlanHeader h;
  std::memcpy(&h, bytes.data() + l.header, sizeof(h));
  DecodeSchedule back;
  back.num_ctas = o.num_ctas;
  back.num_slots = s.num_slots;
  back.chunk_bound = s.chunk_bound;
  back.cta_cost = s.cta_cost;
  back.cta_work_indptr.resize(o.num_ctas + 1);
  std::memcpy(back.cta_work_indptr.data(), bytes.data() + l.cta_work_indptr,
              back.cta_work_indptr.size() * sizeof(int));
  ASSERT_EQ(h.num_work_items, back.cta_work_indptr.back());
  back.work.resize(h.num_work_items);
  std::memcpy(back.work.data(), bytes.data() + l.work, back.work.size() * sizeof(DecodeWorkItem));
  ASSERT_GE(h.num_merge_items, 0);
  EXPECT_EQ(h.merge_offset % 16, 0);
  back.merge.resize(h.num_merge_items);
  std::memcpy(back.merge.data(), bytes.data() + h.merge_offset,
              h.num_merge_items * sizeof(DecodeMergeItem));
  expect_same(s, back);

  // Items planned straight into the image (work_out, as plan() does) give the same bytes.
  DecodeScheduleOptions in_place = o;
  std::vector<std::byte> image(l.bytes, std::byte{0xAB});  // the same fill: gaps stay unwritten
  in_place.work_out = reinterpret_cast<DecodeWorkItem*>(image.data() + l.work);
  const DecodeSchedule t = plan_decode(lens, in_place);
  EXPECT_TRUE(t.work.empty());
  EXPECT_EQ(t.num_work_items, static_cast<int>(s.work.size()));
  EXPECT_EQ(serialize_decode_schedule(t, l, image.data()), used);
  image.resize(used);
  EXPECT_EQ(0, std::memcmp(image.data(), bytes.data(), used));

  // A schedule that does not fit the layout is refused.
  const DecodePlanLayout other = decode_plan_layout(132, o.max_work_items, 16);
  EXPECT_NE(error_of([&] { serialize_decode_schedule(s, other, bytes.data()); }).find("CTAs"),
            std::string::npos);
  const DecodePlanLayout few_merges = decode_plan_layout(264, o.max_work_items, 1);
  EXPECT_NE(
      error_of([&] { serialize_decode_schedule(s, few_merges, bytes.data()); }).find("merge items"),
      std::string::npos);
  EXPECT_THROW(decode_plan_layout(0, 1, 1), Error);
}

// Prints plan_decode's CPU time; the target is <= 20 us at batch 256 (8 KV heads, 264 CTAs,
// lengths 1024 + rng() % 2048 as the decode benchmark uses), but timing is machine-dependent, so
// only a gross bound is asserted. "reused": the overload that refills a kept DecodeSchedule.
TEST(DecodeScheduler, PlanTimeMicroBenchmark) {
  constexpr int kHeads = 8, kCtas = 264, kRuns = 51;
  const auto median_us = [](std::vector<double>& us) {
    std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
    return us[us.size() / 2];
  };
  struct Lengths {
    const char* name;
    int64_t min, span;
  };
  for (const Lengths& dist :
       {Lengths{"1024 + rng() % 2048", 1024, 2048}, Lengths{"512 + rng() % 32257", 512, 32257}}) {
    std::mt19937_64 rng(1);
    for (size_t batch : {1, 64, 256, 1024}) {
      std::vector<int64_t> lens(batch);
      for (int64_t& l : lens) l = dist.min + static_cast<int64_t>(rng() % dist.span);
      const DecodeScheduleOptions o = bounded_options(kCtas, kHeads, batch);
      DecodeSchedule kept;
      size_t items = 0;
      for (int w = 0; w < 5; ++w) {  // warm up
        items = plan_decode(lens, o).work.size();
        plan_decode(lens, o, &kept);
      }
      std::vector<double> us(kRuns), us_kept(kRuns);
      for (int r = 0; r < kRuns; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        const DecodeSchedule s = plan_decode(lens, o);
        const auto t1 = std::chrono::steady_clock::now();
        plan_decode(lens, o, &kept);
        const auto t2 = std::chrono::steady_clock::now();
        us[r] = std::chrono::duration<double, std::micro>(t1 - t0).count();
        us_kept[r] = std::chrono::duration<double, std::micro>(t2 - t1).count();
        ASSERT_EQ(s.work.size(), items);
        ASSERT_EQ(kept.work.size(), items);
      }
      const double median = median_us(us);
      std::printf(
          "plan_decode lengths %s, batch %4zu x %d kv heads, %d CTAs: %5zu work items, "
          "median %6.1f us (reused schedule: %6.1f us)\n",
          dist.name, batch, kHeads, kCtas, items, median, median_us(us_kept));
      EXPECT_LT(median, 1e6);
    }
  }
}

}  // namespace
}  // namespace flashkv::scheduler
