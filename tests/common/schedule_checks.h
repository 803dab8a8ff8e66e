// Checks every scheduler test applies to a schedule (decode and prefill alike): the balance
// promises of scheduler/schedule_invariants.h (cta_load_problem: each CTA's items in
// non-increasing cost order, decode only; prefill orders them for the L2 and passes
// `costliest_first` = false; recorded costs; the LPT bound), as GoogleTest expectations.
#pragma once

#include <gtest/gtest.h>

#include <span>

#include "scheduler/schedule_invariants.h"

namespace flashkv::test {

// CTA c runs work[indptr[c], indptr[c + 1]) (a decode schedule in block mode: expanded to CTAs
// first); `cost(item)` is the cost model applied to one work item.
template <class Item, class CostFn>
void expect_balanced_cta_loads(std::span<const int> indptr, std::span<const Item> work,
                               std::span<const double> cta_cost, int ctas, const CostFn& cost,
                               bool costliest_first = true) {
  EXPECT_EQ(scheduler::cta_load_problem<Item>(indptr, work, cta_cost, ctas, cost, costliest_first),
            "");
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
