// The append kernel's runtime parameters (kv/append.cuh): one flat struct passed by value.
// Shared with the host (src/ops/kv/kv_append.cpp); includes only other host-shared headers.
#pragma once

#include "common/device_error.cuh"
#include "kv/kv_scale.cuh"

namespace flashkv {

constexpr int kAppendThreads = 128;  // per CTA; the host packs tokens_per_cta tokens into it

struct AppendParams {
  const void* key;    // [nnz, H_kv, D]  (row stride key_stride_n, head stride key_stride_h)
  const void* value;  // [nnz, H_kv, D]
  long long key_stride_n, key_stride_h, value_stride_n, value_stride_h;
  const int* batch_indices;  // [nnz] request of each token
  const int* positions;      // [nnz] position of each token within its request
  void* k;                   // the cache's k and v (separate, or the two halves of one tensor)
  void* v;
  long long page_stride, token_stride, head_stride;  // elements; shared by k and v
  const int* kv_indptr;                              // [batch + 1]
  const int* kv_indices;                             // [num_indices] page ids
  const int* kv_last_page_len;                       // [batch]
  long long nnz, num_indices, num_pages;
  int batch, page_size, num_heads, head_dim;
  int threads_per_token;
  DeviceErrorRecord* error;
  KVScaleParams scale;  // an fp8 cache's scales: append_quantize_kernel divides by them
};

}  // namespace flashkv
