// Checks every scheduler test applies to a schedule (decode and prefill alike): each CTA's items
// are in non-increasing cost order, its recorded cost is their sum, and the LPT balance bound
// holds: when the last chunk of the heaviest CTA was handed out, that CTA held the minimum load,
// <= (total - c) / C, so max load <= total / C + max chunk cost.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>

namespace flashkv::test {

// `cost(item)` is the cost model applied to one work item.
template <class Schedule, class CostFn>
void expect_balanced_cta_loads(const Schedule& s, int ctas, const CostFn& cost) {
  double total = 0, max_item = 0, max_load = 0;
  for (int c = 0; c < ctas; ++c) {
    double load = 0;
    for (int i = s.cta_work_indptr[c]; i < s.cta_work_indptr[c + 1]; ++i) {
      const double ci = cost(s.work[i]);
      if (i > s.cta_work_indptr[c]) {
        ASSERT_LE(ci, cost(s.work[i - 1]));
      }
      load += ci;
      max_item = std::max(max_item, ci);
    }
    EXPECT_DOUBLE_EQ(load, s.cta_cost[c]) << "CTA " << c;
    total += load;
    max_load = std::max(max_load, load);
  }
  EXPECT_LE(max_load, total / ctas + max_item + 1e-9 * std::max(1.0, total));
}

}  // namespace flashkv::test
