// Batch prefill / append attention on tensor cores (the FA2 algorithm on mma.sync m16n8k16):
// a CTA takes one query tile of kRows rows — (query token, head-in-group) pairs, GQA heads fused
// into the rows so each KV byte serves the whole group — and streams its KV chunk through a
// kStages-deep cp.async pipeline of page-gathered, XOR-swizzled tiles. The parts: loaders
// (prefill_loader.cuh), the per-warp main loop (prefill_mainloop.cuh), the epilogue and fused
// split-KV merge (prefill_epilogue.cuh), and the persistent work loop below.
//
// Warps (prefill_shape.cuh): each owns one or two 16-row MMA tiles. Small tiles (16, 32 rows:
// short queries, speculative decoding) would leave most of the CTA idle, so there kWarpsKV warps
// share a row tile and split every KV tile between them, merged with ⊕ at the end (as in
// decode_tc.cuh). Causal masking costs nothing on tiles entirely below the diagonal (no mask
// arithmetic) and a warp whose rows see none of a tile skips it; tiles beyond every row's
// diagonal are never scheduled (prefill_scheduler.h).
//
// Attention variants (prefill_variant.cuh): the query transform runs on the staged Q tile, the
// key/value transforms on each KV tile as it lands, logits hooks in the softmax step, the sink
// and output transform in the epilogue. Causal masking stays the kernel's own (tile skipping).
#pragma once

#include "attention/prefill/prefill_config.cuh"
#include "attention/prefill/prefill_epilogue.cuh"
#include "attention/prefill/prefill_loader.cuh"
#include "attention/prefill/prefill_mainloop.cuh"
#include "attention/prefill/prefill_params.cuh"
#include "attention/prefill/prefill_shape.cuh"
#include "attention/prefill/prefill_variant.cuh"
#include "primitives/pdl.cuh"

namespace flashkv {

// KVT: T, or an fp8 type (e4m3_t, e5m2_t) widened to T in registers (prefill_mainloop.cuh) or,
// with WIDEN_KV, as the tiles are staged (for variants that rewrite them: kv/kv_chunk_copy.cuh).
template <class T, int HEAD_DIM, int ROWS, int KV_SOURCE, class KVT = T, bool WIDEN_KV = false>
struct PrefillConfig : PrefillConfigCommon<T, HEAD_DIM, ROWS, KV_SOURCE, false, KVT, WIDEN_KV> {
  typedef PrefillConfigCommon<T, HEAD_DIM, ROWS, KV_SOURCE, false, KVT, WIDEN_KV> Base;
  // Where 16-byte chunk `chunk` of row `row` of a kTileRows-row Q tile lives: rows of kChunks
  // chunks, XOR-swizzled for ldmatrix.
  template <int kTileRows>
  __device__ __forceinline__ static u32 smem_offset(int row, int chunk) {
    return swizzled_offset<Base::kChunks>(row, chunk);
  }
  // And of a K / V stage (rows of kKVChunks chunks: half as many for an fp8 tile).
  __device__ __forceinline__ static u32 kv_offset(int row, int chunk) {
    return swizzled_offset<Base::kKVChunks>(row, chunk);
  }

  static_assert(ROWS == 16 || ROWS == 32 || ROWS == 64 || ROWS == 128, "query tile of 16-128 rows");
  static_assert(Base::kWarpsKV == 1 || Base::kRowTiles == 1,
                "warps that split KV tiles own one row tile");
};

// C: a PrefillWithVariant<PrefillConfig, V> (prefill_variant.cuh).
template <class C>
__device__ __forceinline__ void prefill_work_item(const PrefillParams& p, const PrefillWorkItem& w,
                                                  unsigned char* smem) {
  typedef typename C::Variant Var;
  typedef typename C::Traits Tr;
  const auto stage_offset = [](int row, int chunk) {
    return swizzled_offset<C::kKVChunks>(row, chunk);
  };
  const auto q_offset = [](int row, int chunk) { return swizzled_offset<C::kChunks>(row, chunk); };
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wq = warp / C::kWarpsKV, wk = warp % C::kWarpsKV;
  const u32 q_smem = smem_addr(smem);
  const u32 k_smem = q_smem + C::kQBytes;
  const u32 v_smem = k_smem + C::kStages * C::kStageBytes;
  const int valid_rows = (w.q_end - w.q_start) * p.group;
  const int len = w.kv_end - w.kv_start;
  const int num_tiles = (len + C::kTile - 1) / C::kTile;

  // The last KV position each of this thread's rows sees (-1: none, or not a real row), and the
  // warp's extremes over its real rows, to skip or leave unmasked whole slices.
  int lim[C::kRowTiles][2];
  int warp_min = 0x7fffffff, warp_max = -1;
#pragma unroll
  for (int r = 0; r < C::kRowTiles; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = wq * C::kWarpRows + r * 16 + lane / 4 + 8 * h;
      lim[r][h] = -1;
      if (row < valid_rows) {
        lim[r][h] = w.kv_end - 1;
        if (p.causal) lim[r][h] = min(lim[r][h], w.diag + w.q_start + row / p.group);
        warp_min = min(warp_min, lim[r][h]);
      }
      warp_max = max(warp_max, lim[r][h]);
    }
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) {
    warp_min = min(warp_min, __shfl_xor_sync(0xffffffffu, warp_min, off));
    warp_max = max(warp_max, __shfl_xor_sync(0xffffffffu, warp_max, off));
  }
  // The per-logit hooks' view of this thread's rows. Padding rows (>= valid_rows) score as the
  // last real row, so no hook ever sees a query outside the request; they are never written.
  PrefillRowPos<C> rp;
  if constexpr (Tr::kPerLogit) {
#pragma unroll
    for (int r = 0; r < C::kRowTiles; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = min(wq * C::kWarpRows + r * 16 + lane / 4 + 8 * h, max(valid_rows - 1, 0));
        const VariantRow vr = prefill_variant_row(p, w, row);
        rp.qo_idx[r][h] = vr.qo_idx;
        rp.qo_head[r][h] = vr.qo_head;
      }
  }

  // With a window-like bound (first_visible_key), the first key any of this warp's real rows may
  // see: slices entirely left of it are skipped like those right of the causal diagonal.
  int warp_lo = 0;
  if constexpr (Tr::kFirstVisibleKey) {
    warp_lo = 0x7fffffff;
#pragma unroll
    for (int r = 0; r < C::kRowTiles; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = wq * C::kWarpRows + r * 16 + lane / 4 + 8 * h;
        if (row < valid_rows)
          warp_lo = min(warp_lo, Var::first_visible_key(variant_args<Var>(p.variant),
                                                        prefill_variant_row(p, w, row)));
      }
#pragma unroll
    for (int off = 16; off >= 1; off /= 2)
      warp_lo = min(warp_lo, __shfl_xor_sync(0xffffffffu, warp_lo, off));
  }

  PrefillWarpState<C> st;
  st.init();
  PrefillTilePages<C> pages;
  prefill_load_q<C>(p, w, valid_rows, q_smem);  // joins the first stage's commit group
  // fp8 KV: Q gets its own commit group, permuted once it lands (prefill_mainloop.cuh).
  if constexpr (is_fp8<typename C::kv_t>() && !Tr::kQueryTransform) cp_async_commit();
  if constexpr (Tr::kQueryTransform) {  // Q alone first: transformed in place before any use
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    variant_transform_q_rows<Var, typename C::q_t, C::kHeadDim, C::kThreads>(
        variant_args<Var>(p.variant), smem, q_offset, valid_rows,
        [&](int r) { return prefill_variant_row(p, w, r); });
    __syncthreads();
  }
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < num_tiles) {
      prefill_tile_pages<C>(p, w, s, pages);
      prefill_issue_kv_tile<C>(p, w, s, pages, k_smem + s * C::kStageBytes,
                               v_smem + s * C::kStageBytes);
    }
    cp_async_commit();
  }
  if (C::kStages - 1 < num_tiles) prefill_tile_pages<C>(p, w, C::kStages - 1, pages);
  const u32 q_base = q_smem;
  float sm_scale_log2 = p.sm_scale_log2;
  if constexpr (is_fp8<typename C::kv_t>()) {
    cp_async_wait<C::kStages - 1>();  // the Q group (the KV prologue's groups may be in flight)
    __syncthreads();
    fp8_permute_q_rows<C::kChunks, C::kThreads>(
        smem, C::kRows);  // the main loop's barrier orders it before any use
  }
  // The keys are dequantized through the logits: q·(k * s) = (q·k) * s.
  if constexpr (is_fp8<typename C::kv_mem_t>()) sm_scale_log2 *= kv_scale_k(p.scale, w.kv_head);

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int next = tile + C::kStages - 1;
    if (next < num_tiles) {
      const int ns = next % C::kStages;
      prefill_issue_kv_tile<C>(p, w, next, pages, k_smem + ns * C::kStageBytes,
                               v_smem + ns * C::kStageBytes);
    }
    cp_async_commit();
    if (next + 1 < num_tiles) prefill_tile_pages<C>(p, w, next + 1, pages);
    cp_async_wait<C::kStages - 1>();
    __syncthreads();
    const int st_idx = tile % C::kStages;
    if constexpr (Tr::kKVTransform) {  // the landed tile's real rows, once, before any warp reads
      unsigned char* k_stage = smem + C::kQBytes + st_idx * C::kStageBytes;
      variant_transform_kv_rows<Var, typename C::kv_t, C::kHeadDim, C::kThreads>(
          variant_args<Var>(p.variant), VariantKey{w.request, 0, w.kv_len, w.kv_head},
          w.kv_start + tile * C::kTile, min(C::kTile, len - tile * C::kTile), k_stage,
          k_stage + C::kStages * C::kStageBytes, stage_offset);
      __syncthreads();
    }
    const int first = w.kv_start + tile * C::kTile + wk * C::kWarpTokens;  // warp's first position
    // Else no row of this warp sees any of the slice: skip it.
    if (first <= warp_max && first + C::kWarpTokens - 1 >= warp_lo) {
      float s[C::kRowTiles][C::kNT][4];
      prefill_qk<C>(q_base, k_smem + st_idx * C::kStageBytes, wq, wk, s);
      u32 pa[C::kRowTiles][C::kNT / 2][4];
      const int pos0 = first + 2 * (lane % 4);
      if constexpr (Tr::kPerLogit) {
        if (first + C::kWarpTokens - 1 <= warp_min) {
          prefill_softmax_variant<C, false>(p, w, st, s, pos0, lim, rp, pa, sm_scale_log2);
        } else {
          prefill_softmax_variant<C, true>(p, w, st, s, pos0, lim, rp, pa, sm_scale_log2);
        }
      } else if (first + C::kWarpTokens - 1 <= warp_min) {
        prefill_softmax<C, false>(st, s, pos0, lim, sm_scale_log2, pa);
      } else {
        prefill_softmax<C, true>(st, s, pos0, lim, sm_scale_log2, pa);
      }
      prefill_pv<C>(st, pa, v_smem + st_idx * C::kStageBytes, wk);
    }
    __syncthreads();  // this stage is refilled by a later iteration
  }
  cp_async_wait<0>();  // the Q load of an item with no KV tiles, and trailing empty groups

  if constexpr (C::kWarpsKV == 1) {
    prefill_write_warp<C>(p, w, st, wq, valid_rows);
  } else {
    __syncthreads();
    prefill_merge_warps<C>(p, w, st, valid_rows, smem + C::kQBytes);
    __syncthreads();  // the shared memory is reused by the next work item
  }
}

template <class Config, class V = DefaultVariant>
__global__ void __launch_bounds__(Config::kThreads)
    batch_prefill_kernel(const __grid_constant__ PrefillParams p) {
  typedef PrefillWithVariant<Config, V> C;
  extern __shared__ __align__(128) unsigned char smem[];
  const int begin = p.plan.cta_work_indptr[blockIdx.x];
  const int end = p.plan.cta_work_indptr[blockIdx.x + 1];
  pdl_launch_dependents();
  pdl_wait();  // the plan is this call's own; q, KV, outputs and split state may not be yet
  for (int wi = begin; wi < end; ++wi) {
    const PrefillWorkItem w = p.plan.work[wi];
    prefill_work_item<C>(p, w, smem);
    if (w.slot >= 0) prefill_arrive<C>(p, w);
  }
}

}  // namespace flashkv
