// Helpers of the decode scheduler tests (test_decode_scheduler*.cpp): options at the documented
// capacity bounds, the validity checks of every promise of decode_scheduler.h, the spec's greedy
// written plainly, random batches.
#pragma once

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
#include <tuple>
#include <utility>
#include <vector>

#include "common/schedule_checks.h"
#include "common/test_util.h"
#include "flashkv/error.h"
#include "scheduler/decode_scheduler.h"

namespace flashkv::scheduler::sched_test {

// Options whose capacities are exactly the documented dynamic-splitting bounds, so a plan that
// broke the bounds would throw.
inline DecodeScheduleOptions bounded_options(int num_ctas, int num_kv_heads, size_t batch) {
  DecodeScheduleOptions o;
  o.num_ctas = num_ctas;
  o.num_kv_heads = num_kv_heads;
  o.max_slots = max_split_slots(num_ctas);
  o.max_work_items =
      max_decode_work_items(std::max<int>(1, static_cast<int>(batch)), num_kv_heads, num_ctas);
  return o;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What dynamic splitting must use as L_kv: max(min_chunk_tokens, ceil(T / C)).
inline int64_t expected_dynamic_bound(std::span<const int64_t> lens,
                                      const DecodeScheduleOptions& o) {
  int64_t total = 0;
  for (int64_t l : lens) total += l * o.num_kv_heads;
  return std::max<int64_t>(o.min_chunk_tokens,
                           std::min<int64_t>(INT32_MAX, ceil_div(total, o.num_ctas)));
}

inline double item_cost(const DecodeScheduleOptions& o, const DecodeWorkItem& w) {
  return o.cost.cost(1, w.kv_end - w.kv_start);
}

inline bool block_mode(const DecodeScheduleOptions& o) {
  return o.block_units && o.num_kv_heads > 1 && o.num_ctas % o.num_kv_heads == 0;
}

// Checks every promise of decode_scheduler.h for `s` = plan_decode(lens, o). The per-CTA checks
// run on the items the CTAs run: expand_to_ctas (expand_work_item, what the kernel derives).
inline void expect_valid(std::span<const int64_t> lens, const DecodeScheduleOptions& o,
                         const DecodeSchedule& s) {
  const int ctas = o.num_ctas;
  const int heads = o.num_kv_heads;
  const int batch = static_cast<int>(lens.size());
  ASSERT_EQ(s.num_ctas, ctas);
  // Units: blocks of num_kv_heads CTAs where they divide the grid (and block_units), else CTAs.
  const int per_unit = block_mode(o) ? heads : 1;
  ASSERT_EQ(s.ctas_per_unit, per_unit);
  ASSERT_EQ(s.num_units, ctas / per_unit);
  ASSERT_EQ(s.unit_work_indptr.size(), static_cast<size_t>(s.num_units) + 1);
  ASSERT_EQ(s.unit_work_indptr[0], 0);
  for (int u = 0; u < s.num_units; ++u) ASSERT_LE(s.unit_work_indptr[u], s.unit_work_indptr[u + 1]);
  ASSERT_EQ(s.unit_work_indptr[s.num_units], s.num_work_items);
  ASSERT_EQ(s.stored_work().size(), static_cast<size_t>(s.num_work_items));
  if (s.work_out != nullptr) ASSERT_TRUE(s.work.empty());
  EXPECT_LE(s.num_work_items, o.max_work_items);
  EXPECT_LE(s.num_slots, o.max_slots);
  // A block's items are head 0's (the templates its CTAs expand).
  if (per_unit > 1) {
    for (const DecodeWorkItem& w : s.stored_work()) ASSERT_EQ(w.kv_head, 0);
  }

  const DecodeSchedule e = expand_to_ctas(s);
  ASSERT_EQ(e.ctas_per_unit, 1);
  ASSERT_EQ(e.num_units, ctas);
  ASSERT_EQ(e.unit_work_indptr.size(), static_cast<size_t>(ctas) + 1);
  ASSERT_EQ(static_cast<int64_t>(e.work.size()), s.num_cta_work_items());
  ASSERT_EQ(e.unit_work_indptr[ctas], static_cast<int>(e.work.size()));
  for (int c = 0; c < ctas; ++c) {
    ASSERT_EQ(e.unit_work_indptr[c + 1] - e.unit_work_indptr[c], cta_work_count(s, c));
  }
  // CTAs of one unit run the same chunks, head h on the unit's CTA h.
  for (int c = 0; c < ctas; ++c) {
    for (int i = e.unit_work_indptr[c]; i < e.unit_work_indptr[c + 1]; ++i) {
      ASSERT_EQ(e.work[i].kv_head % per_unit, c % per_unit);
    }
  }
  ASSERT_EQ(s.cta_cost.size(), static_cast<size_t>(ctas));
  for (int c = 0; c < ctas; ++c) {
    ASSERT_EQ(s.cta_cost[c], s.cta_cost[c - c % per_unit]) << "CTAs of a unit have one load";
  }

  // Each item is inside its request, no longer than L_kv, and empty only for an empty request.
  for (const DecodeWorkItem& w : e.work) {
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
  test::expect_balanced_cta_loads<DecodeWorkItem>(
      e.unit_work_indptr, e.work, e.cta_cost, ctas,
      [&](const DecodeWorkItem& w) { return item_cost(o, w); });

  // Coverage: sorted by (request, kv_head, kv_start), each tile's chunks tile [0, l) exactly.
  std::vector<DecodeWorkItem> items = e.work;
  std::sort(items.begin(), items.end(), [](const DecodeWorkItem& a, const DecodeWorkItem& b) {
    if (a.request != b.request) return a.request < b.request;
    if (a.kv_head != b.kv_head) return a.kv_head < b.kv_head;
    return a.kv_start < b.kv_start;
  });
  // Dynamic splitting cuts at L_kv, or with balance_chunk_bound at a larger bound (so the
  // workspace bounds still hold) whose greedy makespan is no larger than L_kv's.
  const bool dynamic = o.fixed_split_size == 0 && !o.disable_split_kv;
  const int64_t dyn_bound = dynamic ? s.chunk_bound : expected_dynamic_bound(lens, o);
  // A schedule fitted to a short max_slots (slot_limited) takes a longer bound than either.
  if (dynamic && !o.balance_chunk_bound && !s.slot_limited) {
    EXPECT_EQ(s.chunk_bound, expected_dynamic_bound(lens, o));
  } else if (dynamic) {
    EXPECT_GE(s.chunk_bound, expected_dynamic_bound(lens, o));
  }
  // Neither balancing step makes the makespan worse: not against the plain rule (L_kv, the
  // plain greedy), and tail balancing not against its own bound's plain greedy.
  const double mine = *std::max_element(s.cta_cost.begin(), s.cta_cost.end());
  if (dynamic && (o.balance_chunk_bound || o.balance_tail) && !s.slot_limited) {
    DecodeScheduleOptions plain = o;
    plain.balance_chunk_bound = false;
    plain.balance_tail = false;
    plain.work_out = nullptr;
    const DecodeSchedule p = plan_decode(lens, plain);
    const double theirs = *std::max_element(p.cta_cost.begin(), p.cta_cost.end());
    EXPECT_LE(mine, theirs) << "balancing made the makespan worse";
  }
  if (dynamic && o.balance_tail) {
    DecodeScheduleOptions no_tail = o;
    no_tail.balance_tail = false;
    no_tail.work_out = nullptr;
    const DecodeSchedule p = plan_decode(lens, no_tail);
    EXPECT_EQ(p.chunk_bound, s.chunk_bound);
    const double theirs = *std::max_element(p.cta_cost.begin(), p.cta_cost.end());
    EXPECT_LE(mine, theirs) << "tail balancing made the makespan worse";
  }
  // Slots (decode_plan.cuh): split request r owns [base_r, base_r + n * heads), the requests'
  // ranges one after another; chunk k of head h writes base_r + k * heads + h, and the merge
  // item of (r, h) says so: slot_begin base_r + h, num_slots n, slot_stride heads.
  std::vector<char> slot_seen(std::max(0, s.num_slots), 0);
  size_t i = 0, m = 0;
  int next_base = 0;
  for (int r = 0; r < batch; ++r) {
    const int64_t l = lens[r];
    int request_chunks = -1;
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
      if (h == 0) request_chunks = static_cast<int>(n);
      ASSERT_EQ(static_cast<int>(n), request_chunks) << "the heads of request " << r << " differ";
      // Chunking by mode.
      if (o.disable_split_kv || l == 0) {
        ASSERT_EQ(n, 1u);
      } else if (o.fixed_split_size > 0) {
        ASSERT_EQ(static_cast<int64_t>(n), ceil_div(l, o.fixed_split_size));
        for (size_t k = i; k + 1 < end; ++k)
          ASSERT_EQ(items[k].kv_end - items[k].kv_start, o.fixed_split_size);
      } else if (o.balance_tail) {
        // The plain cut's near-equal chunks, some of them (a KV suffix) possibly cut further
        // into pieces of >= min_chunk_tokens (each still <= chunk_bound: checked above).
        const int64_t n0 = ceil_div(l, dyn_bound);
        ASSERT_GE(static_cast<int64_t>(n), n0);
        for (size_t k = i; k < end; ++k) {
          ASSERT_GE(items[k].kv_end - items[k].kv_start,
                    std::min<int64_t>(l / n0, o.min_chunk_tokens))
              << "short chunk in tile (" << r << ", " << h << ")";
        }
      } else {
        ASSERT_EQ(static_cast<int64_t>(n), ceil_div(l, dyn_bound));
        int lo = INT_MAX, hi = 0;
        for (size_t k = i; k < end; ++k) {
          lo = std::min(lo, items[k].kv_end - items[k].kv_start);
          hi = std::max(hi, items[k].kv_end - items[k].kv_start);
        }
        ASSERT_LE(hi - lo, 1) << "chunks of tile (" << r << ", " << h << ") are not near-equal";
      }
      // Slots: write-through when unsplit; else the request's slots and a merge item.
      if (n == 1) {
        ASSERT_EQ(items[i].slot, -1);
        ASSERT_EQ(items[i].merge, -1);
      } else {
        ASSERT_LT(m, s.merge.size()) << "missing merge item for (" << r << ", " << h << ")";
        const DecodeMergeItem& mi = s.merge[m++];
        ASSERT_EQ(mi.request, r);
        ASSERT_EQ(mi.kv_head, h);
        ASSERT_EQ(mi.slot_begin, next_base + h);
        ASSERT_EQ(mi.num_slots, static_cast<int>(n));
        ASSERT_EQ(mi.slot_stride, heads);
        for (size_t k = i; k < end; ++k) {
          const int slot = items[k].slot;
          ASSERT_EQ(slot, mi.slot_begin + static_cast<int>(k - i) * mi.slot_stride);
          ASSERT_EQ(items[k].merge, static_cast<int>(m - 1)) << "item names another merge item";
          ASSERT_GE(slot, 0);
          ASSERT_LT(slot, s.num_slots);
          ASSERT_FALSE(slot_seen[slot]) << "slot " << slot << " used twice";
          slot_seen[slot] = 1;
        }
      }
      i = end;
    }
    if (request_chunks > 1) next_base += request_chunks * heads;
  }
  EXPECT_EQ(i, items.size());
  EXPECT_EQ(m, s.merge.size()) << "merge items for unsplit tiles, or out of (request, head) order";
  EXPECT_EQ(next_base, s.num_slots);
  EXPECT_EQ(std::count(slot_seen.begin(), slot_seen.end(), 1), s.num_slots) << "unused slots";
}

inline std::vector<int64_t> random_lens(std::mt19937_64& rng, size_t batch, int64_t max_len) {
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

inline void expect_same(const DecodeSchedule& a, const DecodeSchedule& b) {
  EXPECT_EQ(a.num_ctas, b.num_ctas);
  EXPECT_EQ(a.ctas_per_unit, b.ctas_per_unit);
  EXPECT_EQ(a.num_units, b.num_units);
  EXPECT_EQ(a.num_slots, b.num_slots);
  EXPECT_EQ(a.chunk_bound, b.chunk_bound);
  EXPECT_EQ(a.unit_work_indptr, b.unit_work_indptr);
  EXPECT_EQ(a.cta_cost, b.cta_cost);
  ASSERT_EQ(a.num_work_items, b.num_work_items);
  ASSERT_EQ(a.merge.size(), b.merge.size());
  // Both structs are packed ints (static_assert in decode_plan_serialize.cpp): bytes compare.
  EXPECT_EQ(
      0, std::memcmp(a.stored_work().data(), b.stored_work().data(), a.stored_work().size_bytes()));
  EXPECT_EQ(0,
            std::memcmp(a.merge.data(), b.merge.data(), a.merge.size() * sizeof(DecodeMergeItem)));
}

// The spec's greedy, written plainly: chunks sorted by (cost desc, request, kv_start, kv_head),
// each popped onto the least-loaded unit of a std::priority_queue of (load, unit), then grouped by
// CTA in assignment order. Units are CTAs (unit_size 1), or for block mode aligned blocks of
// unit_size = num_kv_heads CTAs: the heads of one request chunk (adjacent in that order) then go
// to one block together, head h on its CTA h, and load it once. The chunks are the items the
// CTAs of `s` run (expect_valid checks them).
inline void expect_matches_reference_greedy(const DecodeScheduleOptions& o, const DecodeSchedule& s,
                                            int unit_size) {
  SCOPED_TRACE("reference greedy over units of " + std::to_string(unit_size) + " CTAs");
  const DecodeSchedule e = expand_to_ctas(s);
  std::vector<DecodeWorkItem> chunks = e.work;
  std::sort(chunks.begin(), chunks.end(), [&](const DecodeWorkItem& a, const DecodeWorkItem& b) {
    const double ca = item_cost(o, a), cb = item_cost(o, b);
    if (ca != cb) return ca > cb;
    if (a.request != b.request) return a.request < b.request;
    if (a.kv_start != b.kv_start) return a.kv_start < b.kv_start;
    return a.kv_head < b.kv_head;
  });
  const int units = o.num_ctas / unit_size;
  using Load = std::pair<double, int>;
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> heap;
  for (int u = 0; u < units; ++u) heap.push({0.0, u});
  std::vector<std::vector<DecodeWorkItem>> per_cta(o.num_ctas);
  std::vector<double> load(units, 0.0);
  ASSERT_EQ(chunks.size() % unit_size, 0u);
  for (size_t i = 0; i < chunks.size(); i += unit_size) {
    auto [l, u] = heap.top();
    heap.pop();
    for (int h = 0; h < unit_size; ++h) {
      const DecodeWorkItem& w = chunks[i + h];
      if (unit_size > 1) {  // one request chunk: its heads in order
        ASSERT_EQ(w.request, chunks[i].request);
        ASSERT_EQ(w.kv_start, chunks[i].kv_start);
        ASSERT_EQ(w.kv_head, h);
      }
      per_cta[u * unit_size + h].push_back(w);
    }
    load[u] = l + item_cost(o, chunks[i]);
    heap.push({load[u], u});
  }
  std::vector<DecodeWorkItem> expected;
  std::vector<double> cta_load;
  for (int c = 0; c < o.num_ctas; ++c) {
    expected.insert(expected.end(), per_cta[c].begin(), per_cta[c].end());
    cta_load.push_back(load[c / unit_size]);
  }
  ASSERT_EQ(expected.size(), e.work.size());
  EXPECT_EQ(0, std::memcmp(expected.data(), e.work.data(), e.work.size() * sizeof(DecodeWorkItem)));
  EXPECT_EQ(cta_load, s.cta_cost);
}

// A block-mode schedule is the greedy over blocks; with positive costs that is also exactly the
// greedy over CTAs (decode_scheduler.cpp). Zero-cost chunks (alpha 0, empty requests) are where
// the two differ: the CTA greedy piles them on the least-loaded CTA, the block greedy on the
// least-loaded block (every CTA of it, one head each).
inline void expect_matches_reference_greedy(const DecodeScheduleOptions& o,
                                            const DecodeSchedule& s) {
  if (s.ctas_per_unit > 1) expect_matches_reference_greedy(o, s, s.ctas_per_unit);
  bool free_chunk = false;
  for (const DecodeWorkItem& w : s.stored_work()) free_chunk |= !(item_cost(o, w) > 0);
  if (s.ctas_per_unit == 1 || !free_chunk) expect_matches_reference_greedy(o, s, 1);
}

}  // namespace flashkv::scheduler::sched_test
