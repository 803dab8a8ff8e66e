// Tests of the prefill scheduler (src/scheduler/prefill_scheduler.h), its assignment: the
// documented greedy replayed with a plain priority queue, determinism, and the capacity bounds over
// random and adversarial batches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <queue>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "prefill_scheduler_test_util.h"
#include "scheduler/prefill_scheduler.h"

namespace flashkv::scheduler {
namespace {

using namespace prefill_test;

TEST(PrefillScheduler, MatchesPlainPriorityQueueGreedy) {
  // Replays the documented greedy with a std::priority_queue of (load, cta): chunks by cost
  // descending, ties by (request, q_start, kv_start, kv_head), each to the least-loaded CTA, ties
  // to the lower index. The schedule's per-CTA lists must be exactly what the replay gives, each
  // then in (request, kv_head, q_start, kv_start) order.
  std::mt19937_64 rng(99);
  for (int t = 0; t < 12; ++t) {
    Batch b = random_batch(rng);
    if (t % 3 == 0) {  // many equal costs: ties everywhere
      b.qo.assign(b.qo.size(), 1 + static_cast<int64_t>(rng() % 3));
      b.kv.assign(b.kv.size(), 1 + static_cast<int64_t>(rng() % 3));
    }
    const int ctas = t % 4 == 1 ? 1 : 132 + static_cast<int>(rng() % 300);
    PrefillScheduleOptions o =
        bounded_options(ctas, 1 + static_cast<int>(rng() % 8), 4, b.qo, t % 2 == 0);
    if (t % 4 == 3) o.cost.alpha = 0;  // empty tiles then cost nothing
    const PrefillSchedule s = plan_prefill(b.qo, b.kv, o);
    std::vector<PrefillWorkItem> chunks = s.work;
    std::sort(chunks.begin(), chunks.end(),
              [&](const PrefillWorkItem& a, const PrefillWorkItem& c) {
                const double ca = item_cost(o, a), cc = item_cost(o, c);
                if (ca != cc) return ca > cc;
                if (a.request != c.request) return a.request < c.request;
                if (a.q_start != c.q_start) return a.q_start < c.q_start;
                if (a.kv_start != c.kv_start) return a.kv_start < c.kv_start;
                return a.kv_head < c.kv_head;
              });
    using Load = std::pair<double, int>;
    std::priority_queue<Load, std::vector<Load>, std::greater<Load>> heap;
    for (int c = 0; c < ctas; ++c) heap.push({0.0, c});
    std::vector<std::vector<PrefillWorkItem>> per_cta(static_cast<size_t>(ctas));
    for (const PrefillWorkItem& w : chunks) {
      const auto [load, c] = heap.top();
      heap.pop();
      heap.push({load + item_cost(o, w), c});
      per_cta[c].push_back(w);
    }
    for (int c = 0; c < ctas; ++c) {
      std::sort(per_cta[c].begin(), per_cta[c].end(), by_tile_then_kv);
      const size_t n = per_cta[c].size();
      ASSERT_EQ(static_cast<size_t>(s.cta_work_indptr[c + 1] - s.cta_work_indptr[c]), n)
          << "CTA " << c;
      ASSERT_EQ(0, std::memcmp(per_cta[c].data(), s.work.data() + s.cta_work_indptr[c],
                               n * sizeof(PrefillWorkItem)))
          << "CTA " << c;
    }
  }
}

// The same replay for head-major schedules: chunks by (kv_head, cost descending, request, q_start,
// kv_start), each to the least-loaded CTA (ties to the lower index); each CTA's list is then in
// that order, exactly.
TEST(PrefillScheduler, HeadMajorMatchesPlainPriorityQueueGreedy) {
  std::mt19937_64 rng(7);
  for (int t = 0; t < 12; ++t) {
    Batch b = random_batch(rng);
    if (t % 3 == 0) {  // many equal costs: ties everywhere
      b.qo.assign(b.qo.size(), 1 + static_cast<int64_t>(rng() % 3));
      b.kv.assign(b.kv.size(), 1 + static_cast<int64_t>(rng() % 3));
    }
    const int ctas = t % 4 == 1 ? 1 : 132 + static_cast<int>(rng() % 300);
    PrefillScheduleOptions o =
        bounded_options(ctas, 1 + static_cast<int>(rng() % 8), 4, b.qo, t % 2 == 0);
    o.head_major = true;
    if (t % 4 == 3) o.cost.alpha = 0;  // empty tiles then cost nothing
    const PrefillSchedule s = plan_prefill(b.qo, b.kv, o);
    std::vector<PrefillWorkItem> chunks = s.work;
    std::sort(chunks.begin(), chunks.end(),
              [&](const PrefillWorkItem& a, const PrefillWorkItem& c) {
                if (a.kv_head != c.kv_head) return a.kv_head < c.kv_head;
                const double ca = item_cost(o, a), cc = item_cost(o, c);
                if (ca != cc) return ca > cc;
                if (a.request != c.request) return a.request < c.request;
                if (a.q_start != c.q_start) return a.q_start < c.q_start;
                return a.kv_start < c.kv_start;
              });
    using Load = std::pair<double, int>;
    std::priority_queue<Load, std::vector<Load>, std::greater<Load>> heap;
    for (int c = 0; c < ctas; ++c) heap.push({0.0, c});
    std::vector<std::vector<PrefillWorkItem>> per_cta(static_cast<size_t>(ctas));
    for (const PrefillWorkItem& w : chunks) {
      const auto [load, c] = heap.top();
      heap.pop();
      heap.push({load + item_cost(o, w), c});
      per_cta[c].push_back(w);
    }
    for (int c = 0; c < ctas; ++c) {
      const size_t n = per_cta[c].size();
      ASSERT_EQ(static_cast<size_t>(s.cta_work_indptr[c + 1] - s.cta_work_indptr[c]), n)
          << "CTA " << c;
      ASSERT_EQ(0, std::memcmp(per_cta[c].data(), s.work.data() + s.cta_work_indptr[c],
                               n * sizeof(PrefillWorkItem)))
          << "CTA " << c;
    }
  }
}

// Head-major order: the same coverage, slots and balance bound as request-major (expect_valid),
// each CTA's items by KV head, costliest first within one; a CTA's k-th item belongs to about the
// same head as every other CTA's (all CTAs work through the heads together).
TEST(PrefillScheduler, HeadMajorOrderCoversTheSameWork) {
  std::mt19937_64 rng(123);
  for (int t = 0; t < 30; ++t) {
    const Batch b = random_batch(rng);
    const bool causal = t % 2 == 0;
    PrefillScheduleOptions o = bounded_options(132, 1 + t % 8, 4, b.qo, causal);
    o.head_major = true;
    o.split_align = t % 3 == 0 ? 128 : 1;
    o.tile_rows = t % 3 == 0 ? 128 : 0;
    SCOPED_TRACE("case " + std::to_string(t));
    const PrefillSchedule s = plan_prefill(b.qo, b.kv, o);
    expect_valid(b.qo, b.kv, o, s, /*check_rows=*/t < 2);
  }
  // 16 x 1024 causal at 8 and 32 heads: equal costs across requests, rising again at each head
  // (GreedyLpt, which needs non-increasing costs, looped forever on these).
  for (int heads : {8, 32}) {
    const std::vector<int64_t> qo(16, 1024), kv(16, 1024);
    PrefillScheduleOptions o = bounded_options(132, heads, 32 / heads, qo, true);
    o.tile_rows = 128;
    o.split_align = 128;
    o.head_major = true;
    expect_valid(qo, kv, o, plan_prefill(qo, kv, o), true);
  }
  // One 32k causal prompt, 32 KV heads, 128-token tiles on 132 CTAs: the head of each CTA's item
  // at the middle of its list differs from the median CTA's by at most a couple of heads.
  const std::vector<int64_t> qo{32768}, kv{32768};
  PrefillScheduleOptions o = bounded_options(132, 32, 1, qo, true);
  o.tile_rows = 128;
  o.head_major = true;
  const PrefillSchedule s = plan_prefill(qo, kv, o);
  expect_valid(qo, kv, o, s);
  int lo = 32, hi = -1;
  for (int c = 0; c < 132; ++c) {
    const int n = s.cta_work_indptr[c + 1] - s.cta_work_indptr[c];
    ASSERT_GT(n, 0);
    const int h = s.work[s.cta_work_indptr[c] + n / 2].kv_head;
    lo = std::min(lo, h);
    hi = std::max(hi, h);
  }
  EXPECT_LE(hi - lo, 2) << "the CTAs' middle items span heads " << lo << ".." << hi;
}

TEST(PrefillScheduler, IsDeterministic) {
  std::mt19937_64 rng(7);
  for (int t = 0; t < 5; ++t) {
    const Batch b = random_batch(rng);
    const PrefillScheduleOptions o = bounded_options(264, 4, 4, b.qo, t % 2 == 0);
    const PrefillSchedule a = plan_prefill(b.qo, b.kv, o);
    PrefillSchedule reused = plan_prefill(b.qo, b.kv, o);
    plan_prefill(b.qo, b.kv, o, &reused);  // refilling a used schedule gives the same
    expect_same(a, reused);
  }
}

TEST(PrefillScheduler, BoundsHoldOverRandomBatches) {
  std::mt19937_64 rng(2024);
  int64_t items = 0;
  for (int t = 0; t < 60; ++t) {
    const Batch b = random_batch(rng);
    const int heads = 1 + static_cast<int>(rng() % 32);
    const int group = 1 + static_cast<int>(rng() % 16);
    const int ctas = 132 + static_cast<int>(rng() % (528 - 132 + 1));
    const bool causal = rng() % 2 == 0;
    SCOPED_TRACE("batch " + std::to_string(b.qo.size()) + ", heads " + std::to_string(heads) +
                 ", group " + std::to_string(group) + ", ctas " + std::to_string(ctas) +
                 (causal ? ", causal" : ""));
    const PrefillScheduleOptions o = bounded_options(ctas, heads, group, b.qo, causal);
    const PrefillSchedule s = plan_prefill(b.qo, b.kv, o);  // throws if a bound is broken
    expect_valid(b.qo, b.kv, o, s);
    items += static_cast<int64_t>(s.work.size());
  }
  std::printf("[ PrefillScheduler ] 60 random batches: %lld work items in all\n",
              static_cast<long long>(items));
}

TEST(PrefillScheduler, BoundsHoldForAdversarialBatches) {
  struct Case {
    const char* name;
    Batch b;
    int ctas, heads, group;
    bool causal;
    int min_chunk;
  };
  std::vector<Case> cases;
  // C - 1 one-tile requests of l > C tokens: L = ceil((C - 1) l / C) < l, each splits in two:
  // 2 C - 2 slots, the bound's worst case.
  {
    const int c = 132;
    Batch b{std::vector<int64_t>(c - 1, 1), std::vector<int64_t>(c - 1, 10000)};
    cases.push_back({"2C - 2 slots", b, c, 1, 1, false, 1});
  }
  cases.push_back({"one huge KV", {{1}, {INT32_MAX}}, 528, 32, 16, false, 128});
  cases.push_back({"one huge causal prompt, group 128", {{4096}, {4096}}, 132, 1, 128, true, 1});
  {
    Batch b{std::vector<int64_t>(256, 2048), std::vector<int64_t>(256, 0)};
    cases.push_back({"all KV empty", b, 264, 8, 8, true, 128});
  }
  {
    Batch b{std::vector<int64_t>(64, 2048), std::vector<int64_t>(64, 100)};
    cases.push_back({"causal kv << qo: most tiles fully masked", b, 132, 4, 1, true, 1});
  }
  {
    Batch b{std::vector<int64_t>(255, 1), std::vector<int64_t>(255, 1)};
    b.qo.push_back(2048);
    b.kv.push_back(32768);
    cases.push_back({"one giant among tiny", b, 132, 32, 1, true, 1});
    cases.push_back({"one giant among tiny, non-causal", b, 528, 32, 16, false, 1});
  }
  {
    Batch b{std::vector<int64_t>(256, 1), std::vector<int64_t>(256, 32768)};
    cases.push_back({"decode-like, long KV", b, 132, 32, 16, false, 128});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    PrefillScheduleOptions o = bounded_options(c.ctas, c.heads, c.group, c.b.qo, c.causal);
    o.min_chunk_tokens = c.min_chunk;
    const PrefillSchedule s = plan_prefill(c.b.qo, c.b.kv, o);
    expect_valid(c.b.qo, c.b.kv, o, s);
    if (std::string(c.name) == "2C - 2 slots") EXPECT_EQ(s.num_slots, 2 * c.ctas - 2);
  }
}

}  // namespace
}  // namespace flashkv::scheduler
