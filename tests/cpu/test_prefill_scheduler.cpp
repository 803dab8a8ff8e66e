// Tests of the prefill/append scheduler (src/scheduler/prefill_scheduler.h): every query row sees
// exactly its visible KV once (causal visibility per tile), slots and merges, load balance, the
// tile-size heuristic, workspace bounds, determinism, batch invariance of fixed_split_size,
// errors, the serialized byte image, and plan time.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <climits>
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
#include "flashkv/error.h"
#include "scheduler/prefill_scheduler.h"

namespace flashkv::scheduler {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t sum(std::span<const int64_t> v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// Options whose capacities are exactly the documented dynamic-splitting bounds for this batch's
// size and query tokens (tile_rows 0: whatever the heuristic picks), so a plan that broke the
// bounds would throw.
PrefillScheduleOptions bounded_options(int num_ctas, int num_kv_heads, int group,
                                       std::span<const int64_t> qo_lens, bool causal) {
  PrefillScheduleOptions o;
  o.num_ctas = num_ctas;
  o.num_kv_heads = num_kv_heads;
  o.group = group;
  o.causal = causal;
  o.max_slots = max_prefill_slots(num_ctas);
  const int tiles = max_prefill_tiles(std::max<int>(1, static_cast<int>(qo_lens.size())),
                                      sum(qo_lens), num_kv_heads, group, 0);
  o.max_work_items = max_prefill_work_items(tiles, num_ctas);
  return o;
}

// The KV a row (query token i of request r) sees: [0, row_visible_end). Written from the causal
// definition, independently of the scheduler.
int64_t row_visible_end(int64_t qo_len, int64_t kv_len, int64_t i, bool causal) {
  if (!causal) return kv_len;
  return std::clamp<int64_t>(kv_len - qo_len + i + 1, 0, kv_len);
}

double item_cost(const PrefillScheduleOptions& o, const PrefillWorkItem& w) {
  return o.cost.cost(int64_t{w.q_end - w.q_start} * o.group, w.kv_end - w.kv_start);
}

bool by_tile_then_kv(const PrefillWorkItem& a, const PrefillWorkItem& b) {
  if (a.request != b.request) return a.request < b.request;
  if (a.kv_head != b.kv_head) return a.kv_head < b.kv_head;
  if (a.q_start != b.q_start) return a.q_start < b.q_start;
  return a.kv_start < b.kv_start;
}

// Checks every promise of prefill_scheduler.h for `s` = plan_prefill(qo, kv, o). With
// `check_rows`, also checks each (request, kv_head, query token) row on its own.
void expect_valid(std::span<const int64_t> qo, std::span<const int64_t> kv,
                  const PrefillScheduleOptions& o, const PrefillSchedule& s,
                  bool check_rows = false) {
  const int ctas = o.num_ctas;
  const int heads = o.num_kv_heads;
  const int batch = static_cast<int>(qo.size());
  const int rows = o.tile_rows > 0 ? o.tile_rows : choose_query_tile_rows(qo, o.group);
  ASSERT_EQ(s.tile_rows, rows);
  const int tq = rows / o.group;
  ASSERT_EQ(s.tile_tokens, tq);
  ASSERT_EQ(s.num_ctas, ctas);
  ASSERT_EQ(s.cta_work_indptr.size(), static_cast<size_t>(ctas) + 1);
  ASSERT_EQ(s.cta_cost.size(), static_cast<size_t>(ctas));
  ASSERT_EQ(s.cta_work_indptr[0], 0);
  for (int c = 0; c < ctas; ++c) ASSERT_LE(s.cta_work_indptr[c], s.cta_work_indptr[c + 1]);
  ASSERT_EQ(static_cast<size_t>(s.cta_work_indptr[ctas]), s.work.size());
  EXPECT_LE(static_cast<int64_t>(s.work.size()), o.max_work_items);
  EXPECT_LE(s.num_slots, o.max_slots);

  // The visible end of the tile holding query tokens [q_start, q_end): the max of its rows'.
  auto tile_visible_end = [&](int r, int64_t q_start, int64_t q_end) {
    int64_t e = 0;
    for (int64_t i = q_start; i < q_end; ++i) {
      e = std::max(e, row_visible_end(qo[r], kv[r], i, o.causal));
    }
    return e;
  };

  // Each item is one whole query tile, inside its tile's visible KV, no longer than L_kv.
  for (const PrefillWorkItem& w : s.work) {
    ASSERT_GE(w.request, 0);
    ASSERT_LT(w.request, batch);
    ASSERT_GE(w.kv_head, 0);
    ASSERT_LT(w.kv_head, heads);
    ASSERT_EQ(w.q_start % tq, 0);
    ASSERT_LT(w.q_start, qo[w.request]) << "item for an empty query range";
    ASSERT_EQ(w.q_end, std::min<int64_t>(w.q_start + tq, qo[w.request]));
    ASSERT_LE(0, w.kv_start);
    ASSERT_LE(w.kv_start, w.kv_end);
    ASSERT_LE(w.kv_end - w.kv_start, s.chunk_bound);
    ASSERT_EQ(w.page_base, 0);
  }

  // Per CTA: recorded loads and the LPT balance bound; the items in (request, kv_head, q_start,
  // kv_start) order, so the CTAs sweep the batch's KV together (the L2 order of plan_prefill).
  test::expect_balanced_cta_loads(s, ctas, [&](const auto& w) { return item_cost(o, w); },
                                  /*costliest_first=*/false);
  for (int c = 0; c < ctas; ++c)
    for (int i = s.cta_work_indptr[c] + 1; i < s.cta_work_indptr[c + 1]; ++i)
      ASSERT_TRUE(by_tile_then_kv(s.work[i - 1], s.work[i])) << "CTA " << c << " item " << i;

  // Expected L_kv in the dynamic mode.
  int64_t visible_total = 0;
  for (int r = 0; r < batch; ++r) {
    for (int64_t q = 0; q < qo[r]; q += tq) {
      visible_total += tile_visible_end(r, q, std::min<int64_t>(q + tq, qo[r])) * heads;
    }
  }
  // (Rounded up to split_align: aligned near-equal chunks never exceed it.)
  const int64_t dyn_bound =
      ceil_div(std::max<int64_t>(o.min_chunk_tokens, std::min<int64_t>(INT32_MAX, ceil_div(visible_total, ctas))),
               o.split_align) *
      o.split_align;
  if (o.fixed_split_size == 0 && !o.disable_split_kv) {
    if (s.slot_limited) {
      // Fitted to max_slots: a longer bound, on the alignment, with the chunks in the slots.
      EXPECT_GT(s.chunk_bound, dyn_bound);
      EXPECT_EQ(s.chunk_bound % o.split_align, 0);
    } else {
      EXPECT_EQ(s.chunk_bound, dyn_bound);
    }
  }

  // Tiles: sorted by (request, kv_head, q_start, kv_start), each tile's chunks partition its
  // visible range exactly; every tile of every non-empty request is there.
  std::vector<PrefillWorkItem> items = s.work;
  std::sort(items.begin(), items.end(), by_tile_then_kv);
  std::vector<char> slot_seen(std::max(0, s.num_slots), 0);
  std::vector<char> merge_seen(s.merge.size(), 0);
  size_t i = 0;
  for (int r = 0; r < batch; ++r) {
    for (int h = 0; h < heads; ++h) {
      for (int64_t q = 0; q < qo[r]; q += tq) {
        const int64_t q_end = std::min<int64_t>(q + tq, qo[r]);
        const int64_t vis = tile_visible_end(r, q, q_end);
        size_t end = i;
        int64_t pos = 0;
        while (end < items.size() && items[end].request == r && items[end].kv_head == h &&
               items[end].q_start == q) {
          ASSERT_EQ(items[end].kv_start, pos)
              << "gap or overlap in tile (" << r << ", " << h << ", q " << q << ")";
          pos = items[end].kv_end;
          ++end;
        }
        ASSERT_EQ(pos, vis) << "tile (" << r << ", " << h << ", q " << q
                            << ") does not cover exactly its visible KV";
        const size_t n = end - i;
        ASSERT_GE(n, 1u) << "tile (" << r << ", " << h << ", q " << q << ") has no work item";
        if (vis == 0) {
          ASSERT_EQ(n, 1u);
          ASSERT_EQ(items[i].kv_start, 0);
        }
        if (o.disable_split_kv || vis == 0) {
          ASSERT_EQ(n, 1u);
        } else if (o.fixed_split_size > 0) {
          ASSERT_EQ(static_cast<int64_t>(n), ceil_div(vis, o.fixed_split_size));
          for (size_t k = i; k + 1 < end; ++k) {
            ASSERT_EQ(items[k].kv_end - items[k].kv_start, o.fixed_split_size);
          }
        } else {
          // (s.chunk_bound is dyn_bound, checked above, unless fitted to a short max_slots.)
          ASSERT_EQ(static_cast<int64_t>(n), ceil_div(vis, s.chunk_bound));
          int lo = INT_MAX, hi = 0;
          for (size_t k = i; k < end; ++k) {
            lo = std::min(lo, items[k].kv_end - items[k].kv_start);
            hi = std::max(hi, items[k].kv_end - items[k].kv_start);
          }
          // Near-equal: within one token, or (split_align) one unit, the last chunk ending at vis.
          if (o.split_align == 1) {
            ASSERT_LE(hi - lo, 1) << "chunks of a tile are not near-equal";
          } else {
            int lo_full = INT_MAX;  // the chunks before the last (which ends at vis)
            for (size_t k = i; k + 1 < end; ++k) lo_full = std::min(lo_full, items[k].kv_end - items[k].kv_start);
            for (size_t k = i; k < end; ++k) {
              ASSERT_EQ(items[k].kv_start % o.split_align, 0);
              if (k + 1 < end) ASSERT_LE(items[k].kv_end - items[k].kv_start - lo_full, o.split_align);
            }
          }
        }
        // Write-through when unsplit; else consecutive slots in KV order and one merge item.
        if (n == 1) {
          ASSERT_EQ(items[i].slot, -1);
          ASSERT_EQ(items[i].merge, -1);
        } else {
          const int m = items[i].merge;
          ASSERT_GE(m, 0);
          ASSERT_LT(m, static_cast<int>(s.merge.size()));
          ASSERT_FALSE(merge_seen[m]) << "merge item " << m << " used by two tiles";
          merge_seen[m] = 1;
          const PrefillMergeItem& mi = s.merge[m];
          ASSERT_EQ(mi.request, r);
          ASSERT_EQ(mi.kv_head, h);
          ASSERT_EQ(mi.q_start, q);
          ASSERT_EQ(mi.q_end, q_end);
          ASSERT_EQ(mi.slot_end - mi.slot_begin, static_cast<int>(n));
          for (size_t k = i; k < end; ++k) {
            const int slot = items[k].slot;
            ASSERT_EQ(items[k].merge, m);
            ASSERT_EQ(slot, mi.slot_begin + static_cast<int>(k - i));
            ASSERT_GE(slot, 0);
            ASSERT_LT(slot, s.num_slots);
            ASSERT_FALSE(slot_seen[slot]) << "slot " << slot << " used twice";
            slot_seen[slot] = 1;
          }
        }
        i = end;
      }
    }
  }
  EXPECT_EQ(i, items.size()) << "items outside every tile";
  EXPECT_EQ(std::count(slot_seen.begin(), slot_seen.end(), 1), s.num_slots) << "unused slots";
  EXPECT_EQ(std::count(merge_seen.begin(), merge_seen.end(), 1),
            static_cast<int64_t>(s.merge.size()))
      << "merge items of no split tile";
  for (size_t m = 1; m < s.merge.size(); ++m) {  // documented (request, q_start, kv_head) order
    const PrefillMergeItem &a = s.merge[m - 1], &b = s.merge[m];
    EXPECT_TRUE(a.request < b.request || (a.request == b.request && a.q_start < b.q_start) ||
                (a.request == b.request && a.q_start == b.q_start && a.kv_head < b.kv_head));
  }

  if (!check_rows) return;
  // Rows, one by one: the items whose query range holds token t partition a prefix [0, E) of the
  // KV that contains the row's visible KV, and E is what some row of the same tile sees (so no
  // chunk is KV that no row of its tile sees).
  for (int r = 0; r < batch; ++r) {
    for (int h = 0; h < heads; ++h) {
      for (int64_t t = 0; t < qo[r]; ++t) {
        std::vector<PrefillWorkItem> row;
        for (const PrefillWorkItem& w : items) {
          if (w.request == r && w.kv_head == h && w.q_start <= t && t < w.q_end) row.push_back(w);
        }
        ASSERT_FALSE(row.empty()) << "row (" << r << ", " << h << ", " << t << ") uncovered";
        int64_t pos = 0;
        for (const PrefillWorkItem& w : row) {
          ASSERT_EQ(w.kv_start, pos) << "row (" << r << ", " << h << ", " << t << ")";
          pos = w.kv_end;
        }
        const int64_t own = row_visible_end(qo[r], kv[r], t, o.causal);
        ASSERT_GE(pos, own) << "row (" << r << ", " << h << ", " << t << ") misses visible KV";
        int64_t tile_max = 0;
        for (int64_t u = row.front().q_start; u < row.front().q_end; ++u) {
          tile_max = std::max(tile_max, row_visible_end(qo[r], kv[r], u, o.causal));
        }
        ASSERT_EQ(pos, tile_max) << "row (" << r << ", " << h << ", " << t
                                 << ") is given KV no row of its tile sees";
      }
    }
  }
}

struct Batch {
  std::vector<int64_t> qo, kv;
};

// The random batches of the bounds test: batch 1..256, qo_len 0..2048, kv_len qo_len..32768,
// drawn from a few shapes (uniform; mostly short with some long; decode-like with some prefill).
Batch random_batch(std::mt19937_64& rng) {
  Batch b;
  const size_t batch = 1 + rng() % 256;
  const int shape = static_cast<int>(rng() % 3);
  for (size_t i = 0; i < batch; ++i) {
    int64_t q;
    if (shape == 0) {
      q = static_cast<int64_t>(rng() % 2049);
    } else if (shape == 1) {
      q = rng() % 8 == 0 ? static_cast<int64_t>(rng() % 2049) : static_cast<int64_t>(rng() % 17);
    } else {
      const uint64_t p = rng() % 100;
      q = p < 5    ? 0
          : p < 80 ? 1 + static_cast<int64_t>(rng() % 8)
                   : 2048 - static_cast<int64_t>(rng() % 64);
    }
    const int64_t k = q + static_cast<int64_t>(rng() % static_cast<uint64_t>(32768 - q + 1));
    b.qo.push_back(q);
    b.kv.push_back(k);
  }
  return b;
}

void expect_same(const PrefillSchedule& a, const PrefillSchedule& b) {
  EXPECT_EQ(a.num_ctas, b.num_ctas);
  EXPECT_EQ(a.tile_rows, b.tile_rows);
  EXPECT_EQ(a.num_slots, b.num_slots);
  EXPECT_EQ(a.chunk_bound, b.chunk_bound);
  EXPECT_EQ(a.cta_work_indptr, b.cta_work_indptr);
  EXPECT_EQ(a.cta_cost, b.cta_cost);
  ASSERT_EQ(a.work.size(), b.work.size());
  EXPECT_EQ(0, std::memcmp(a.work.data(), b.work.data(), a.work.size() * sizeof(a.work[0])));
  ASSERT_EQ(a.merge.size(), b.merge.size());
  EXPECT_EQ(0, std::memcmp(a.merge.data(), b.merge.data(), a.merge.size() * sizeof(a.merge[0])));
}

}  // namespace

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
  EXPECT_EQ(max_prefill_slots(132), 264);
  EXPECT_EQ(max_prefill_merge_items(264), 132);
}

TEST(PrefillScheduler, CapacityErrorsSayWhatIsMissing) {
  const std::vector<int64_t> qo{1024}, kv{100000};
  PrefillScheduleOptions o;
  o.num_ctas = 132;
  o.num_kv_heads = 8;
  o.max_slots = 1;
  o.max_work_items = 1 << 20;
  o.fixed_split_size = 4096;  // dynamic splitting would fit the slot (PrefillWorkspaceFit)
  try {
    plan_prefill(qo, kv, o);
    FAIL() << "expected a slot capacity error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_slots = 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("partial-state slots"), std::string::npos) << e.what();
  }
  o.fixed_split_size = 0;
  o.max_slots = 1 << 20;
  o.max_work_items = 10;
  try {
    plan_prefill(qo, kv, o);
    FAIL() << "expected a work-item capacity error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("64 work items"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("max_work_items = 10"), std::string::npos) << e.what();
  }
  // An out-of-capacity plan leaves a reused schedule as it was.
  o.max_work_items = 1 << 20;
  PrefillSchedule s = plan_prefill(qo, kv, o);
  const PrefillSchedule before = s;
  o.max_work_items = 10;
  EXPECT_THROW(plan_prefill(qo, kv, o, &s), Error);
  expect_same(s, before);
}

TEST(PrefillScheduler, RejectsInvalidOptions) {
  const std::vector<int64_t> qo{4}, kv{8};
  auto valid = [] {
    PrefillScheduleOptions o;
    o.num_ctas = 4;
    o.max_slots = 8;
    o.max_work_items = 64;
    return o;
  };
  EXPECT_NO_THROW(plan_prefill(qo, kv, valid()));
  auto rejects = [&](auto&& tweak, std::span<const int64_t> q, std::span<const int64_t> k) {
    PrefillScheduleOptions o = valid();
    tweak(o);
    EXPECT_THROW(plan_prefill(q, k, o), Error);
  };
  rejects([](auto& o) { o.num_ctas = 0; }, qo, kv);
  rejects([](auto& o) { o.num_kv_heads = 0; }, qo, kv);
  rejects([](auto& o) { o.group = 0; }, qo, kv);
  rejects([](auto& o) { o.group = 129; }, qo, kv);
  rejects([](auto& o) { o.tile_rows = 48; }, qo, kv);
  rejects([](auto& o) { o.split_align = 0; }, qo, kv);
  rejects([](auto& o) { o.split_align = 256; }, qo, kv);  // > min_chunk_tokens (128)
  rejects([](auto& o) { o.group = 32, o.tile_rows = 16; }, qo, kv);
  rejects([](auto& o) { o.fixed_split_size = -1; }, qo, kv);
  rejects([](auto& o) { o.fixed_split_size = 16, o.disable_split_kv = true; }, qo, kv);
  rejects([](auto& o) { o.min_chunk_tokens = 0; }, qo, kv);
  rejects([](auto& o) { o.max_slots = -1; }, qo, kv);
  rejects([](auto& o) { o.max_work_items = 0; }, qo, kv);
  rejects([](auto& o) { o.cost.alpha = -1; }, qo, kv);
  rejects([](auto& o) { o.cost.beta = 0; }, qo, kv);
  rejects([](auto&) {}, std::vector<int64_t>{4, 4}, kv);  // sizes differ
  rejects([](auto&) {}, std::vector<int64_t>{-1}, kv);
  rejects([](auto&) {}, qo, std::vector<int64_t>{-1});
  rejects([](auto&) {}, qo, std::vector<int64_t>{int64_t{INT32_MAX} + 1});
  EXPECT_THROW(plan_prefill(qo, kv, valid(), nullptr), Error);
}

TEST(PrefillScheduler, SerializationRoundTrips) {
  std::mt19937_64 rng(5);
  for (int t = 0; t < 4; ++t) {
    const Batch b = random_batch(rng);
    const PrefillScheduleOptions o = bounded_options(132, 4, 8, b.qo, t % 2 == 0);
    const PrefillSchedule s = plan_prefill(b.qo, b.kv, o);
    const PrefillPlanLayout layout =
        prefill_plan_layout(o.num_ctas, o.max_work_items, max_prefill_merge_items(o.max_slots));
    std::vector<std::byte> image(layout.bytes, std::byte{0xAB});
    const size_t used = serialize_prefill_schedule(s, layout, image.data());
    ASSERT_LE(used, layout.bytes);
    EXPECT_EQ(layout.cta_work_indptr % 16, 0u);
    EXPECT_EQ(layout.work % 16, 0u);

    PrefillPlanHeader h;
    std::memcpy(&h, image.data() + layout.header, sizeof(h));
    EXPECT_EQ(h.num_work_items, static_cast<int>(s.work.size()));
    EXPECT_EQ(h.num_merge_items, static_cast<int>(s.merge.size()));
    EXPECT_EQ(h.tile_rows, s.tile_rows);
    EXPECT_EQ(h.merge_offset % 16, 0);
    EXPECT_EQ(used, h.merge_offset + s.merge.size() * sizeof(PrefillMergeItem));
    std::vector<int> indptr(s.cta_work_indptr.size());
    std::memcpy(indptr.data(), image.data() + layout.cta_work_indptr, indptr.size() * sizeof(int));
    EXPECT_EQ(indptr, s.cta_work_indptr);
    std::vector<PrefillWorkItem> work(static_cast<size_t>(h.num_work_items));
    std::memcpy(work.data(), image.data() + layout.work, work.size() * sizeof(PrefillWorkItem));
    EXPECT_EQ(0, std::memcmp(work.data(), s.work.data(), work.size() * sizeof(PrefillWorkItem)));
    std::vector<PrefillMergeItem> merge(static_cast<size_t>(h.num_merge_items));
    std::memcpy(merge.data(), image.data() + h.merge_offset,
                merge.size() * sizeof(PrefillMergeItem));
    EXPECT_EQ(0,
              std::memcmp(merge.data(), s.merge.data(), merge.size() * sizeof(PrefillMergeItem)));
  }
  // A schedule larger than the layout is refused.
  const std::vector<int64_t> qo{100}, kv{100};
  PrefillScheduleOptions o;
  o.num_ctas = 2;
  o.tile_rows = 16;
  o.max_slots = 8;
  o.max_work_items = 64;
  const PrefillSchedule s = plan_prefill(qo, kv, o);
  const PrefillPlanLayout small = prefill_plan_layout(2, 1, 0);
  std::vector<std::byte> image(small.bytes);
  EXPECT_THROW(serialize_prefill_schedule(s, small, image.data()), Error);
  const PrefillPlanLayout other = prefill_plan_layout(3, 64, 4);
  std::vector<std::byte> image2(other.bytes);
  EXPECT_THROW(serialize_prefill_schedule(s, other, image2.data()), Error);
}

// Plan time: printed (machine-dependent), asserted only to stay far below a second.
TEST(PrefillScheduler, PlanTimeMicroBenchmark) {
  struct Case {
    const char* name;
    Batch b;
    bool causal;
  };
  const std::vector<Case> cases = {
      {"batch 16 x 1024 causal",
       {std::vector<int64_t>(16, 1024), std::vector<int64_t>(16, 1024)},
       true},
      {"batch 64 x qo 4 kv 4096",
       {std::vector<int64_t>(64, 4), std::vector<int64_t>(64, 4096)},
       false},
  };
  for (const Case& c : cases) {
    const PrefillScheduleOptions o = bounded_options(264, 8, 4, c.b.qo, c.causal);
    PrefillSchedule s;
    double best_us = 1e300;
    for (int rep = 0; rep < 20; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      plan_prefill(c.b.qo, c.b.kv, o, &s);
      const auto t1 = std::chrono::steady_clock::now();
      best_us = std::min(best_us, std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    expect_valid(c.b.qo, c.b.kv, o, s);
    std::printf(
        "[ PrefillScheduler ] %s, 8 KV heads, group 4, 264 CTAs: tile %d rows, %zu work items, %zu "
        "merges; plan %.1f us (best of 20)\n",
        c.name, s.tile_rows, s.work.size(), s.merge.size(), best_us);
    EXPECT_LT(best_us, 1e6);
  }
}

}  // namespace flashkv::scheduler
