// Checks of the split-KV options the decode and prefill schedulers share (fixed_split_size,
// disable_split_kv, min_chunk_tokens, the capacities and the cost model). `what` names the
// planner in the messages ("plan_decode", "plan_prefill").
#pragma once

#include <cmath>
#include <cstdint>

#include "flashkv/error.h"

namespace flashkv::scheduler {

template <class Options>
void validate_split_options(const char* what, const Options& o) {
  check(o.num_ctas > 0, what, ": num_ctas must be > 0 (got ", o.num_ctas, ")");
  check(o.num_kv_heads > 0, what, ": num_kv_heads must be > 0 (got ", o.num_kv_heads, ")");
  check(o.fixed_split_size >= 0, what, ": fixed_split_size must be >= 0 (0 = dynamic; got ",
        o.fixed_split_size, ")");
  check(!(o.fixed_split_size > 0 && o.disable_split_kv), what, ": fixed_split_size (",
        o.fixed_split_size, ") and disable_split_kv are mutually exclusive; set one of them");
  check(o.min_chunk_tokens > 0, what, ": min_chunk_tokens must be > 0 (got ", o.min_chunk_tokens,
        ")");
  // 0: a workspace with no room for partial states; dynamic splitting then splits nothing.
  check(o.max_slots >= 0, what, ": max_slots must be >= 0 (got ", o.max_slots, ")");
  check(o.max_work_items > 0, what, ": max_work_items must be > 0 (got ", o.max_work_items, ")");
  check(std::isfinite(o.cost.alpha) && o.cost.alpha >= 0, what,
        ": cost.alpha must be finite and >= 0 (got ", o.cost.alpha, ")");
  // beta > 0 makes cost strictly increasing in chunk length, which the run sorts rely on.
  check(std::isfinite(o.cost.beta) && o.cost.beta > 0, what,
        ": cost.beta must be finite and > 0 (got ", o.cost.beta, ")");
}

// Dynamic splitting in a workspace of max_slots partial-state slots (the paper's self-sizing
// workspace: FlashInfer users hand over one fixed buffer, often smaller than the 2 x #CTA bound
// needs): the smallest chunk bound in [bound, longest], a multiple of `align`, whose chunks fit
// the slots. slots_at(b) is the slot count at bound b; it never grows with b (a tile's chunk count
// ceil(v / b) does not, and a tile with v <= b takes none), and at b >= longest nothing splits, so
// a binary search finds it: O(log(longest)) passes over the tiles, paid only when space is short.
template <class SlotsAt>
int64_t fit_chunk_bound_to_slots(int64_t bound, int64_t longest, int64_t align, int64_t max_slots,
                                 SlotsAt slots_at) {
  // The search steps by `align` from `bound`, so it must start on a multiple (prefill rounds it).
  check(align >= 1 && bound % align == 0, "fit_chunk_bound_to_slots: bound ", bound,
        " is not a multiple of align ", align);
  if (bound >= longest || slots_at(bound) <= max_slots) return bound;
  int64_t lo = bound, hi = (longest + align - 1) / align * align;  // slots_at(lo) > max_slots
  while (hi - lo > align) {
    const int64_t mid = lo + (hi - lo) / align / 2 * align;
    (slots_at(mid) <= max_slots ? hi : lo) = mid;
  }
  return hi;
}

}  // namespace flashkv::scheduler
