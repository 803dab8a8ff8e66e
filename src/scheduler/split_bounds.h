// The split-KV workspace bounds the decode and prefill schedulers share (the proofs are at their
// planners: decode_scheduler.cpp, prefill_scheduler.cpp). With dynamic splitting a schedule of
// num_ctas CTAs uses at most 2 x num_ctas partial-state slots (the FlashInfer paper's bound), and
// every merge item owns >= 2 slots, so max_slots slots need at most max_slots / 2 merge items.
// fixed_split_size has no bound in terms of num_ctas (its chunks follow the KV lengths).
#pragma once

#include <climits>

#include "flashkv/error.h"

namespace flashkv::scheduler {

inline int max_split_slots(int num_ctas) {
  check(num_ctas > 0, "max_split_slots: num_ctas must be > 0 (got ", num_ctas, ")");
  check(num_ctas <= INT_MAX / 2,
        "max_split_slots: 2 * num_ctas overflows int (num_ctas = ", num_ctas, ")");
  return 2 * num_ctas;
}

inline int max_split_merge_items(int max_slots) {
  check(max_slots >= 0, "max_split_merge_items: max_slots must be >= 0 (got ", max_slots, ")");
  return max_slots / 2;
}

}  // namespace flashkv::scheduler
