// The batch decode kernel's runtime parameters: one flat struct of pointers and element strides,
// passed by value. Shared with the host (src/ops/decode/batch_decode.cpp); includes only the plan
// layout.
#pragma once

#include "attention/decode/decode_plan.cuh"
#include "common/device_error.cuh"
#include "kv/kv_scale.cuh"
#include "kv/rope_math.cuh"
#include "variants/variant_args.cuh"

namespace flashkv {

// The fused decode step (BatchDecode::run_step): each request's one new token is appended to the
// cache (k rotated) and q is rotated, inside the decode launch. new_k == nullptr: plain decode.
struct DecodeStepParams {
  const void* new_k;  // [batch, H_kv, D] un-rotated keys of the new tokens
  const void* new_v;  // [batch, H_kv, D]
  long long k_stride_n, k_stride_h, v_stride_n, v_stride_h;  // elements
  const int* pos_ids;  // [batch] RoPE positions, or nullptr: kv_len - 1
  int rope;            // 0: no rotation (q and k are already rotated)
  RopeSpec spec;
};

struct DecodeParams {
  const void* q;  // [batch, H_qo, D]
  const void* k;  // paged: page, token, head addressed with the strides below
  const void* v;
  const int* kv_indices;  // [nnz_pages] page ids; request r's pages start at work.page_base
  void* out;              // [batch, H_qo, D]
  float* lse;             // [batch, H_qo] natural-log LSE, or nullptr
  long long q_stride_n, q_stride_h;  // elements
  long long o_stride_n, o_stride_h;
  long long lse_stride_n;
  long long page_stride, token_stride, head_stride;  // of k and v, elements
  long long num_pages;       // pages in k / v: ids outside [0, num_pages) are read as zeros and
                             // reported to `error`
  DeviceErrorRecord* error;  // where a bad page id or position is reported (device_errors.h)
  float sm_scale_log2;       // sm_scale * log2(e): logits are kept in base 2
  DecodePlanPtrs plan;
  DecodeStepParams step;
  VariantArgsBlock variant;  // the variant's Args (kernels/variants/variant.cuh), read in place
  KVScaleParams scale;       // an fp8 cache's dequantization scales (16-bit caches: unused)
};

}  // namespace flashkv
