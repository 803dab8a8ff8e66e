// Profiling builds only: per-CTA timestamps of a persistent attention kernel's phases, to see where
// its time goes (ramp, streaming, tail) when ncu's averages cannot say. The work loop
// (work_loop.cuh) stamps the CTA's start and each item's read, end and finish; the item bodies
// stamp their own phases. Compiled in by the NVRTC option -DFLASHKV_DECODE_TIMELINE (`flashkv
// bench decode --decode-timeline FILE` sets it for its process; the option and the buffer keep the
// names they were made under, for the decode kernels); otherwise every stamp is empty and the
// kernels are unchanged.
//
// Layout: CTA c's stamps are flashkv_decode_timeline[c * kWorkTimelineEvents + e], in
// %globaltimer nanoseconds: e = 0 the CTA's start, then per work item i < kWorkTimelineItems
// six events at 1 + 6 i + {0: item read, 1: first KV tile in shared memory, 2: last tile
// done, 3: output or partial state written, 4: a split tile's partial state counted (fence and
// arrival atomic), 5: item finished (merged if this CTA was the tile's last)}. The item bodies
// stamp 1, 2 and 4.
#pragma once

#include "primitives/types.cuh"

#ifdef FLASHKV_DECODE_TIMELINE
// Global namespace, so cuModuleGetGlobal finds it by this (unmangled) name.
__device__ unsigned long long* flashkv_decode_timeline = nullptr;
#endif

namespace flashkv {

constexpr int kWorkTimelineItems = 10;
constexpr int kWorkTimelineEvents = 1 + 6 * kWorkTimelineItems;

// Event `e` of this CTA, stamped by thread 0 (after a barrier where the phase needs all threads).
__device__ __forceinline__ void work_timeline_stamp(int e) {
#ifdef FLASHKV_DECODE_TIMELINE
  if (threadIdx.x != 0 || e < 0 || e >= kWorkTimelineEvents || flashkv_decode_timeline == nullptr)
    return;
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  flashkv_decode_timeline[(u64)blockIdx.x * kWorkTimelineEvents + e] = t;
#else
  (void)e;
#endif
}

// The first event of work item i of a CTA (-1: not recorded).
__device__ __forceinline__ int work_timeline_item(int i) {
  return i < kWorkTimelineItems ? 1 + 6 * i : -1;
}

}  // namespace flashkv
