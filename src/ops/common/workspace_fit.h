// The self-sizing workspace's one search, shared by the decode and prefill workspaces: given the
// layout for r partial-state rows (whose total bytes grow with r), the layout with every row the
// config may need where `bytes` holds it, else the most rows that fit (binary search), else (below
// the plan arrays alone) the full layout, which the constructor then refuses naming min_total.
#pragma once

#include <cstddef>

namespace flashkv::ops {

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
