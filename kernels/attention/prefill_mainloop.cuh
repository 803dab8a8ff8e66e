// The FA2 main loop of the prefill kernel, per warp and KV tile: S = Q·Kᵀ on tensor cores, the
// online-softmax update (base 2) that turns S into P in registers, and O += P·V. A warp owns 16
// query rows (one m16n8k16 row tile) and kWarpTokens tokens of each KV tile. Fragment layouts
// are those of mma.cuh: thread t holds rows t/4 and t/4 + 8 (h = 0, 1 below) of its row tile.
#pragma once

#include "primitives/cp_async.cuh"
#include "primitives/mma.cuh"
#include "primitives/types.cuh"

namespace flashkv {

// One warp's running state for its 16 rows: unnormalized O, running max m and (quad-partial)
// denominator d of the two rows this thread holds.
template <class C>
struct PrefillWarpState {
  float o[C::kDTiles][4];
  float m[2];
  float d[2];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[h] = neg_inf();
      d[h] = 0.f;
    }
#pragma unroll
    for (int n = 0; n < C::kDTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
  }
};

// S[16 rows][kWarpTokens] = Q(rows of row tile `wq`) · K(tokens of this warp's slice)ᵀ.
template <class C>
__device__ __forceinline__ void prefill_qk(u32 q_base, u32 k_base, int wq, int wk,
                                           float (&s)[C::kNT][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
  for (int ks = 0; ks < C::kHeadDim / 16; ++ks) {
    u32 qa[4];
    const int q_row = wq * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
    ldmatrix_x4(qa, q_base + swizzled_offset<C::kChunks>(q_row, 2 * ks + lane / 16));
#pragma unroll
    for (int j = 0; j < C::kNT / 2; ++j) {
      u32 kb[4];  // (tokens 0-7, k lo), (tokens 0-7, k hi), (tokens 8-15, k lo), (tokens 8-15, k hi)
      const int k_row = wk * C::kWarpTokens + j * 16 + (lane % 8) + 8 * (lane / 16);
      ldmatrix_x4(kb, k_base + swizzled_offset<C::kChunks>(k_row, 2 * ks + (lane / 8) % 2));
      const u32 b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
      mma_m16n8k16<typename C::kv_t>(s[2 * j], qa, b0);
      mma_m16n8k16<typename C::kv_t>(s[2 * j + 1], qa, b1);
    }
  }
}

// Online softmax over one tile's logits. pos0: KV position of this thread's first column
// (token 2*(lane%4) of the warp's slice); lim[h]: the last KV position row h may see (-1: none).
// With kMask false every logit is visible (the caller checked the whole slice is). Writes P as
// the A operand of P·V: pa[j] covers tokens [16j, 16j + 16) of the slice.
template <class C, bool kMask>
__device__ __forceinline__ void prefill_softmax(PrefillWarpState<C>& st, float (&s)[C::kNT][4],
                                                int pos0, const int (&lim)[2], float scale_log2,
                                                u32 (&pa)[C::kNT / 2][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = neg_inf();
#pragma unroll
    for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float x = s[nt][h * 2 + e] * scale_log2;
        if (kMask && pos0 + nt * 8 + e > lim[h]) x = neg_inf();
        s[nt][h * 2 + e] = x;
        mx = fmaxf(mx, x);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(st.m[h], mx);
    // Every key of this row masked so far: keep the state empty (p = 0, no rescale, no NaN).
    const float m_use = m_new == neg_inf() ? 0.f : m_new;
    const float rescale = fast_exp2(st.m[h] - m_use);
    st.m[h] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pr = fast_exp2(s[nt][h * 2 + e] - m_use);
        s[nt][h * 2 + e] = pr;
        sum += pr;
      }
    st.d[h] = st.d[h] * rescale + sum;  // quad-partial: reduced across the quad at the end
#pragma unroll
    for (int n = 0; n < C::kDTiles; ++n) {
      st.o[n][h * 2] *= rescale;
      st.o[n][h * 2 + 1] *= rescale;
    }
  }
  // C-fragment layout of S is the A-fragment layout of P (rows h, k = tokens).
#pragma unroll
  for (int j = 0; j < C::kNT / 2; ++j) {
    pa[j][0] = pack2<typename C::kv_t>(s[2 * j][0], s[2 * j][1]);          // row g, tokens 0-7
    pa[j][1] = pack2<typename C::kv_t>(s[2 * j][2], s[2 * j][3]);          // row g+8, tokens 0-7
    pa[j][2] = pack2<typename C::kv_t>(s[2 * j + 1][0], s[2 * j + 1][1]);  // row g, tokens 8-15
    pa[j][3] = pack2<typename C::kv_t>(s[2 * j + 1][2], s[2 * j + 1][3]);  // row g+8, tokens 8-15
  }
}

// O += P·V over this warp's token slice: V rows are tokens, so ldmatrix.trans gives B fragments.
template <class C>
__device__ __forceinline__ void prefill_pv(PrefillWarpState<C>& st, const u32 (&pa)[C::kNT / 2][4],
                                           u32 v_base, int wk) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < C::kNT / 2; ++j) {
#pragma unroll
    for (int dd = 0; dd < C::kHeadDim / 16; ++dd) {
      u32 vb[4];  // (tok 0-7, dims lo), (tok 8-15, dims lo), (tok 0-7, dims hi), (tok 8-15, dims hi)
      const int v_row = wk * C::kWarpTokens + j * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
      ldmatrix_x4_trans(vb, v_base + swizzled_offset<C::kChunks>(v_row, 2 * dd + lane / 16));
      const u32 b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
      mma_m16n8k16<typename C::kv_t>(st.o[2 * dd], pa[j], b0);
      mma_m16n8k16<typename C::kv_t>(st.o[2 * dd + 1], pa[j], b1);
    }
  }
}

}  // namespace flashkv
