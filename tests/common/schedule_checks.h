// Checks every scheduler test applies to a schedule (decode and prefill alike): each CTA's items
// are in non-increasing cost order (decode; prefill orders them for the L2 and passes
// `costliest_first` = false), its recorded cost is their sum, and the LPT balance bound holds:
// when the last chunk of the heaviest CTA was handed out, that CTA held the minimum load,
// <= (total - c) / C, so max load <= total / C + max chunk cost.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <vector>

namespace flashkv::test {

// CTA c runs work[indptr[c], indptr[c + 1]) (a decode schedule in block mode: expanded to CTAs
// first); `cost(item)` is the cost model applied to one work item.
template <class Item, class CostFn>
void expect_balanced_cta_loads(std::span<const int> indptr, std::span<const Item> work,
                               std::span<const double> cta_cost, int ctas, const CostFn& cost,
                               bool costliest_first = true) {
  ASSERT_EQ(indptr.size(), static_cast<size_t>(ctas) + 1);
  ASSERT_EQ(cta_cost.size(), static_cast<size_t>(ctas));
  double total = 0, max_item = 0, max_load = 0;
  for (int c = 0; c < ctas; ++c) {
    double load = 0;
    for (int i = indptr[c]; i < indptr[c + 1]; ++i) {
      const double ci = cost(work[i]);
      if (costliest_first && i > indptr[c]) {
        ASSERT_LE(ci, cost(work[i - 1]));
      }
      load += ci;
      max_item = std::max(max_item, ci);
    }
    EXPECT_DOUBLE_EQ(load, cta_cost[c]) << "CTA " << c;
    total += load;
    max_load = std::max(max_load, load);
  }
  EXPECT_LE(max_load, total / ctas + max_item + 1e-9 * std::max(1.0, total));
}

// A schedule with one list per CTA: cta_work_indptr, work, cta_cost.
template <class Schedule, class CostFn>
void expect_balanced_cta_loads(const Schedule& s, int ctas, const CostFn& cost,
                               bool costliest_first = true) {
  using Item = typename decltype(s.work)::value_type;
  expect_balanced_cta_loads<Item>(s.cta_work_indptr, s.work, s.cta_cost, ctas, cost,
                                  costliest_first);
}

}  // namespace flashkv::test
