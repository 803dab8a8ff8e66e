// One batch-decode configuration run on the GPU and checked against the CPU reference.
#pragma once

#include <string>
#include <vector>

#include "common/gpu_util.h"
#include "flashkv/decode.h"

namespace flashkv::test {

struct DecodeCase {
  std::vector<int64_t> kv_lens;
  int num_qo_heads = 32, num_kv_heads = 8, head_dim = 128, page_size = 16;
  KVLayout layout = KVLayout::NHD;
  DType dtype = DType::f16;
  bool interleaved = false;
  DecodePlanOptions opts{};
  int ctas_per_sm = 0;  // BatchDecodeConfig.ctas_per_sm (0: auto)
  uint64_t seed = 1;
  std::string str() const;
};

struct DecodeOutcome {
  ToleranceCheck out;
  double lse_err = 0;
  bool lse_nan = false;
  HostTensor out_host;  // the kernel's output, for bitwise comparisons
  BatchDecode::PlanInfo plan;
};

// Builds the inputs from the case's seed, runs the reference (f32 and in the dtype) and the GPU.
DecodeOutcome run_decode_case(const DecodeCase& c);

// Asserts the outcome passes the tolerance rule and the LSE is within 1e-4 relative.
void expect_decode_ok(const DecodeCase& c, const DecodeOutcome& o);

}  // namespace flashkv::test
