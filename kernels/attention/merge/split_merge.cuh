// ⊕ of the split-KV partial states a work item's chunks left in the workspace, as the fused merge
// stages of decode (decode_common.cuh) and prefill (prefill_epilogue.cuh) read them: normalized
// f32 outputs and base-2 LSEs, one state per slot, in KV order. The partials were written by other
// CTAs: they are read through L2 (__ldcg), never a possibly stale L1 line.
#pragma once

#include "attention/state.cuh"
#include "primitives/types.cuh"

namespace flashkv {

// Merges 4 columns of one row over slots [slot_begin, slot_end): the row's state in slot s is at
// o[s * o_slot_stride] (4 floats) and lse[s * lse_slot_stride]. Writes the normalized result to
// acc and returns its base-2 LSE (-inf when no slot saw a key: acc is then 0). kBatch partial
// states are read per step (kBatch L2 reads in flight, not 1; 5 registers each).
template <int kBatch = 8>
__device__ __forceinline__ float merge_split_slots4(const float* o, long long o_slot_stride,
                                                    const float* lse, long long lse_slot_stride,
                                                    int slot_begin, int slot_end, float (&acc)[4]) {
  float m = neg_inf(), d = 0.f;
#pragma unroll
  for (int e = 0; e < 4; ++e) acc[e] = 0.f;
  for (int s0 = slot_begin; s0 < slot_end; s0 += kBatch) {
    float l[kBatch];
    float4 v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const long long s = s0 + i;
      const bool ok = s < slot_end;
      l[i] = ok ? __ldcg(lse + s * lse_slot_stride) : neg_inf();
      v[i] = ok ? __ldcg(reinterpret_cast<const float4*>(o + s * o_slot_stride))
                : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float m_new = m;
#pragma unroll
    for (int i = 0; i < kBatch; ++i) m_new = fmaxf(m_new, l[i]);
    if (m_new == neg_inf()) continue;  // nothing seen yet
    const float scale = fast_exp2(m - m_new);
    d *= scale;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] *= scale;
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      // weight 0 for empty states (lse = -inf)
      softmax_merge_add_normalized(m_new, l[i], v[i], d, acc);
    }
    m = m_new;
  }
  const float inv = softmax_inv(d);
#pragma unroll
  for (int e = 0; e < 4; ++e) acc[e] *= inv;
  return softmax_lse2(m, d);
}

}  // namespace flashkv
