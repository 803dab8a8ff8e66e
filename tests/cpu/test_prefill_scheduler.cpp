// Tests of the prefill/append scheduler (src/scheduler/prefill_scheduler.h), its tiles and
// coverage: the tile-size heuristic and the tile bound, every query row seeing exactly its visible
// KV once (causal visibility per tile), empty queries, empty KV and fully masked tiles. The other
// subjects: test_prefill_scheduler_balance.cpp (the greedy, determinism, bounds),
// test_prefill_scheduler_split.cpp (KV splitting, workspace fit), test_prefill_scheduler_limits.cpp
// (errors, the serialized byte image, plan time).
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "flashkv/error.h"
#include "prefill_scheduler_test_util.h"
#include "scheduler/prefill_scheduler.h"

namespace flashkv::scheduler {
namespace {

using namespace prefill_test;

TEST(PrefillScheduler, TileSizeHeuristic) {
  const std::vector<int64_t> one{1};
  EXPECT_EQ(choose_query_tile_rows(one, 4), 16);  // decode-like: 4 rows -> 16
  EXPECT_EQ(choose_query_tile_rows(one, 1), 16);
  EXPECT_EQ(choose_query_tile_rows(one, 16), 16);
  EXPECT_EQ(choose_query_tile_rows(one, 17), 32);  // a tile holds a whole token
  EXPECT_EQ(choose_query_tile_rows(one, 128), 128);
  EXPECT_EQ(choose_query_tile_rows(std::vector<int64_t>{1000}, 1), 128);
  EXPECT_EQ(choose_query_tile_rows(std::vector<int64_t>{1000, 1000}, 8), 128);  // capped
  EXPECT_EQ(choose_query_tile_rows(std::vector<int64_t>{4, 4, 4}, 8), 32);      // speculative
  EXPECT_EQ(choose_query_tile_rows(std::vector<int64_t>{4, 4, 4}, 16), 64);
  EXPECT_EQ(choose_query_tile_rows(std::vector<int64_t>{16}, 1), 16);  // >= average: equal fits
  EXPECT_EQ(choose_query_tile_rows(std::vector<int64_t>{17}, 1), 32);
  // The average is over non-empty requests: empty ones do not shrink the tile.
  EXPECT_EQ(choose_query_tile_rows(std::vector<int64_t>{0, 0, 0, 60}, 1), 64);
  EXPECT_EQ(choose_query_tile_rows(std::vector<int64_t>{1, 63}, 2), 64);   // average 32 x 2
  EXPECT_EQ(choose_query_tile_rows(std::vector<int64_t>{1, 64}, 2), 128);  // 32.5 x 2 = 65
  // Nothing to tile: the smallest tile that holds a token.
  EXPECT_EQ(choose_query_tile_rows(std::vector<int64_t>{}, 4), 16);
  EXPECT_EQ(choose_query_tile_rows(std::vector<int64_t>{0, 0}, 40), 64);
  EXPECT_THROW(choose_query_tile_rows(one, 0), Error);
  EXPECT_THROW(choose_query_tile_rows(one, 129), Error);
  EXPECT_THROW(choose_query_tile_rows(std::vector<int64_t>{-1}, 1), Error);
}

TEST(PrefillScheduler, TileBoundIsTightForOneTokenRequests) {
  // N one-token requests make N tiles per head, the bound exactly.
  EXPECT_EQ(max_prefill_tiles(100, 100, 3, 4, 0), 300);
  // 2 requests, 100 tokens, 16 per tile (16 rows, group 1): at most ceil(99/16) + 1 = 8 tiles.
  EXPECT_EQ(max_prefill_tiles(2, 100, 1, 1, 16), 8);
  EXPECT_EQ(max_prefill_tiles(5, 0, 1, 1, 0), 0);
  // tile_rows 0 bounds the heuristic's every choice: with group 5 the smallest tile (16 rows)
  // holds 3 tokens.
  EXPECT_EQ(max_prefill_tiles(1, 300, 1, 5, 0), 100);
  EXPECT_THROW(max_prefill_tiles(1, 1, 1, 32, 16), Error);  // tile smaller than a token
  EXPECT_THROW(max_prefill_tiles(INT_MAX, INT64_MAX / 4, 32, 1, 16), Error);  // overflow
  EXPECT_EQ(max_prefill_work_items(10, 132), 142);
  EXPECT_EQ(max_split_slots(132), 264);
  EXPECT_EQ(max_split_merge_items(264), 132);
}

TEST(PrefillScheduler, CoversEveryRowOnceAndBalances) {
  struct Case {
    const char* name;
    Batch b;
    int ctas, heads, group, tile_rows;
  };
  const std::vector<Case> cases = {
      {"one long prompt", {{300}, {300}}, 8, 2, 4, 0},
      {"append to a cache", {{37, 5, 64}, {1000, 77, 64}}, 12, 3, 2, 0},
      {"ragged, odd sizes", {{113, 1, 239, 7, 0, 50}, {113, 799, 500, 7, 5, 49}}, 7, 2, 3, 16},
      {"kv shorter than qo", {{100, 40}, {30, 0}}, 5, 1, 1, 16},
      {"group 128 (one token a tile)", {{9, 3}, {200, 3}}, 4, 2, 128, 0},
      {"group 5 (3 tokens in 16 rows)", {{31, 2}, {400, 1000}}, 6, 2, 5, 16},
      {"tiny min chunk", {{20, 20}, {60, 90}}, 16, 1, 1, 16},
  };
  for (const Case& c : cases) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(std::string(c.name) + (causal ? ", causal" : ", non-causal"));
      PrefillScheduleOptions o = bounded_options(c.ctas, c.heads, c.group, c.b.qo, causal);
      o.tile_rows = c.tile_rows;
      if (std::string(c.name) == "tiny min chunk") o.min_chunk_tokens = 1;
      const PrefillSchedule s = plan_prefill(c.b.qo, c.b.kv, o);
      expect_valid(c.b.qo, c.b.kv, o, s, /*check_rows=*/true);
    }
  }
}

TEST(PrefillScheduler, CausalSkipsMaskedKv) {
  // qo = kv = 256, one head, tiles of 64 tokens: tile t sees [0, 64 (t + 1)), so the whole
  // batch's visible KV is 64 + 128 + 192 + 256 = 640 (non-causal: 4 x 256 = 1024).
  PrefillScheduleOptions o;
  o.num_ctas = 1;
  o.tile_rows = 64;
  o.causal = true;
  o.disable_split_kv = true;
  o.max_slots = 1;
  o.max_work_items = 16;
  const std::vector<int64_t> qo{256}, kv{256};
  const PrefillSchedule s = plan_prefill(qo, kv, o);
  ASSERT_EQ(s.work.size(), 4u);
  int64_t seen = 0;
  for (const PrefillWorkItem& w : s.work) {
    EXPECT_EQ(w.kv_end, w.q_end) << "a causal tile sees up to its last row's position";
    seen += w.kv_end - w.kv_start;
  }
  EXPECT_EQ(seen, 640);
  // Appending 2 tokens to a 1000-token cache: the tile sees [0, 1000), not just the new tokens'.
  const std::vector<int64_t> qo2{2}, kv2{1000};
  const PrefillSchedule s2 = plan_prefill(qo2, kv2, o);
  ASSERT_EQ(s2.work.size(), 1u);
  EXPECT_EQ(s2.work[0].kv_end, 1000);
}

TEST(PrefillScheduler, EmptyQueriesKvAndFullyMaskedTiles) {
  PrefillScheduleOptions o;
  o.num_ctas = 4;
  o.num_kv_heads = 2;
  o.tile_rows = 16;
  o.causal = true;
  o.max_slots = 8;
  o.max_work_items = 64;
  // Request 0: no queries, no tiles. Request 1: no KV: one empty item per tile and head.
  // Request 2: 40 queries over 8 KV tokens, causal: token i sees [0, i - 31], so the tiles of
  // tokens [0, 16) and [16, 32) see nothing, [32, 40) sees [0, 8).
  const std::vector<int64_t> qo{0, 20, 40}, kv{500, 0, 8};
  const PrefillSchedule s = plan_prefill(qo, kv, o);
  expect_valid(qo, kv, o, s, /*check_rows=*/true);
  int empty = 0;
  for (const PrefillWorkItem& w : s.work) {
    EXPECT_NE(w.request, 0) << "a request with no queries has no tiles";
    if (w.kv_start == w.kv_end) {
      ++empty;
      EXPECT_EQ(w.slot, -1) << "an empty tile writes zeros / -inf straight to the output";
      EXPECT_TRUE(w.request == 1 || (w.request == 2 && w.q_end <= 32));
    }
  }
  EXPECT_EQ(empty, 2 * 2 + 2 * 2);  // (2 tiles of request 1 + 2 masked tiles of 2) x 2 heads
  // All-empty batches plan too.
  const std::vector<int64_t> none{0, 0};
  const PrefillSchedule e = plan_prefill(none, none, o);
  EXPECT_TRUE(e.work.empty());
  EXPECT_EQ(e.cta_work_indptr, std::vector<int>(5, 0));
  const PrefillSchedule z = plan_prefill(std::span<const int64_t>{}, std::span<const int64_t>{}, o);
  EXPECT_TRUE(z.work.empty());
}

}  // namespace
}  // namespace flashkv::scheduler
