// A GPU spin of a given duration, launched before a benchmark's start event so that the host's
// launch path (argument checks, the launch call itself) runs while the GPU is busy and the
// events time the GPU work alone: the same method as flashkv's peers
// (python/flashkv/bench/peers/timing.py: torch.cuda._sleep before each start event), so flashkv and
// the peers are timed alike.
#pragma once

#include "primitives/types.cuh"

namespace flashkv {

__global__ void spin_kernel(u64 ns) {
  u64 t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

}  // namespace flashkv
