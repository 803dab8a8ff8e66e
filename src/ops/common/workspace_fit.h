// The self-sizing workspace's one search, shared by the decode and prefill workspaces: given the
// layout for r partial-state rows (whose total bytes grow with r), the layout with every row the
// config may need where `bytes` holds it, else the most rows that fit (binary search), else (below
// the plan arrays alone) the full layout, which the constructor then refuses naming min_total.
//
// Also the split-KV region both lay out after their plan image (partial_state_region).
#pragma once

#include <algorithm>
#include <cstddef>

namespace flashkv::ops {

// The partial states of split-KV work after a plan image of `plan_bytes`: `rows` log-sum-exps
// (f32), `rows` x head_dim outputs (f32) and one arrival counter per merge item (at least one: the
// kernels' pointer is never null), each array 16-byte aligned. The kernels find them through the
// op's plan pointers (DecodePlanPtrs / PrefillPlanPtrs: partial_lse, partial_o, merge_arrivals).
struct PartialStateRegion {
  size_t lse_offset = 0, o_offset = 0, arrivals_offset = 0, end = 0;
};
inline PartialStateRegion partial_state_region(size_t plan_bytes, size_t rows, int head_dim,
                                               int max_merge_items) {
  const auto align16 = [](size_t x) { return (x + 15) / 16 * 16; };
  PartialStateRegion r;
  r.lse_offset = align16(plan_bytes);
  r.o_offset = align16(r.lse_offset + rows * sizeof(float));
  r.arrivals_offset = align16(r.o_offset + rows * static_cast<size_t>(head_dim) * sizeof(float));
  r.end = r.arrivals_offset + static_cast<size_t>(std::max(max_merge_items, 1)) * sizeof(int);
  return r;
}

// with_rows(size_t rows) -> a Sizes with `total`, `full_total` and `min_total` fields.
template <class WithRows>
auto fit_workspace_rows(size_t full_rows, size_t bytes, WithRows with_rows) {
  auto s = with_rows(full_rows);
  const size_t full_total = s.total, min_total = with_rows(0).total;
  if (s.total > bytes && bytes >= min_total) {
    size_t lo = 0, hi = full_rows;  // with_rows(lo) fits, with_rows(hi) does not
    while (hi - lo > 1) {
      const size_t mid = lo + (hi - lo) / 2;
      (with_rows(mid).total <= bytes ? lo : hi) = mid;
    }
    s = with_rows(lo);
  }
  s.full_total = full_total;
  s.min_total = min_total;
  return s;
}

}  // namespace flashkv::ops
