// Promises every decode and prefill schedule keeps, as functions that return what is wrong ("" when
// nothing is): the scheduler tests assert them (tests/common/schedule_checks.h) and `flashkv fuzz
// --cpu-only` checks them on random batches. Pure C++, no test framework.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "scheduler/decode_scheduler.h"
#include "scheduler/prefill_scheduler.h"

namespace flashkv::scheduler {

// CTA c runs work[indptr[c], indptr[c + 1]); `cost(item)` is the cost model applied to one work
// item. Each CTA's items are in non-increasing cost order (when costliest_first), its recorded
// cost is their sum, and the LPT balance bound holds: when the last chunk of the heaviest CTA was
// handed out, that CTA held the minimum load, <= (total - c) / C, so max load <= total / C + max
// chunk cost.
template <class Item, class CostFn>
std::string cta_load_problem(std::span<const int> indptr, std::span<const Item> work,
                             std::span<const double> cta_cost, int ctas, const CostFn& cost,
                             bool costliest_first = true) {
  if (indptr.size() != static_cast<size_t>(ctas) + 1) return "indptr: not num_ctas + 1 entries";
  if (cta_cost.size() != static_cast<size_t>(ctas)) return "cta_cost: not num_ctas entries";
  double total = 0, max_item = 0, max_load = 0;
  for (int c = 0; c < ctas; ++c) {
    double load = 0;
    for (int i = indptr[c]; i < indptr[c + 1]; ++i) {
      const double ci = cost(work[i]);
      if (costliest_first && i > indptr[c] && ci > cost(work[i - 1]))
        return "CTA " + std::to_string(c) + ": item " + std::to_string(i) +
               " costs more than the one before it";
      load += ci;
      max_item = std::max(max_item, ci);
    }
    // The scheduler sums the same costs in the same order: exact, up to the last bit of a
    // different association.
    if (std::abs(load - cta_cost[c]) > 1e-9 * std::max(1.0, load))
      return "CTA " + std::to_string(c) + ": recorded cost " + std::to_string(cta_cost[c]) +
             " != the sum of its items " + std::to_string(load);
    total += load;
    max_load = std::max(max_load, load);
  }
  if (max_load > total / ctas + max_item + 1e-9 * std::max(1.0, total))
    return "max CTA load " + std::to_string(max_load) + " > total / CTAs + the largest item " +
           std::to_string(total / ctas + max_item);
  return "";
}

// Coverage of a decode schedule (expanded to CTAs, expand_to_ctas): every (request, KV head)
// tile's items cover [0, kv_len) in order without gap or overlap (an empty request: one empty
// item), no item is longer than chunk_bound, and the capacities hold.
inline std::string decode_coverage_problem(std::span<const int64_t> lens,
                                           const DecodeScheduleOptions& o,
                                           const DecodeSchedule& s) {
  if (s.num_work_items > o.max_work_items) return "more work items than max_work_items";
  if (s.num_slots > o.max_slots) return "more partial slots than max_slots";
  const DecodeSchedule e = expand_to_ctas(s);
  std::vector<DecodeWorkItem> items = e.work;
  std::sort(items.begin(), items.end(), [](const DecodeWorkItem& a, const DecodeWorkItem& b) {
    if (a.request != b.request) return a.request < b.request;
    if (a.kv_head != b.kv_head) return a.kv_head < b.kv_head;
    return a.kv_start < b.kv_start;
  });
  size_t i = 0;
  for (int r = 0; r < static_cast<int>(lens.size()); ++r) {
    for (int h = 0; h < o.num_kv_heads; ++h) {
      const std::string tile = "tile (" + std::to_string(r) + ", " + std::to_string(h) + ")";
      int64_t pos = 0;
      size_t n = 0;
      for (; i < items.size() && items[i].request == r && items[i].kv_head == h; ++i, ++n) {
        if (items[i].kv_start != pos) return tile + ": gap or overlap at " + std::to_string(pos);
        if (items[i].kv_end - items[i].kv_start > s.chunk_bound)
          return tile + ": an item longer than chunk_bound";
        pos = items[i].kv_end;
      }
      if (n == 0) return tile + ": no work item";
      if (pos != lens[r])
        return tile + ": covered to " + std::to_string(pos) + " of " + std::to_string(lens[r]);
      if ((o.disable_split_kv || lens[r] == 0) && n != 1) return tile + ": split though it may not";
      if (o.fixed_split_size > 0 && lens[r] > 0 &&
          static_cast<int64_t>(n) != (lens[r] + o.fixed_split_size - 1) / o.fixed_split_size)
        return tile + ": not cut in fixed_split_size chunks";
    }
  }
  if (i != items.size()) return "work items outside the batch's tiles";
  return cta_load_problem<DecodeWorkItem>(
      e.unit_work_indptr, e.work, e.cta_cost, e.num_ctas,
      [&](const DecodeWorkItem& w) { return o.cost.cost(1, w.kv_end - w.kv_start); });
}

// Coverage of a prefill schedule: every (request, KV head, query tile) tile's items cover the KV
// its rows see, [0, visible end) (causal: the tile's last row's diagonal), in order without gap
// or overlap; the tiles cover each request's query rows; capacities hold; loads are balanced.
inline std::string prefill_coverage_problem(std::span<const int64_t> qo_lens,
                                            std::span<const int64_t> kv_lens,
                                            const PrefillScheduleOptions& o,
                                            const PrefillSchedule& s) {
  if (static_cast<int>(s.work.size()) > o.max_work_items) return "more work items than allowed";
  if (s.num_slots > o.max_slots) return "more partial slots than max_slots";
  std::vector<PrefillWorkItem> items = s.work;
  std::sort(items.begin(), items.end(), [](const PrefillWorkItem& a, const PrefillWorkItem& b) {
    if (a.request != b.request) return a.request < b.request;
    if (a.kv_head != b.kv_head) return a.kv_head < b.kv_head;
    if (a.q_start != b.q_start) return a.q_start < b.q_start;
    return a.kv_start < b.kv_start;
  });
  size_t i = 0;
  for (int r = 0; r < static_cast<int>(qo_lens.size()); ++r) {
    for (int h = 0; h < o.num_kv_heads; ++h) {
      for (int64_t q = 0; q < qo_lens[r]; q += s.tile_tokens) {
        const int64_t q_end = std::min<int64_t>(qo_lens[r], q + s.tile_tokens);
        const int64_t visible =
            o.causal ? std::clamp<int64_t>(kv_lens[r] - qo_lens[r] + q_end, 0, kv_lens[r])
                     : kv_lens[r];
        const std::string tile = "tile (" + std::to_string(r) + ", " + std::to_string(h) + ", q " +
                                 std::to_string(q) + ")";
        int64_t pos = 0;
        size_t n = 0;
        for (; i < items.size() && items[i].request == r && items[i].kv_head == h &&
               items[i].q_start == q;
             ++i, ++n) {
          if (items[i].q_end != q_end) return tile + ": wrong query rows";
          if (items[i].kv_start != pos) return tile + ": gap or overlap at " + std::to_string(pos);
          pos = items[i].kv_end;
        }
        if (n == 0) return tile + ": no work item";
        if (pos != visible)
          return tile + ": covered to " + std::to_string(pos) + " of " + std::to_string(visible);
      }
    }
  }
  if (i != items.size()) return "work items outside the batch's tiles";
  return cta_load_problem<PrefillWorkItem>(
      s.cta_work_indptr, s.work, s.cta_cost, s.num_ctas,
      [&](const PrefillWorkItem& w) {
        return o.cost.cost(int64_t{w.q_end - w.q_start} * o.group, w.kv_end - w.kv_start);
      },
      /*costliest_first=*/false);
}

}  // namespace flashkv::scheduler
