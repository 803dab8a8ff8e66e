// Profiling builds only: per-CTA timestamps of the decode kernels' phases, to see where a
// kernel's time goes (ramp, streaming, tail) when ncu's averages cannot say. Compiled in by the
// NVRTC option -DFLASHKV_DECODE_TIMELINE (`flashkv bench decode --timeline FILE` sets it for its
// process); otherwise every stamp is empty and the kernels are unchanged.
//
// Layout: CTA c's stamps are flashkv_decode_timeline[c * kDecodeTimelineEvents + e], in
// %globaltimer nanoseconds: e = 0 the CTA's start, then per work item i < kDecodeTimelineItems
// six events at 1 + 6 i + {0: item read, 1: first KV tile in shared memory, 2: last tile
// done, 3: output or partial state written, 4: a split tile's partial state counted (fence and
// arrival atomic), 5: item finished (merged if this CTA was the tile's last)}.
#pragma once

#include "primitives/types.cuh"

#ifdef FLASHKV_DECODE_TIMELINE
// Global namespace, so cuModuleGetGlobal finds it by this (unmangled) name.
__device__ unsigned long long* flashkv_decode_timeline = nullptr;
#endif

namespace flashkv {

constexpr int kDecodeTimelineItems = 10;
constexpr int kDecodeTimelineEvents = 1 + 6 * kDecodeTimelineItems;

// Event `e` of this CTA, stamped by thread 0 (after a barrier where the phase needs all threads).
__device__ __forceinline__ void decode_timeline_stamp(int e) {
#ifdef FLASHKV_DECODE_TIMELINE
  if (threadIdx.x != 0 || e < 0 || e >= kDecodeTimelineEvents || flashkv_decode_timeline == nullptr)
    return;
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  flashkv_decode_timeline[(u64)blockIdx.x * kDecodeTimelineEvents + e] = t;
#else
  (void)e;
#endif
}

// The first event of work item i of a CTA (-1: not recorded).
__device__ __forceinline__ int decode_timeline_item(int i) {
  return i < kDecodeTimelineItems ? 1 + 6 * i : -1;
}

}  // namespace flashkv
