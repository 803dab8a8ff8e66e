// The dequantization scales of an fp8 KV cache (flashkv/attention.h: KVScale) as kernels take
// them: a host float times an optional device tensor of 1 or num_kv_heads entries, read at run
// time so a CUDA graph replays with the tensor's current contents. Shared with the host
// (src/ops/common/kv_scale_params.h fills it); includes nothing.
#pragma once

namespace flashkv {

struct KVScaleParams {
  const float* k;  // nullptr: the factor alone
  const float* v;
  int k_per_head, v_per_head;  // 1: the tensor has an entry per KV head; 0: one entry
  float k_factor, v_factor;
};

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
// The f32 product the host forms too (reference::detail::head_scale): factor * entry.
__device__ __forceinline__ float kv_scale_of(const float* t, int per_head, float factor,
                                             int kv_head) {
  return t == nullptr ? factor : __fmul_rn(factor, t[per_head ? kv_head : 0]);
}
__device__ __forceinline__ float kv_scale_k(const KVScaleParams& s, int kv_head) {
  return kv_scale_of(s.k, s.k_per_head, s.k_factor, kv_head);
}
__device__ __forceinline__ float kv_scale_v(const KVScaleParams& s, int kv_head) {
  return kv_scale_of(s.v, s.v_per_head, s.v_factor, kv_head);
}

#endif

}  // namespace flashkv
