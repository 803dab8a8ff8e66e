// The FA2 main loop of the prefill kernel, per warp and KV tile: S = Q·Kᵀ on tensor cores, the
// online-softmax update (base 2) that turns S into P in registers, and O += P·V. A warp owns
// kRowTiles 16-row MMA tiles of query rows (each K/V fragment it reads feeds all of them) and
// kWarpTokens tokens of each KV tile. Fragment layouts are those of mma.cuh: thread t holds rows
// t/4 and t/4 + 8 (h = 0, 1 below) of each row tile.
#pragma once

#include "attention/fp8_fragments.cuh"
#include "attention/state.cuh"
#include "primitives/cp_async.cuh"
#include "primitives/mma.cuh"
#include "primitives/types.cuh"

namespace flashkv {

// One warp's running state for its rows (attention/state.cuh): unnormalized O, running max m and
// (quad-partial) denominator d of the rows this thread holds.
template <class C>
struct PrefillWarpState : SoftmaxFragState<C::kRowTiles, C::kDTiles> {};

// fp8 KV (the mma.sync kernel): K and V tiles stay fp8 in shared memory (half the bytes per
// stage) and are widened to q's type as their fragments are read, in the column orders of
// attention/fp8_fragments.cuh: Q's staged columns permuted (fp8_permute_q_rows, by prefill.cuh),
// and O's n-tiles 2ch / 2ch + 1 holding chunk ch's even / odd columns (the epilogue writes them
// back in order: prefill_epilogue.cuh).

// S from fp8 K rows (Q permuted): one ldmatrix of 16 tokens x 32 columns feeds two k-steps.
template <class C>
__device__ __forceinline__ void prefill_qk_fp8(u32 q_base, u32 k_base, int wq, int wk,
                                               float (&s)[C::kRowTiles][C::kNT][4]) {
  typedef typename C::q_t mma_t;
  typedef typename C::kv_t kv_t;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kp = 0; kp < C::kHeadDim / 32; ++kp) {
    u32 qa[2][C::kRowTiles][4];
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int r = 0; r < C::kRowTiles; ++r) {
        const int q_row = wq * C::kWarpRows + r * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
        ldmatrix_x4(qa[half][r],
                    q_base + swizzled_offset<C::kChunks>(q_row, 2 * (2 * kp + half) + lane / 16));
      }
#pragma unroll
    for (int j = 0; j < C::kNT / 2; ++j) {
      u32 kb[4];  // tokens 0-7 / 8-15 of KV chunk 2kp, then of chunk 2kp + 1
      const int k_row = wk * C::kWarpTokens + j * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
      ldmatrix_x4(kb, k_base + swizzled_offset<C::kKVChunks>(k_row, 2 * kp + lane / 16));
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        u32 b0[2], b1[2];
        fp8_k_fragments<mma_t, kv_t>(kb, half, b0, b1);
#pragma unroll
        for (int r = 0; r < C::kRowTiles; ++r) {
          mma_m16n8k16<mma_t>(s[r][2 * j], qa[half][r], b0);
          mma_m16n8k16<mma_t>(s[r][2 * j + 1], qa[half][r], b1);
        }
      }
    }
  }
}

// S[rows of warp row block wq][kWarpTokens] = Q · K(tokens of this warp's slice)ᵀ.
template <class C>
__device__ __forceinline__ void prefill_qk(u32 q_base, u32 k_base, int wq, int wk,
                                           float (&s)[C::kRowTiles][C::kNT][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < C::kRowTiles; ++r)
#pragma unroll
    for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[r][nt][e] = 0.f;
  if constexpr (is_fp8<typename C::kv_t>()) {
    prefill_qk_fp8<C>(q_base, k_base, wq, wk, s);
  } else {
#pragma unroll
    for (int ks = 0; ks < C::kHeadDim / 16; ++ks) {
      u32 qa[C::kRowTiles][4];
#pragma unroll
      for (int r = 0; r < C::kRowTiles; ++r) {
        const int q_row = wq * C::kWarpRows + r * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
        ldmatrix_x4(qa[r], q_base + swizzled_offset<C::kChunks>(q_row, 2 * ks + lane / 16));
      }
#pragma unroll
      for (int j = 0; j < C::kNT / 2; ++j) {
        u32 kb[4];  // (tokens 0-7, k lo), (tokens 0-7, k hi), (tokens 8-15, k lo), (tokens 8-15, k
                    // hi)
        const int k_row = wk * C::kWarpTokens + j * 16 + (lane % 8) + 8 * (lane / 16);
        ldmatrix_x4(kb, k_base + swizzled_offset<C::kChunks>(k_row, 2 * ks + (lane / 8) % 2));
        const u32 b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
#pragma unroll
        for (int r = 0; r < C::kRowTiles; ++r) {
          mma_m16n8k16<typename C::kv_t>(s[r][2 * j], qa[r], b0);
          mma_m16n8k16<typename C::kv_t>(s[r][2 * j + 1], qa[r], b1);
        }
      }
    }
  }
}

// The online-softmax update of row half (r, h) (rows lane/4 + 8h of row tile r) from this
// thread's logits s[r][*][2h..2h+1], already masked (-inf), whose maximum is `mx` (this thread's
// part; reduced across the quad here). Logits are in base 2 after multiplying by `scale_log2`
// (> 0; 1 for logits already scaled). Leaves P in s. Shared by the plain and the variant softmax.
// Returns the factor the row's O is rescaled by; with kRescaleO false the caller applies it
// (the Hopper kernel, whose O is still being written by the previous tile's wgmma).
template <class C, bool kRescaleO = true>
__device__ __forceinline__ float prefill_online_update(PrefillWarpState<C>& st,
                                                       float (&s)[C::kRowTiles][C::kNT][4], int r,
                                                       int h, float mx, float scale_log2) {
  const SoftmaxStep step = st.step(r, h, softmax_quad_max(mx) * scale_log2);
  // Four partial sums: one running sum would be a chain of kNT * 2 dependent adds, and with two
  // warps per scheduler (the Hopper kernel) nothing hides its latency.
  float sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float pr = softmax_p(s[r][nt][h * 2 + e], scale_log2, step.m_exp);
      s[r][nt][h * 2 + e] = pr;
      sum[(nt % 2) * 2 + e] += pr;
    }
  // quad-partial: reduced across the quad at the end
  st.add(r, h, step, (sum[0] + sum[1]) + (sum[2] + sum[3]));
  if constexpr (kRescaleO) st.rescale(r, h, step.scale);
  return step.scale;
}

// P of row tile r (in s) as the A operand of P·V: the C-fragment layout of S is the A-fragment
// layout of P (rows h, k = tokens); pa[r][j] covers tokens [16j, 16j + 16) of the slice.
template <class C>
__device__ __forceinline__ void prefill_pack_p(const float (&s)[C::kRowTiles][C::kNT][4], int r,
                                               u32 (&pa)[C::kRowTiles][C::kNT / 2][4]) {
#pragma unroll
  for (int j = 0; j < C::kNT / 2; ++j) {
    pa[r][j][0] = pack2<typename C::q_t>(s[r][2 * j][0], s[r][2 * j][1]);  // row g, tok 0-7
    pa[r][j][1] = pack2<typename C::q_t>(s[r][2 * j][2], s[r][2 * j][3]);  // row g+8, tok 0-7
    pa[r][j][2] =
        pack2<typename C::q_t>(s[r][2 * j + 1][0], s[r][2 * j + 1][1]);  // row g, tok 8-15
    pa[r][j][3] =
        pack2<typename C::q_t>(s[r][2 * j + 1][2], s[r][2 * j + 1][3]);  // row g+8, tok 8-15
  }
}

// Online softmax over one tile's logits. pos0: KV position of this thread's first column
// (token 2*(lane%4) of the warp's slice); lim[r][h]: the last KV position row (r, h) may see
// (-1: none); with `lo` (a sliding window's key range, the Hopper kernel) also the first. With
// kMask false every logit is visible (the caller checked the whole slice is). Writes P as the A
// operand of P·V. With kRescaleO false O is left as it is and `rescale` gets each row half's
// factor for it.
template <class C, bool kMask, bool kRescaleO = true>
__device__ __forceinline__ void prefill_softmax(PrefillWarpState<C>& st,
                                                float (&s)[C::kRowTiles][C::kNT][4], int pos0,
                                                const int (&lim)[C::kRowTiles][2], float scale_log2,
                                                u32 (&pa)[C::kRowTiles][C::kNT / 2][4],
                                                float (*rescale)[2] = nullptr,
                                                const int (*lo)[2] = nullptr) {
#pragma unroll
  for (int r = 0; r < C::kRowTiles; ++r) {
    // Both row halves' maxima in one pass, two partials each: four independent chains, not one
    // chain of kNT * 2 dependent max per row half.
    float mx[2][2] = {{neg_inf(), neg_inf()}, {neg_inf(), neg_inf()}};
#pragma unroll
    for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          // Raw logits until the exponent: the scale (> 0) folds into one FFMA per logit there.
          if (kMask && (pos0 + nt * 8 + e > lim[r][h] || (lo && pos0 + nt * 8 + e < lo[r][h])))
            s[r][nt][h * 2 + e] = neg_inf();
          mx[h][e] = fmaxf(mx[h][e], s[r][nt][h * 2 + e]);
        }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float f =
          prefill_online_update<C, kRescaleO>(st, s, r, h, fmaxf(mx[h][0], mx[h][1]), scale_log2);
      if constexpr (!kRescaleO) rescale[r][h] = f;
    }
    prefill_pack_p<C>(s, r, pa);
  }
}

// O += P·V from fp8 V rows: one transposed ldmatrix of 16 tokens x 32 columns, each 32-bit
// register split by a byte permute into the B fragments of chunk ch's even columns (n-tile 2ch)
// and odd ones (2ch + 1).
template <class C>
__device__ __forceinline__ void prefill_pv_fp8(PrefillWarpState<C>& st,
                                               const u32 (&pa)[C::kRowTiles][C::kNT / 2][4],
                                               u32 v_base, int wk) {
  typedef typename C::q_t mma_t;
  typedef typename C::kv_t kv_t;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < C::kNT / 2; ++j) {
    const int v_row = wk * C::kWarpTokens + j * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
#pragma unroll
    for (int jp = 0; jp < C::kHeadDim / 32; ++jp) {
      u32 vb[4];  // tokens 0-7 / 8-15 of chunk 2jp, then of chunk 2jp + 1
      ldmatrix_x4_trans(vb, v_base + swizzled_offset<C::kKVChunks>(v_row, 2 * jp + lane / 16));
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int ch = 2 * jp + half;
        u32 even[2], odd[2];
        fp8_v_fragments<mma_t, kv_t>(vb, half, even, odd);
#pragma unroll
        for (int r = 0; r < C::kRowTiles; ++r) {
          mma_m16n8k16<mma_t>(st.o[r][2 * ch], pa[r][j], even);
          mma_m16n8k16<mma_t>(st.o[r][2 * ch + 1], pa[r][j], odd);
        }
      }
    }
  }
}

// O += P·V over this warp's token slice: V rows are tokens, so ldmatrix.trans gives B fragments.
template <class C>
__device__ __forceinline__ void prefill_pv(PrefillWarpState<C>& st,
                                           const u32 (&pa)[C::kRowTiles][C::kNT / 2][4], u32 v_base,
                                           int wk) {
  if constexpr (is_fp8<typename C::kv_t>()) {
    prefill_pv_fp8<C>(st, pa, v_base, wk);
  } else {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int j = 0; j < C::kNT / 2; ++j) {
#pragma unroll
      for (int dd = 0; dd < C::kHeadDim / 16; ++dd) {
        u32 vb[4];  // (tok 0-7, dims lo), (tok 8-15, dims lo), (tok 0-7, dims hi), (tok 8-15, dims
                    // hi)
        const int v_row = wk * C::kWarpTokens + j * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
        ldmatrix_x4_trans(vb, v_base + swizzled_offset<C::kChunks>(v_row, 2 * dd + lane / 16));
        const u32 b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
#pragma unroll
        for (int r = 0; r < C::kRowTiles; ++r) {
          mma_m16n8k16<typename C::kv_t>(st.o[r][2 * dd], pa[r][j], b0);
          mma_m16n8k16<typename C::kv_t>(st.o[r][2 * dd + 1], pa[r][j], b1);
        }
      }
    }
  }
}

}  // namespace flashkv
