// Conventions shared by every attention op.
//
// LSE: flashkv's log-sum-exp outputs are NATURAL logarithms of the softmax denominator of the
//   scaled logits: lse = log(sum_j exp(sm_scale * q·k_j)). (FlashInfer returns base-2; convert
//   with lse2 = lse * log2(e).) Kernels work in base 2 internally and convert at this edge.
// Empty rows: a query row that sees no key (kv_len 0, or every key masked) produces out = 0 and
//   lse = -inf. Such a state is the identity of the merge operator ⊕, so merging it with
//   anything returns the other state unchanged.
// Causal masks are aligned to the END of the KV: query i of a request with qo_len rows and kv_len
//   keys sees keys j <= kv_len - qo_len + i. (With qo_len > kv_len the first rows see nothing.)
#pragma once

#include <cmath>
#include <limits>

#include "flashkv/dtype.h"

namespace flashkv {

inline constexpr double kLog2e = 1.4426950408889634;  // log2(e)
inline constexpr double kLn2 = 0.6931471805599453;    // ln(2)

// The heads and dtypes a plan() is made for (the batch ops' plan argument beside the batch).
struct AttentionShape {
  int num_qo_heads = 32;
  int num_kv_heads = 8;  // divides num_qo_heads (the GQA group is their ratio)
  int head_dim = 128;
  DType q_dtype = DType::f16, kv_dtype = DType::f16, o_dtype = DType::f16;
};

struct AttentionOptions {
  float sm_scale = 0.0f;  // 0 means 1/sqrt(head_dim)
  bool causal = false;
};

inline float resolve_sm_scale(float sm_scale, int head_dim) {
  return sm_scale > 0.0f ? sm_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

}  // namespace flashkv
