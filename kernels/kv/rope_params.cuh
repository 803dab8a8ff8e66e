// The RoPE kernel's runtime parameters (kv/rope.cuh): one flat struct passed by value (as a
// __grid_constant__, so the kernel indexes rope.freq in place). Shared with the host
// (src/ops/kv/rope.cpp); includes only other host-shared headers.
#pragma once

#include "common/device_error.cuh"
#include "kv/rope_math.cuh"

namespace flashkv {

constexpr int kRopeThreads = 128;  // per CTA; the host packs tokens_per_cta tokens into it

struct RopeKernelParams {
  const void* q;  // [nnz, H_qo, D]   (row stride q_stride_n, head stride q_stride_h; elements)
  const void* k;  // [nnz, H_kv, D]
  void* q_out;    // [nnz, H_qo, D]   q itself when in place
  void* k_out;    // [nnz, H_kv, D]
  long long q_stride_n, q_stride_h, k_stride_n, k_stride_h;
  long long qo_stride_n, qo_stride_h, ko_stride_n, ko_stride_h;
  long long nnz;
  int num_qo_heads, num_kv_heads, head_dim;
  int copy_tail;       // 1 out of place: dims [rotary_dim, head_dim) are copied
  const int* pos_ids;  // [nnz] positions, or nullptr: from indptr + offsets
  const int* indptr;   // [batch + 1] rows of each request (pos_ids == nullptr)
  const int* offsets;  // [batch] position of each request's first row
  int batch;
  int threads_per_token;  // units * head_lanes
  int head_lanes;         // threads per unit, each walking heads lane, lane + head_lanes, ...
  int op;                 // DeviceErrorOp, for the error message
  DeviceErrorRecord* error;
  RopeSpec rope;
};

}  // namespace flashkv
