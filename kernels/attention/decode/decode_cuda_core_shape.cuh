// The CUDA-core decode kernel's geometry (decode.cuh) as a function of (head_dim, KV element size):
// read by its Config and by the host launch (decode_key.h, through decode_shape.cuh). Its own file
// because decode_shape.cuh defines a namespace-scope constexpr variable, which NVRTC's
// -default-device makes a device global of every module that includes it: the CUDA-core kernel
// never had it, and its machine code stays as it was (scripts/compare_kernels.py). Includes only
// the policy, whose enumerators emit nothing.
#pragma once

#include "tuning/policy.cuh"

namespace flashkv {

// The CUDA-core kernel (decode.cuh): 128 threads; ~16 KB of K+V per stage (kTile tokens) and
// 4 stages: enough bytes in flight per SM to cover HBM latency at 2 CTAs per SM (tuning/sm90.cuh:
// not measured).
struct DecodeCudaCoreShape {
  int threads;
  int tile;  // KV tokens per pipeline stage
  int stages;
  int smem_bytes;  // `stages` K tiles and `stages` V tiles
};
constexpr DecodeCudaCoreShape decode_cuda_core_shape(int head_dim, int kv_bytes) {
  DecodeCudaCoreShape s{};
  s.threads = tuning::Policy::kDecodeCudaCoreThreads;
  s.tile = tuning::Policy::decode_cuda_core_tile(head_dim, kv_bytes);
  s.stages = tuning::Policy::kDecodeCudaCoreStages;
  s.smem_bytes = 2 * s.stages * s.tile * head_dim * kv_bytes;
  return s;
}

}  // namespace flashkv
