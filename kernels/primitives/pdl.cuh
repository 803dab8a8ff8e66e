// Programmatic dependent launch (sm_90+, PTX griddepcontrol). A kernel launched with the
// programmatic-stream-serialization attribute may start while the kernel before it in the stream
// is still running; it must not touch memory that kernel may read or write until pdl_wait()
// returns (the previous grid has completed and its writes are visible). Launched without the
// attribute, or on an older GPU, both calls do nothing, so every kernel may call them.
//
// Why: a serving engine runs 32-80 attention kernels per token, each a few microseconds of
// launch, CTA start-up and plan reads before its first KV byte; with PDL those overlap the
// previous kernel's tail (NOTES.md, "Decode layers back to back").
#pragma once

namespace flashkv {

// Lets the next kernel in the stream (if it was launched with PDL) start its CTAs now: its
// prologue then runs while this kernel finishes. Its pdl_wait() still waits for all of this grid.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Waits until the previous kernel in the stream has completed and its memory is visible. Call it
// before the first access to any memory but this kernel's own plan (q, KV, page tables, outputs,
// workspace state shared with the previous call).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace flashkv
