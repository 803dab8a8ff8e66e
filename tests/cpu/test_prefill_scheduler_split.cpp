// Tests of the prefill scheduler (src/scheduler/prefill_scheduler.h), its KV splitting: splits only
// where tiles are few, split_align, batch invariance of fixed_split_size, disable_split_kv,
// dynamic splitting fitted to a small workspace, and sliding windows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "flashkv/error.h"
#include "prefill_scheduler_test_util.h"
#include "scheduler/prefill_scheduler.h"

namespace flashkv::scheduler {
namespace {

using namespace prefill_test;

TEST(PrefillScheduler, SplitsOnlyWhereTilesAreFew) {
  // A long causal prompt has many tiles (8192 tokens / 32 a tile x 8 heads = 2048 on 132 CTAs):
  // L_kv = T / C exceeds every tile's KV, so nothing splits and the greedy alone balances.
  const std::vector<int64_t> qo{8192}, kv{8192};
  PrefillScheduleOptions o = bounded_options(132, 8, 4, qo, true);
  const PrefillSchedule s = plan_prefill(qo, kv, o);
  expect_valid(qo, kv, o, s);
  EXPECT_EQ(s.num_slots, 0);
  // Appending 64 tokens to a 100000-token cache: 2 tiles x 8 heads on 132 CTAs must split.
  const std::vector<int64_t> qo2{64}, kv2{100000};
  o = bounded_options(132, 8, 4, qo2, true);
  const PrefillSchedule a = plan_prefill(qo2, kv2, o);
  expect_valid(qo2, kv2, o, a);
  EXPECT_EQ(a.merge.size(), 16u);
  EXPECT_LT(a.num_slots, 2 * 132);
  for (const PrefillSchedule* p : {&s, &a}) {
    double max_load = 0, total = 0;
    for (double c : p->cta_cost) {
      max_load = std::max(max_load, c);
      total += c;
    }
    std::printf(
        "[ PrefillScheduler ] qo %lld kv %lld causal x 8 heads on 132 CTAs: %zu items, %d slots, "
        "L_kv %lld, max/mean load %.3f\n",
        static_cast<long long>(p == &s ? qo[0] : qo2[0]),
        static_cast<long long>(p == &s ? kv[0] : kv2[0]), p->work.size(), p->num_slots,
        static_cast<long long>(p->chunk_bound), max_load / (total / 132));
  }
}

// split_align (the wgmma kernel's KV tile, for its TMA loads): dynamic chunks start on multiples
// of it, no chunk is longer than chunk_bound, and the bounds and coverage still hold.
TEST(PrefillScheduler, SplitAlignCutsChunksOnTiles) {
  std::mt19937_64 rng(77);
  for (int t = 0; t < 40; ++t) {
    const Batch b = random_batch(rng);
    const bool causal = rng() % 2 == 0;
    PrefillScheduleOptions o = bounded_options(132, 8, 4, b.qo, causal);
    o.tile_rows = 128;
    o.split_align = t % 2 == 0 ? 128 : 32;
    const PrefillSchedule s = plan_prefill(b.qo, b.kv, o);
    expect_valid(b.qo, b.kv, o, s);
    for (const PrefillWorkItem& w : s.work) {
      EXPECT_EQ(w.kv_start % o.split_align, 0) << "kv_start " << w.kv_start;
      EXPECT_LE(w.kv_end - w.kv_start, s.chunk_bound);
    }
    EXPECT_EQ(s.chunk_bound % o.split_align, 0);
  }
  // The appended-to long cache of SplitsOnlyWhereTilesAreFew, cut on 128-token tiles.
  const std::vector<int64_t> qo{64}, kv{100000};
  PrefillScheduleOptions o = bounded_options(132, 8, 4, qo, true);
  o.split_align = 128;
  const PrefillSchedule a = plan_prefill(qo, kv, o);
  expect_valid(qo, kv, o, a);
  EXPECT_EQ(a.merge.size(), 16u);
  for (const PrefillWorkItem& w : a.work) EXPECT_EQ(w.kv_start % 128, 0);
}

// window_left: each tile's items cover exactly [begin, visible end) in KV order, begin its first
// row's window start rounded down to split_align, so every row's keys are covered once and the
// keys left of every window are not scheduled; the capacity bounds still hold.
TEST(PrefillScheduler, SlidingWindowSchedulesOnlyVisibleKeys) {
  std::mt19937_64 rng(91);
  for (int t = 0; t < 60; ++t) {
    const Batch b = random_batch(rng);
    const bool causal = rng() % 3 != 0;
    PrefillScheduleOptions o = bounded_options(132, 2, 4, b.qo, causal);
    o.tile_rows = t % 2 ? 128 : 0;
    o.split_align = t % 3 == 0 ? 128 : 1;
    o.window_left = static_cast<int>(rng() % 300);
    SCOPED_TRACE("case " + std::to_string(t) + " window " + std::to_string(o.window_left));
    const PrefillSchedule s = plan_prefill(b.qo, b.kv, o);
    std::vector<PrefillWorkItem> items = s.work;
    std::sort(items.begin(), items.end(), by_tile_then_kv);
    for (size_t i = 0; i < items.size();) {
      const PrefillWorkItem& f = items[i];
      const int64_t qo = b.qo[f.request], kv = b.kv[f.request];
      const int64_t end = row_visible_end(qo, kv, f.q_end - 1, causal);
      const int64_t want = std::clamp<int64_t>(kv - qo + f.q_start - o.window_left, 0, end) /
                           o.split_align * o.split_align;
      EXPECT_EQ(f.kv_start, want) << "request " << f.request << " q_start " << f.q_start;
      EXPECT_EQ(f.kv_start % o.split_align, 0);
      int64_t at = f.kv_start;
      size_t j = i;
      for (; j < items.size() && items[j].request == f.request && items[j].kv_head == f.kv_head &&
             items[j].q_start == f.q_start;
           ++j) {
        EXPECT_EQ(items[j].kv_start, at) << "chunks are contiguous";
        at = items[j].kv_end;
      }
      EXPECT_EQ(at, end) << "the tile's chunks end at its visible end";
      // Every row of the tile sees keys inside [kv_start, end).
      for (int64_t q = f.q_start; q < f.q_end; ++q)
        EXPECT_LE(f.kv_start, std::max<int64_t>(0, std::min(end, kv - qo + q - o.window_left)));
      i = j;
    }
  }
  // A 4096 window over a 32k causal prompt (GQA, 128-row tiles on 132 CTAs): the scheduled keys
  // are about the window's, not the causal prompt's.
  const std::vector<int64_t> qo{32768}, kv{32768};
  PrefillScheduleOptions o = bounded_options(132, 8, 4, qo, true);
  o.tile_rows = 128;
  o.split_align = 128;
  const PrefillSchedule full = plan_prefill(qo, kv, o);
  o.window_left = 4096;
  const PrefillSchedule win = plan_prefill(qo, kv, o);
  int64_t keys_full = 0, keys_win = 0;
  for (const PrefillWorkItem& w : full.work) keys_full += w.kv_end - w.kv_start;
  for (const PrefillWorkItem& w : win.work) keys_win += w.kv_end - w.kv_start;
  EXPECT_LT(static_cast<double>(keys_win) / static_cast<double>(keys_full), 0.27);
  EXPECT_THROW(
      {
        o.window_left = -2;
        plan_prefill(qo, kv, o);
      },
      Error);
}

TEST(PrefillScheduler, FixedSplitSizeIsBatchInvariant) {
  // The same request's items (tiles and chunks, heads included) do not depend on its neighbours
  // when tile_rows and fixed_split_size are fixed.
  const int64_t q0 = 300, k0 = 5000;
  auto items_of_first = [&](const std::vector<int64_t>& qo, const std::vector<int64_t>& kv,
                            bool causal) {
    PrefillScheduleOptions o;
    o.num_ctas = 132;
    o.num_kv_heads = 2;
    o.group = 4;
    o.tile_rows = 64;
    o.causal = causal;
    o.fixed_split_size = 1024;
    o.max_slots = 1 << 20;
    o.max_work_items = 1 << 20;
    const PrefillSchedule s = plan_prefill(qo, kv, o);
    expect_valid(qo, kv, o, s);
    std::vector<PrefillWorkItem> mine;
    for (const PrefillWorkItem& w : s.work) {
      if (w.request == 0) mine.push_back(w);
    }
    std::sort(mine.begin(), mine.end(), by_tile_then_kv);
    std::vector<std::vector<int>> ranges;  // (kv_head, q_start, q_end, kv_start, kv_end)
    for (const PrefillWorkItem& w : mine) {
      ranges.push_back({w.kv_head, w.q_start, w.q_end, w.kv_start, w.kv_end});
    }
    return ranges;
  };
  std::mt19937_64 rng(3);
  for (bool causal : {false, true}) {
    const auto alone = items_of_first({q0}, {k0}, causal);
    if (!causal) {  // 2 heads x 19 tiles of 16 tokens x 5 chunks of <= 1024 of the 5000
      EXPECT_EQ(alone.size(), static_cast<size_t>(2 * ceil_div(q0, 16) * ceil_div(k0, 1024)));
    }
    for (int t = 0; t < 5; ++t) {
      std::vector<int64_t> qo{q0}, kv{k0};
      const size_t extra = 1 + rng() % 64;
      for (size_t i = 0; i < extra; ++i) {
        const int64_t q = static_cast<int64_t>(rng() % 2000);
        qo.push_back(q);
        kv.push_back(q + static_cast<int64_t>(rng() % 30000));
      }
      EXPECT_EQ(items_of_first(qo, kv, causal), alone);
    }
  }
}

TEST(PrefillScheduler, DisableSplitKvGivesOneItemPerTile) {
  std::mt19937_64 rng(11);
  for (int t = 0; t < 4; ++t) {
    const Batch b = random_batch(rng);
    PrefillScheduleOptions o = bounded_options(132, 2, 2, b.qo, t % 2 == 1);
    o.disable_split_kv = true;
    const PrefillSchedule s = plan_prefill(b.qo, b.kv, o);
    expect_valid(b.qo, b.kv, o, s);
    int64_t tiles = 0;
    for (int64_t q : b.qo) tiles += ceil_div(q, s.tile_tokens) * 2;
    EXPECT_EQ(static_cast<int64_t>(s.work.size()), tiles);
    EXPECT_EQ(s.num_slots, 0);
    EXPECT_TRUE(s.merge.empty());
  }
}

// A workspace with fewer partial-state slots than the 2 x #CTA bound (the caller's fixed buffer):
// dynamic splitting fits them with the shortest chunk bound that does (on split_align), never
// exceeds them, and is the unconstrained schedule wherever that fits.
TEST(PrefillScheduler, DynamicSplittingFitsASmallWorkspace) {
  std::mt19937_64 rng(515);
  int limited = 0;
  for (int t = 0; t < 40; ++t) {
    // Few query tiles over long KV: the batches that split.
    Batch b;
    for (size_t i = 0, n = 1 + rng() % 6; i < n; ++i) {
      b.qo.push_back(1 + static_cast<int64_t>(rng() % 300));
      b.kv.push_back(b.qo.back() + static_cast<int64_t>(rng() % 60000));
    }
    const int heads = 1 + static_cast<int>(rng() % 8);
    const int group = 1 + static_cast<int>(rng() % 8);
    const int ctas = 132 * (1 + static_cast<int>(rng() % 2));
    const bool causal = rng() % 2 == 0;
    PrefillScheduleOptions o = bounded_options(ctas, heads, group, b.qo, causal);
    o.split_align = t % 2 == 0 ? 1 : 64;
    const PrefillSchedule full = plan_prefill(b.qo, b.kv, o);
    for (int cap : {0, 1, 7, full.num_slots / 3, full.num_slots}) {
      SCOPED_TRACE("case " + std::to_string(t) + ", max_slots " + std::to_string(cap) + " of " +
                   std::to_string(full.num_slots));
      PrefillScheduleOptions small = o;
      small.max_slots = std::max(cap, 0);
      const PrefillSchedule s = plan_prefill(b.qo, b.kv, small);
      expect_valid(b.qo, b.kv, small, s);
      EXPECT_LE(s.num_slots, small.max_slots);
      EXPECT_EQ(s.slot_limited, full.num_slots > small.max_slots);
      if (!s.slot_limited) {
        expect_same(s, full);
        continue;
      }
      ++limited;
      EXPECT_GT(s.chunk_bound, full.chunk_bound);
      if (small.max_slots == 0) EXPECT_EQ(s.num_slots, 0);
      // The shortest bound that fits: one alignment step less needs more slots.
      PrefillScheduleOptions tighter = small;
      tighter.max_slots = 1 << 30;
      tighter.min_chunk_tokens = static_cast<int>(s.chunk_bound - o.split_align);
      if (tighter.min_chunk_tokens >= std::max<int>(o.split_align, full.chunk_bound)) {
        EXPECT_GT(plan_prefill(b.qo, b.kv, tighter).num_slots, small.max_slots);
      }
    }
  }
  EXPECT_GT(limited, 20) << "the cases must exercise the fitting";
}

}  // namespace
}  // namespace flashkv::scheduler
