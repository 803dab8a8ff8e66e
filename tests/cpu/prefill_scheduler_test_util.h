// Helpers of the prefill scheduler tests (test_prefill_scheduler*.cpp): options at the documented
// capacity bounds, the validity checks of every promise of prefill_scheduler.h, random batches,
// schedule equality.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "common/schedule_checks.h"
#include "scheduler/prefill_scheduler.h"

namespace flashkv::scheduler::prefill_test {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int64_t sum(std::span<const int64_t> v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// Options whose capacities are exactly the documented dynamic-splitting bounds for this batch's
// size and query tokens (tile_rows 0: whatever the heuristic picks), so a plan that broke the
// bounds would throw.
inline PrefillScheduleOptions bounded_options(int num_ctas, int num_kv_heads, int group,
                                              std::span<const int64_t> qo_lens, bool causal) {
  PrefillScheduleOptions o;
  o.num_ctas = num_ctas;
  o.num_kv_heads = num_kv_heads;
  o.group = group;
  o.causal = causal;
  o.max_slots = max_split_slots(num_ctas);
  const int tiles = max_prefill_tiles(std::max<int>(1, static_cast<int>(qo_lens.size())),
                                      sum(qo_lens), num_kv_heads, group, 0);
  o.max_work_items = max_prefill_work_items(tiles, num_ctas);
  return o;
}

// The KV a row (query token i of request r) sees: [0, row_visible_end). Written from the causal
// definition, independently of the scheduler.
inline int64_t row_visible_end(int64_t qo_len, int64_t kv_len, int64_t i, bool causal) {
  if (!causal) return kv_len;
  return std::clamp<int64_t>(kv_len - qo_len + i + 1, 0, kv_len);
}

inline double item_cost(const PrefillScheduleOptions& o, const PrefillWorkItem& w) {
  return o.cost.cost(int64_t{w.q_end - w.q_start} * o.group, w.kv_end - w.kv_start);
}

inline bool by_tile_then_kv(const PrefillWorkItem& a, const PrefillWorkItem& b) {
  if (a.request != b.request) return a.request < b.request;
  if (a.kv_head != b.kv_head) return a.kv_head < b.kv_head;
  if (a.q_start != b.q_start) return a.q_start < b.q_start;
  return a.kv_start < b.kv_start;
}

// Checks every promise of prefill_scheduler.h for `s` = plan_prefill(qo, kv, o). With
// `check_rows`, also checks each (request, kv_head, query token) row on its own.
inline void expect_valid(std::span<const int64_t> qo, std::span<const int64_t> kv,
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
  // kv_start) order, so the CTAs sweep the batch's KV together (the L2 order of plan_prefill);
  // head-major, by KV head and within a head costliest first.
  test::expect_balanced_cta_loads(
      s, ctas, [&](const auto& w) { return item_cost(o, w); },
      /*costliest_first=*/false);
  for (int c = 0; c < ctas; ++c)
    for (int i = s.cta_work_indptr[c] + 1; i < s.cta_work_indptr[c + 1]; ++i) {
      const PrefillWorkItem &a = s.work[i - 1], &b = s.work[i];
      if (o.head_major) {
        ASSERT_TRUE(a.kv_head < b.kv_head ||
                    (a.kv_head == b.kv_head && item_cost(o, a) >= item_cost(o, b)))
            << "CTA " << c << " item " << i;
      } else {
        ASSERT_TRUE(by_tile_then_kv(a, b)) << "CTA " << c << " item " << i;
      }
    }

  // Expected L_kv in the dynamic mode.
  int64_t visible_total = 0;
  for (int r = 0; r < batch; ++r) {
    for (int64_t q = 0; q < qo[r]; q += tq) {
      visible_total += tile_visible_end(r, q, std::min<int64_t>(q + tq, qo[r])) * heads;
    }
  }
  // (Rounded up to split_align: aligned near-equal chunks never exceed it.)
  const int64_t dyn_bound =
      ceil_div(std::max<int64_t>(o.min_chunk_tokens,
                                 std::min<int64_t>(INT32_MAX, ceil_div(visible_total, ctas))),
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
            for (size_t k = i; k + 1 < end; ++k)
              lo_full = std::min(lo_full, items[k].kv_end - items[k].kv_start);
            for (size_t k = i; k < end; ++k) {
              ASSERT_EQ(items[k].kv_start % o.split_align, 0);
              if (k + 1 < end)
                ASSERT_LE(items[k].kv_end - items[k].kv_start - lo_full, o.split_align);
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
inline Batch random_batch(std::mt19937_64& rng) {
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

inline void expect_same(const PrefillSchedule& a, const PrefillSchedule& b) {
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

}  // namespace flashkv::scheduler::prefill_test
