// Batch prefill / append attention on Hopper's warpgroup MMA (wgmma, sm_90a): the same plan, work
// items, loaders, online softmax and epilogue as the mma.sync kernel (prefill.cuh), with the two
// matrix products moved to wgmma. Why a second kernel: on mma.sync every K/V fragment passes
// through registers (ldmatrix) and the kernel is latency-bound at 255 registers with the tensor
// pipe ~47 % busy (NOTES.md, "Profile at e3957d3"); wgmma reads K and V straight from shared
// memory, 64 rows x a whole KV tile per instruction, asynchronously.
//
// A CTA is two warpgroups; warpgroup g owns rows [64 g, 64 g + 64) of the 128-row query tile, and
// warp w of the CTA rows [16 w, 16 w + 16): wgmma's accumulator layout gives each warp the
// mma.m16n8k16 C fragment of its 16 rows, so the per-warp softmax, masks and epilogue of the
// mma.sync kernel apply unchanged (kRowTiles = 1, kWarpRows = 16). Per KV tile and warpgroup:
//   S = Q Kᵀ    wgmma, Q and K from shared memory (K-major, 128-byte swizzle)
//   softmax     per warp, in registers; P packed to 16 bits as the A fragment
//   O += P V    wgmma, P from registers, V from shared memory (MN-major: transposed by wgmma)
// The KV pipeline is the mma.sync kernel's cp.async gather (any page size); only the shared
// layout differs (wgmma.cuh). Plain attention only: variants keep the mma.sync kernel.
#pragma once

#include "attention/prefill_epilogue.cuh"
#include "attention/prefill_loader.cuh"
#include "attention/prefill_mainloop.cuh"
#include "attention/prefill_params.cuh"
#include "attention/prefill_shape.cuh"
#include "attention/prefill_variant.cuh"
#include "primitives/wgmma.cuh"

namespace flashkv {

template <class T, int HEAD_DIM, int KV_SOURCE>
struct PrefillHopperConfig {
  using q_t = T;
  using kv_t = T;
  using o_t = T;
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kRows = 128;
  static constexpr int kKV = KV_SOURCE;  // PrefillKVSource
  static constexpr PrefillShape kShape = prefill_hopper_shape(HEAD_DIM);
  static constexpr int kRowTiles = kShape.row_tiles;  // 1: a warp holds 16 rows of S and O
  static constexpr int kWarpRows = kShape.warp_rows;
  static constexpr int kWarpsQ = kShape.warps_q;
  static constexpr int kWarpsKV = kShape.warps_kv;
  static constexpr int kWarps = kShape.warps;
  static constexpr int kThreads = kShape.threads;
  static constexpr int kTile = kShape.tile;
  static constexpr int kWarpTokens = kTile;
  static constexpr int kNT = kTile / 8;
  static constexpr int kChunks = HEAD_DIM / 8;
  static constexpr int kDTiles = HEAD_DIM / 8;
  static constexpr int kLoads = kTile * kChunks / kThreads;
  static constexpr int kQBytes = kShape.q_bytes;
  static constexpr int kStageBytes = kShape.stage_bytes;
  static constexpr int kStages = kShape.stages;
  static constexpr int kSmemBytes = kShape.smem_bytes;

  // wgmma's 128-byte-swizzled column blocks (wgmma.cuh).
  template <int kTileRows>
  __device__ __forceinline__ static u32 smem_offset(int row, int chunk) {
    return sw128_offset<kTileRows>(row, chunk);
  }

  static_assert(sizeof(T) == 2, "prefill takes 16-bit q, kv and out");
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256, "head_dim 64, 128 or 256");
  static_assert(kWarps == 8 && kRows == 2 * 64, "two warpgroups of 64 rows");
  static_assert(kTile * kChunks % kThreads == 0 && kRows * kChunks % kThreads == 0, "even loads");
  static_assert(kQBytes % 1024 == 0 && kStageBytes % 1024 == 0, "tiles on swizzle-atom boundaries");
};

// S[64 x kTile] of warpgroup `wg` = Q(its rows) · K(stage)ᵀ, over head_dim in k-steps of 16.
template <class C>
__device__ __forceinline__ void prefill_hopper_qk(u32 q_smem, u32 k_stage, int wg, float (&s)[C::kTile / 2]) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < C::kHeadDim / 16; ++ks) {
    const u32 col = (ks / 4), byte = (ks % 4) * 32;
    const u64 a = sw128_desc(q_smem + col * (C::kRows * 128) + wg * 64 * 128 + byte, 16, 1024);
    const u64 b = sw128_desc(k_stage + col * (C::kTile * 128) + byte, 16, 1024);
    wgmma_ss<typename C::kv_t, C::kTile>(s, a, b, ks > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(s);
}

// O[64 x head_dim] of warpgroup's rows += P · V(stage), over the tile's tokens in k-steps of 16.
template <class C>
__device__ __forceinline__ void prefill_hopper_pv(const u32 (&pa)[1][C::kNT / 2][4], u32 v_stage,
                                                  float (&o)[C::kHeadDim / 2]) {
  wgmma_fence();  // the softmax rescaled o with ordinary instructions
#pragma unroll
  for (int j = 0; j < C::kTile / 16; ++j)
    wgmma_rs_tb<typename C::kv_t, C::kHeadDim>(o, pa[0][j], sw128_desc(v_stage + j * 16 * 128, C::kTile * 128, 1024), 1);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(o);
}

// C: a PrefillWithVariant<PrefillHopperConfig, DefaultVariant>. `smem`: the 1024-aligned base.
template <class C>
__device__ __forceinline__ void prefill_hopper_work_item(const PrefillParams& p, const PrefillWorkItem& w,
                                                         u32 smem) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wg = warp / 4;
  const u32 q_smem = smem;
  const u32 k_smem = q_smem + C::kQBytes;
  const u32 v_smem = k_smem + C::kStages * C::kStageBytes;
  const int valid_rows = (w.q_end - w.q_start) * p.group;
  const int len = w.kv_end - w.kv_start;
  const int num_tiles = (len + C::kTile - 1) / C::kTile;

  // The last KV position tile row `row` sees; it never decreases with the row.
  const auto row_lim = [&](int row) {
    int l = w.kv_end - 1;
    if (p.causal) l = min(l, w.diag + w.q_start + row / p.group);
    return l;
  };
  // Per thread row (-1: not a real row) and the warp's smallest real one (masking is per warp).
  int lim[1][2];
  int warp_min = 0x7fffffff;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = warp * 16 + lane / 4 + 8 * h;
    lim[0][h] = row < valid_rows ? row_lim(row) : -1;
    if (row < valid_rows) warp_min = min(warp_min, lim[0][h]);
  }
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) warp_min = min(warp_min, __shfl_xor_sync(0xffffffffu, warp_min, off));
  // wgmma runs per warpgroup, so skipping a tile must be uniform over its 64 rows: the last
  // position its last real row sees (-1: no real row).
  const int wg_row0 = wg * 64;
  const int wg_max = wg_row0 < valid_rows ? row_lim(min(wg_row0 + 63, valid_rows - 1)) : -1;

  PrefillWarpState<C> st;
  st.init();
  float(&o)[C::kHeadDim / 2] = reinterpret_cast<float(&)[C::kHeadDim / 2]>(st.o);
  PrefillTilePages<C> pages;
  prefill_load_q<C>(p, w, valid_rows, q_smem);  // joins the first stage's commit group
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < num_tiles) {
      prefill_tile_pages<C>(p, w, s, pages);
      prefill_issue_kv_tile<C>(p, w, s, pages, k_smem + s * C::kStageBytes, v_smem + s * C::kStageBytes);
    }
    cp_async_commit();
  }
  if (C::kStages - 1 < num_tiles) prefill_tile_pages<C>(p, w, C::kStages - 1, pages);

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int next = tile + C::kStages - 1;
    if (next < num_tiles) {
      const int ns = next % C::kStages;
      prefill_issue_kv_tile<C>(p, w, next, pages, k_smem + ns * C::kStageBytes, v_smem + ns * C::kStageBytes);
    }
    cp_async_commit();
    if (next + 1 < num_tiles) prefill_tile_pages<C>(p, w, next + 1, pages);
    cp_async_wait<C::kStages - 1>();
    fence_proxy_async_shared();  // the tile was written by cp.async; wgmma reads it
    __syncthreads();
    const int stage = tile % C::kStages;
    const int first = w.kv_start + tile * C::kTile;
    if (first <= wg_max) {  // else no row of this warpgroup sees any of the tile
      float s[1][C::kNT][4];
      prefill_hopper_qk<C>(q_smem, k_smem + stage * C::kStageBytes, wg,
                           reinterpret_cast<float(&)[C::kTile / 2]>(s));
      u32 pa[1][C::kNT / 2][4];
      const int pos0 = first + 2 * (lane % 4);
      if (first + C::kTile - 1 <= warp_min) {
        prefill_softmax<C, false>(st, s, pos0, lim, p.sm_scale_log2, pa);
      } else {
        prefill_softmax<C, true>(st, s, pos0, lim, p.sm_scale_log2, pa);
      }
      prefill_hopper_pv<C>(pa, v_smem + stage * C::kStageBytes, o);
    }
    __syncthreads();  // this stage is refilled by a later iteration
  }
  cp_async_wait<0>();  // the Q load of an item with no KV tiles, and trailing empty groups
  prefill_write_warp<C>(p, w, st, warp, valid_rows);
}

template <class Config, class V = DefaultVariant>
__global__ void __launch_bounds__(Config::kThreads, 1)
    batch_prefill_hopper_kernel(const __grid_constant__ PrefillParams p) {
  typedef PrefillWithVariant<Config, V> C;
  typedef typename C::Traits Tr;
  static_assert(!Tr::kPerLogit && !Tr::kQueryTransform && !Tr::kKVTransform && !Tr::kFirstVisibleKey &&
                    !Tr::kSink && !Tr::kOutputTransform && Tr::kUseSoftmax,
                "the Hopper prefill kernel runs plain attention; variants take the mma.sync kernel");
  extern __shared__ __align__(1024) unsigned char smem[];
  const u32 base = (smem_addr(smem) + 1023u) & ~1023u;  // swizzle atoms are 1024-byte aligned
  const int begin = p.plan.cta_work_indptr[blockIdx.x];
  const int end = p.plan.cta_work_indptr[blockIdx.x + 1];
  for (int wi = begin; wi < end; ++wi) {
    const PrefillWorkItem w = p.plan.work[wi];
    prefill_hopper_work_item<C>(p, w, base);
    if (w.slot >= 0) prefill_arrive<C>(p, w);
  }
}

}  // namespace flashkv
