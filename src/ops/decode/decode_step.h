// Host side of the fused decode step (BatchDecode::run_step): checks its extra arguments and
// builds the kernel's DecodeStepParams. Not a public header.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/decode/decode_params.cuh"
#include "flashkv/decode.h"

namespace flashkv::ops {

// What the plan in force says about the step.
struct DecodeStepShape {
  int batch = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim = 0, device = 0;
  DType kv_dtype{};
  DType q_dtype{};  // an fp8 cache takes its new rows in q's dtype (quantized by the kernel)
  int64_t min_kv_len = 0, max_kv_len = 0;  // over the plan's requests
  bool graph = false;  // enable_cuda_graph: tensors may hold more rows than the batch
};

// The frequency table of the last rotation options, kept so a step per layer does not recompute
// rotary_dim / 2 powers each call.
struct RopeSpecMemo {
  DecodeStepOptions::Rope kind = DecodeStepOptions::Rope::kNone;
  RopeOptions llama;
  Llama31RopeOptions llama31;
  int head_dim = 0;
  bool valid = false;
  RopeSpec spec{};
};

// Validates new_k / new_v / step against the plan (naming the bad argument) and returns the
// kernel's step parameters.
DecodeStepParams make_decode_step_params(const TensorView& new_k, const TensorView& new_v,
                                         const DecodeStepOptions& step,
                                         const DecodeStepShape& shape, RopeSpecMemo& memo);

}  // namespace flashkv::ops
