// The tuning hub: which architecture's policy every tuning number is read from. Kernels and host
// code name only tuning::Policy (tuning::Policy::kDecodeDefaultCtasPerSm,
// tuning::Policy::prefill_stages(...)), never a policy file's struct.
//
// One choice for the build, made here for the host compiler and NVRTC alike, not per device from
// __CUDA_ARCH__: the host computes a kernel's threads and shared memory from the same constexpr
// shape functions its Config compiles (attention/decode/decode_shape.cuh,
// attention/prefill/prefill_shape.cuh), and the schedulers' bounds size the workspaces the kernels
// read, so both sides must read one policy. (Serving two tuned architectures from one build would
// make the kernel keys carry the policy; nothing needs that yet.) sm_90's policy also serves the
// targets without a policy of their own: the mma.sync and CUDA-core kernels compile for sm_80 and
// sm_89 with its numbers, which were measured on Hopper only.
//
// Another architecture: its policy file beside sm90.cuh (a struct with every member of Sm90,
// tests/cpu/test_tuning_policy.cpp checks the rules) and the line below naming it.
#pragma once

#include "tuning/sm90.cuh"

namespace flashkv::tuning {

using Policy = Sm90;

}  // namespace flashkv::tuning
