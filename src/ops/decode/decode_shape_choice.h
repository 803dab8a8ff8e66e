// Which shape of the tensor-core decode kernel a plan runs: CTAs per SM and warps per CTA (and
// pipeline stages, kernels/attention/decode/decode_shape.cuh). Pure host logic, unit-tested on the
// CPU.
#pragma once

#include <cstdint>
#include <span>

#include "ops/jit/kernel_specs.h"
#include "tuning/policy.cuh"

namespace flashkv::ops {

struct DecodeShapeInputs {
  int config_ctas_per_sm = 0;  // BatchDecodeConfig.ctas_per_sm (0: auto)
  int sms = 0;                 // SMs the grid spans
  int head_dim = 128;
  int group = 1;  // query heads per KV head
  int num_kv_heads = 1;
  // The GPU's opt-in shared memory per block.
  int max_smem_bytes = tuning::Policy::kSmemPerBlockBytes;
  std::span<const int64_t> kv_lens;  // the keys each request's row sees
  bool enable_cuda_graph = false;
  int fixed_split_size = 0;
  int tc_stages = 0, tc_warps = 0;  // DecodePlanOptions (0: default)
  int kv_bytes = 2;                 // the KV element size (1: fp8)
};

struct DecodeShapeChoice {
  // The grid's, for the tensor-core kernel (::flashkv::tuning: the member below hides it).
  int ctas_per_sm = ::flashkv::tuning::Policy::kDecodeDefaultCtasPerSm;
  DecodeTCTuning tuning;  // its kernel shape ({} : the default, 2 CTAs of 4 warps)
};

// KV tokens (summed over KV heads) per CTA from which auto runs 4 CTAs of 2 warps per SM
// (tuning/sm90.cuh: the measurement behind it).
inline constexpr int64_t kDecodeSmallCtaMinTokens = tuning::Policy::kDecodeSmallCtaMinTokens;

DecodeShapeChoice choose_decode_shape(const DecodeShapeInputs& in);

}  // namespace flashkv::ops
