// The building blocks of the Hopper prefill kernel (wgmma, sm_90a; the kernel itself, with its
// producer warpgroup and TMA loads, is prefill_hopper_ws.cuh): the same plan, work items, online
// softmax and epilogue as the mma.sync kernel (prefill.cuh), with the two matrix products on
// wgmma. Why: on mma.sync every K/V fragment passes through registers (ldmatrix) and the kernel
// is latency-bound at 255 registers with the tensor pipe ~47 % busy (NOTES.md, "Profile at
// e3957d3"); wgmma reads K and V straight from shared memory, 64 rows x a whole KV tile per
// instruction, asynchronously, so one tile's softmax runs while the previous tile's P·V is on the
// tensor cores.
//
// Two consumer warpgroups; warpgroup g owns rows [64 g, 64 g + 64) of the 128-row query tile, and
// warp w rows [16 w, 16 w + 16): wgmma's accumulator layout gives each warp the mma.m16n8k16 C
// fragment of its 16 rows, so the per-warp softmax, masks and epilogue of the mma.sync kernel
// apply unchanged (kRowTiles = 1, kWarpRows = 16). Per KV tile and warpgroup:
//   S = Q Kᵀ    wgmma, Q and K from shared memory (K-major, 128-byte swizzle)
//   softmax     per warp, in registers; P packed to 16 bits as the A fragment
//   O += P V    wgmma, P from registers, V from shared memory (MN-major: transposed by wgmma),
//               issued in the next tile's step, after its S = Q Kᵀ, to overlap its softmax
// Variants: prefill_hopper_variant.cuh.
#pragma once

#include "attention/prefill/prefill_config.cuh"
#include "attention/prefill/prefill_epilogue.cuh"
#include "attention/prefill/prefill_loader.cuh"
#include "attention/prefill/prefill_mainloop.cuh"
#include "attention/prefill/prefill_params.cuh"
#include "attention/prefill/prefill_shape.cuh"
#include "attention/prefill/prefill_variant.cuh"
#include "primitives/wgmma.cuh"

namespace flashkv {

// KVT: T, or an fp8 type whose tiles the producer widens into the 16-bit stages
// (prefill_hopper_ws.cuh).
template <class T, int HEAD_DIM, int KV_SOURCE, class KVT = T>
struct PrefillHopperConfig : PrefillConfigCommon<T, HEAD_DIM, 128, KV_SOURCE, true, KVT> {
  typedef PrefillConfigCommon<T, HEAD_DIM, 128, KV_SOURCE, true, KVT> Base;
  static constexpr int kStagingSlots = Base::kShape.staging_slots;  // fp8 KV: slots of K + V
  // kStages V stages, the producer running up to kStages - 1 tiles ahead; K is free once S = Q Kᵀ
  // lands, so it has one stage fewer.
  static constexpr int kKStages = Base::kStages - 1;
  static constexpr int kQBuffers = Base::kShape.q_buffers;

  // wgmma's 128-byte-swizzled column blocks (wgmma.cuh).
  template <int kTileRows>
  __device__ __forceinline__ static u32 smem_offset(int row, int chunk) {
    return sw128_offset<kTileRows>(row, chunk);
  }
  // A K / V stage's (prefill_loader.cuh).
  __device__ __forceinline__ static u32 kv_offset(int row, int chunk) {
    return smem_offset<Base::kTile>(row, chunk);
  }

  static_assert(Base::kWarps == 8 && Base::kRowTiles == 1 && Base::kWarpsKV == 1,
                "two consumer warpgroups of 64 rows, a warp's 16 rows over the whole KV tile");
  static_assert(Base::kQBytes % 1024 == 0 && Base::kStageBytes % 1024 == 0,
                "tiles on swizzle-atom boundaries");
  // The host refuses the kernel where the GPU offers less (src/ops/prefill/prefill_core.cpp); on
  // Hopper (227 KB per block) every head_dim fits, 1 KB of static shared memory included.
  static_assert(Base::kSmemBytes + 1024 <= 227 * 1024, "fits Hopper's shared memory per block");
};

// Issues S[64 x kTile] of warpgroup `wg` = Q(its rows) · K(stage)ᵀ, over head_dim in k-steps of
// 16, as one wgmma group (the caller waits).
template <class C>
__device__ __forceinline__ void prefill_hopper_qk(u32 q_smem, u32 k_stage, int wg,
                                                  float (&s)[C::kTile / 2]) {
  // Each k-step's descriptors are the first ones plus a constant (addresses stay below 2^18, so
  // adding to the 14-bit address field never carries out of it).
  const u64 a0 = sw128_desc(q_smem + wg * 64 * 128, 16, 1024);
  const u64 b0 = sw128_desc(k_stage, 16, 1024);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < C::kHeadDim / 16; ++ks) {
    const u32 col = (ks / 4), byte = (ks % 4) * 32;
    wgmma_ss<typename C::kv_t, C::kTile>(s, a0 + ((col * (C::kRows * 128) + byte) >> 4),
                                         b0 + ((col * (C::kTile * 128) + byte) >> 4), ks > 0);
  }
  wgmma_commit();
}

// Issues O[64 x head_dim] of the warpgroup's rows += P · V(stage), over the tile's tokens in
// k-steps of 16, as one wgmma group (the caller waits).
template <class C>
__device__ __forceinline__ void prefill_hopper_pv(const u32 (&pa)[1][C::kNT / 2][4], u32 v_stage,
                                                  float (&o)[C::kHeadDim / 2]) {
  const u64 b0 = sw128_desc(v_stage, C::kTile * 128, 1024);
  wgmma_fence();  // o was rescaled with ordinary instructions
#pragma unroll
  for (int j = 0; j < C::kTile / 16; ++j)
    wgmma_rs_tb<typename C::kv_t, C::kHeadDim>(o, pa[0][j], b0 + ((j * 16 * 128) >> 4), 1);
  wgmma_commit();
}

// The per-warp view of a work item: its rows, the last KV position each of this thread's rows may
// see (-1: not a real row; it never decreases with the row) and the warp's smallest real one
// (masking is per warp); with a sliding window (prefill_hopper_variant.cuh) also the first
// position each row may see and the warp's largest (else 0).
struct PrefillHopperRows {
  int valid_rows;
  int lim[1][2];
  int warp_min;
  int lo[1][2];
  int warp_lo_max;
};

template <class C>
__device__ __forceinline__ PrefillHopperRows prefill_hopper_rows(const PrefillParams& p,
                                                                 const PrefillWorkItem& w) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  PrefillHopperRows r;
  r.valid_rows = (w.q_end - w.q_start) * p.group;
  r.warp_min = 0x7fffffff;
  r.lo[0][0] = r.lo[0][1] = 0;
  r.warp_lo_max = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = warp * 16 + lane / 4 + 8 * h;
    int l = w.kv_end - 1;
    if (p.causal) l = min(l, w.diag + w.q_start + row / p.group);
    r.lim[0][h] = row < r.valid_rows ? l : -1;
    if (row < r.valid_rows) r.warp_min = min(r.warp_min, l);
  }
#pragma unroll
  for (int off = 16; off >= 1; off /= 2)
    r.warp_min = min(r.warp_min, __shfl_xor_sync(0xffffffffu, r.warp_min, off));
  return r;
}

}  // namespace flashkv
