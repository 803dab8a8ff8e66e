// The batch decode kernel's runtime parameters: one flat struct of pointers and element strides,
// passed by value. Shared with the host (src/ops/batch_decode.cpp); includes only the plan layout.
#pragma once

#include "attention/decode_plan.cuh"

namespace flashkv {

struct DecodeParams {
  const void* q;            // [batch, H_qo, D]
  const void* k;            // paged: page, token, head addressed with the strides below
  const void* v;
  const int* kv_indices;    // [nnz_pages] page ids; request r's pages start at work.page_base
  void* out;                // [batch, H_qo, D]
  float* lse;               // [batch, H_qo] natural-log LSE, or nullptr
  long long q_stride_n, q_stride_h;   // elements
  long long o_stride_n, o_stride_h;
  long long lse_stride_n;
  long long page_stride, token_stride, head_stride;  // of k and v, elements
  long long num_pages;      // pages in k / v: ids outside [0, num_pages) are read as zeros
  float sm_scale_log2;      // sm_scale * log2(e): logits are kept in base 2
  DecodePlanPtrs plan;
};

}  // namespace flashkv
