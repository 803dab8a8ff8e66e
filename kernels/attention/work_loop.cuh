// The work loop of the persistent attention kernels (decode.cuh, decode_tc.cuh): a CTA reads its
// share of the plan's work list, lets the next kernel in the stream start (PDL), runs its items in
// order, waiting for the previous kernel before the first one touches its memory, and counts each
// split item's partial state (the arrive; the last CTA to arrive merges the tile). The loop owns
// that order, the timeline's stamps (work_timeline.cuh) and the arrive's condition; the item body
// and the arrive stay hand-written per kernel and come in as callables, inlined: each kernel's
// machine code is byte-identical to the one it had with its own loop (NOTES "Issue 40").
//
// A work list is a kernel family's view of its plan (DecodeWorkList, decode_common.cuh):
//   WorkRange cta_items() const   the items [begin, end) of this CTA (plan reads only)
//   Item item(int wi) const       item wi of them; Item has `slot` (>= 0: a split item's
//                                 partial-state slot, so the arrive runs after the body)
#pragma once

#include "attention/work_timeline.cuh"
#include "primitives/pdl.cuh"

namespace flashkv {

// The items [begin, end) of a CTA's share of the plan.
struct WorkRange {
  int begin, end;
};

// The loop's entry: the timeline's start, the CTA's range and the launch of the next kernel's
// CTAs. Nothing here waits: the plan is the call's own (uploaded before the previous kernel ran).
template <class List>
__device__ __forceinline__ WorkRange work_loop_enter(const List& list) {
  work_timeline_stamp(0);
  const WorkRange r = list.cta_items();
  pdl_launch_dependents();
  return r;
}

// Runs the items of `r` in order: body(w, timeline), then arrive(w, timeline) for a split item.
// The wait for the previous kernel comes after the first item is read, so that load overlaps the
// previous kernel's tail too (the items' loads are a CTA's first dependent round trips); q, KV,
// page ids, outputs and split state are touched only after it, and a CTA with no items never
// waits. timeline: the item's first event in a profiling build (work_timeline.cuh), else unused.
template <class List, class Body, class Arrive>
__device__ __forceinline__ void work_loop_items(const List& list, WorkRange r, Body&& body,
                                                Arrive&& arrive) {
  for (int wi = r.begin; wi < r.end; ++wi) {
    const auto w = list.item(wi);
    if (wi == r.begin) pdl_wait();
    const int timeline = work_timeline_item(wi - r.begin);
    work_timeline_stamp(timeline);
    body(w, timeline);
    if (timeline >= 0) work_timeline_stamp(timeline + 3);
    if (w.slot >= 0) arrive(w, timeline);
    if (timeline >= 0) work_timeline_stamp(timeline + 5);
  }
}

// The whole loop.
template <class List, class Body, class Arrive>
__device__ __forceinline__ void work_loop(const List& list, Body&& body, Arrive&& arrive) {
  work_loop_items(list, work_loop_enter(list), body, arrive);
}

}  // namespace flashkv
