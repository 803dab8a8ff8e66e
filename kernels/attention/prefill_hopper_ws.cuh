// The Hopper prefill kernel, warp-specialized (FA3's structure): where every load is a TMA box
// (PrefillParams::kv_tma: ragged KV or pages of >= 16 tokens; query tiles always), one producer
// warp issues them and the two consumer warpgroups of prefill_hopper.cuh compute, each at its own
// pace. Why: with the loads by every thread (cp.async) each KV tile needs a CTA-wide barrier (its
// data visible, its stage free), and on the H200 a quarter of the warps' time went to waiting at
// it (ncu source counters, NOTES.md); the two warpgroups stayed in step, so neither's softmax ran
// under the other's wgmma. Here stages are handed over by mbarriers:
//   full[s]      the producer's TMA boxes of KV tile t (t % kStages == s) landed (tx bytes)
//   k_empty[s]   every consumer warp's S = Q K(t)ᵀ is done: K stage t % kKStages may be refilled
//   v_empty[s]   every consumer warp's P·V(t) is done: V stage t % kStages may be refilled
//   q_full[b], q_empty[b]   the same for the query tile of the item with sequence number % kQBuffers
// A barrier's n-th phase belongs to the n-th tile (or item) that uses its slot; the producer's
// first wait on an empty barrier checks the phase before the first (complete at init).
//
// Threads 0-255 are the consumers (warpgroups 0 and 1: the rows, epilogue and merge code of the
// other kernel index by threadIdx.x), threads 256-383 the producer warpgroup, of which one warp
// works. setmaxnreg moves registers from the producer (24) to the consumers (240).
#pragma once

#include "attention/prefill_hopper.cuh"
#include "primitives/named_barrier.cuh"
#include "primitives/tma.cuh"

namespace flashkv {

// Warp 0 issues KV tile `tile` of item w by TMA (p.kv_tma): lane b loads box b (tokens
// [b * box, b * box + box) of the tile; one page, or the tile's part of one) of K and V, every
// 64-column block, counted on barrier `bar`, whose arrival (lane 0) expects the bytes of all the
// boxes that hold the item's tokens. `page`: lane b's page id (paged KV). Box rows past the item's
// KV are zeroed by the step that waits for the tile (prefill_ws_tile_landed).
template <class C>
__device__ __forceinline__ void prefill_tma_kv_tile(const PrefillParams& p, const PrefillWorkItem& w, int tile,
                                                    int page, u32 k_stage, u32 v_stage, u32 bar) {
  constexpr int kColBlocks = C::kHeadDim / 64;
  const int lane = threadIdx.x % 32;
  const int box = p.kv_tma_box;
  const int pos0 = w.kv_start + tile * C::kTile;
  const int boxes = (min(C::kTile, w.kv_end - pos0) + box - 1) / box;
  if (lane == 0) mbarrier_arrive_expect_tx(bar, (u32)(boxes * box * 128 * kColBlocks * 2));
  if (lane < boxes) {
    const int pos = pos0 + lane * box;
    const int token = C::kKV == kRaggedKV ? w.page_base + pos : pos & (p.page_size - 1);
    const int page_id = C::kKV == kRaggedKV ? 0 : page;
#pragma unroll
    for (int cb = 0; cb < kColBlocks; ++cb) {
      const u32 off = (u32)(cb * (C::kTile * 128) + lane * box * 128);
      tma_load_4d(k_stage + off, &p.k_tma, bar, cb * 64, token, w.kv_head, page_id);
      tma_load_4d(v_stage + off, &p.v_tma, bar, cb * 64, token, w.kv_head, page_id);
    }
  }
}

// Lane b's page id for box b of KV tile `tile` of item w (paged KV by TMA), read a tile ahead.
template <class C>
__device__ __forceinline__ int prefill_tma_page(const PrefillParams& p, const PrefillWorkItem& w, int tile) {
  if constexpr (C::kKV == kRaggedKV) {
    return 0;
  } else {
    const int lane = threadIdx.x % 32;
    const int pos = w.kv_start + tile * C::kTile + lane * p.kv_tma_box;
    return lane * p.kv_tma_box < C::kTile && pos < w.kv_end ? p.kv_indices[w.page_base + (pos >> p.page_shift)] : 0;
  }
}

template <class C>
struct PrefillHopperBarriers {
  u64 full[C::kStages];
  u64 k_empty[C::kKStages];
  u64 v_empty[C::kStages];
  u64 q_full[C::kQBuffers];
  u64 q_empty[C::kQBuffers];
};

__device__ __forceinline__ u32 bar_at(const u64* b, int i) { return smem_addr(b + i); }

// The consumer warps' arrival on an empty barrier (count: 8, lane 0 of each warp), after the
// warp's wgmma reading the stage completed.
__device__ __forceinline__ void consumer_release(const u64* b, int i) {
  if (threadIdx.x % 32 == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar_at(b, i)) : "memory");
}

// The producer warp: every work item's query tile and KV tiles, in the consumers' order, each
// once its slot is free.
template <class C>
__device__ __forceinline__ void prefill_ws_produce(const PrefillParams& p, int begin, int end, u32 q_smem,
                                                   u32 k_smem, u32 v_smem, PrefillHopperBarriers<C>& bars) {
  constexpr int kColBlocks = C::kHeadDim / 64;
  const int lane = threadIdx.x % 32;
  int g = 0, seq = 0;
  for (int wi = begin; wi < end; ++wi) {
    const PrefillWorkItem w = p.plan.work[wi];
    const int tiles = (w.kv_end - w.kv_start + C::kTile - 1) / C::kTile;
    if (tiles == 0) continue;  // the consumers write it empty
    const int b = seq % C::kQBuffers;
    const u32 q_buf = q_smem + b * C::kQBytes;
    if (lane == 0) {
      mbarrier_wait_parity(bar_at(bars.q_empty, b), ((seq / C::kQBuffers) & 1) ^ 1);
      // Box: 64 columns x group heads x q_tma_tokens tokens = rows (token, head) in tile order.
      mbarrier_arrive_expect_tx(bar_at(bars.q_full, b), (u32)(kColBlocks * 128 * p.group * p.q_tma_tokens));
#pragma unroll
      for (int cb = 0; cb < kColBlocks; ++cb)
        tma_load_4d(q_buf + cb * (C::kRows * 128), &p.q_tma, bar_at(bars.q_full, b), cb * 64, w.kv_head * p.group,
                    w.q_base + w.q_start, 0);
    }
    for (int tile = 0; tile < tiles; ++tile, ++g) {
      const int page = prefill_tma_page<C>(p, w, tile);
      if (lane == 0) {
        mbarrier_wait_parity(bar_at(bars.k_empty, g % C::kKStages), ((g / C::kKStages) & 1) ^ 1);
        mbarrier_wait_parity(bar_at(bars.v_empty, g % C::kStages), ((g / C::kStages) & 1) ^ 1);
      }
      __syncwarp();
      prefill_tma_kv_tile<C>(p, w, tile, page, k_smem + (g % C::kKStages) * C::kStageBytes,
                             v_smem + (g % C::kStages) * C::kStageBytes, bar_at(bars.full, g % C::kStages));
    }
    ++seq;
  }
}

// Waits for KV tile g (of item w, its tile `tile`), then zeroes its V rows past the item's KV
// (tokens a box brought from beyond kv_end, rows no box wrote): P is 0 there, but 0 x NaN would
// not be; K needs nothing, those logits are masked. Both warpgroups zero them, each before its
// own P·V reads them (zeros over zeros where the other was first); a warpgroup's warps meet at
// barrier 2 + wg.
template <class C>
__device__ __forceinline__ void prefill_ws_tile_landed(const PrefillWorkItem& w, int tile, int g, u32 v_smem,
                                                       const PrefillHopperBarriers<C>& bars, int wg) {
  mbarrier_wait_parity(bar_at(bars.full, g % C::kStages), (g / C::kStages) & 1);
  const int valid = w.kv_end - (w.kv_start + tile * C::kTile);
  if (valid < C::kTile) {
    constexpr int kChunks = C::kHeadDim / 8;
    const u32 v_stage = v_smem + (g % C::kStages) * C::kStageBytes;
    for (int i = threadIdx.x % 128; i < (C::kTile - valid) * kChunks; i += 128) {
      const int row = valid + i / kChunks, chunk = i % kChunks;
      const u32 a = v_stage + (chunk / 8) * (C::kTile * 128) + row * 128 + (chunk % 8) * 16;
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(a), "r"(0u) : "memory");
    }
    fence_proxy_async_shared();
    named_barrier(2 + wg, 128);
  }
}

// One consumer warpgroup's work item: as prefill_hopper_work_item, with the stage hand-over by
// barriers instead of the CTA-wide sync. g0: the item's first global tile; seq: its query buffer.
template <class C>
__device__ __forceinline__ void prefill_ws_work_item(const PrefillParams& p, const PrefillWorkItem& w, int g0,
                                                     int seq, u32 q_smem, u32 k_smem, u32 v_smem,
                                                     PrefillHopperBarriers<C>& bars) {
  const int lane = threadIdx.x % 32, wg = threadIdx.x / 128;
  const int tiles = (w.kv_end - w.kv_start + C::kTile - 1) / C::kTile;
  const PrefillHopperRows rows = prefill_hopper_rows<C>(p, w);
  PrefillWarpState<C> st;
  st.init();
  float(&o)[C::kHeadDim / 2] = reinterpret_cast<float(&)[C::kHeadDim / 2]>(st.o);
  const int b = seq % C::kQBuffers;
  const u32 q_buf = q_smem + b * C::kQBytes;
  if (tiles > 0) mbarrier_wait_parity(bar_at(bars.q_full, b), (seq / C::kQBuffers) & 1);  // (none loaded else)
  u32 pa[1][C::kNT / 2][4];  // P of the previous tile, pending its P·V
  for (int tile = 0; tile < tiles; ++tile) {
    const int g = g0 + tile;
    prefill_ws_tile_landed<C>(w, tile, g, v_smem, bars, wg);
    float s[1][C::kNT][4];
    float(&sf)[C::kTile / 2] = reinterpret_cast<float(&)[C::kTile / 2]>(s);
    prefill_hopper_qk<C>(q_buf, k_smem + (g % C::kKStages) * C::kStageBytes, wg, sf);
    if (tile > 0) {
      prefill_hopper_pv<C>(pa, v_smem + ((g - 1) % C::kStages) * C::kStageBytes, o);
      wgmma_wait<1>();  // S (committed first) has landed; P·V may still run
    } else {
      wgmma_wait<0>();
    }
    wgmma_fence_operands(sf);
    consumer_release(bars.k_empty, g % C::kKStages);
    if (tile == tiles - 1) consumer_release(bars.q_empty, b);
    float rescale[1][2];
    u32 pa_new[1][C::kNT / 2][4];  // not pa: the P·V in flight reads it
    const int first = w.kv_start + tile * C::kTile;
    const int pos0 = first + 2 * (lane % 4);
    if (first + C::kTile - 1 <= rows.warp_min) {
      prefill_softmax<C, false, false>(st, s, pos0, rows.lim, p.sm_scale_log2, pa_new, rescale);
    } else {
      prefill_softmax<C, true, false>(st, s, pos0, rows.lim, p.sm_scale_log2, pa_new, rescale);
    }
    if (tile > 0) {
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      consumer_release(bars.v_empty, (g - 1) % C::kStages);
    }
    // pa = pa_new after the wait (see prefill_hopper_step).
#pragma unroll
    for (int j = 0; j < C::kNT / 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("mov.b32 %0, %1;\n" : "=r"(pa[0][j][e]) : "r"(pa_new[0][j][e]));
    if (tile > 0 && __any_sync(0xffffffffu, rescale[0][0] != 1.f || rescale[0][1] != 1.f)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) prefill_rescale_o(st, 0, h, rescale[0][h]);
    }
  }
  if (tiles > 0) {
    const int g = g0 + tiles - 1;
    prefill_hopper_pv<C>(pa, v_smem + (g % C::kStages) * C::kStageBytes, o);
    wgmma_wait<0>();
    wgmma_fence_operands(o);
    consumer_release(bars.v_empty, g % C::kStages);
  }
  prefill_write_warp<C>(p, w, st, threadIdx.x / 32, rows.valid_rows);
}

template <class Config, class V = DefaultVariant>
__global__ void __launch_bounds__(Config::kThreads + 128, 1)
    batch_prefill_hopper_ws_kernel(const __grid_constant__ PrefillParams p) {
  typedef PrefillWithVariant<Config, V> C;
  typedef typename C::Traits Tr;
  static_assert(!Tr::kPerLogit && !Tr::kQueryTransform && !Tr::kKVTransform && !Tr::kFirstVisibleKey &&
                    !Tr::kSink && !Tr::kOutputTransform && Tr::kUseSoftmax,
                "the Hopper prefill kernel runs plain attention; variants take the mma.sync kernel");
  static_assert(C::kThreads == 256, "two consumer warpgroups");
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ PrefillHopperBarriers<C> bars;
  const u32 q_smem = (smem_addr(smem) + 1023u) & ~1023u;
  const u32 k_smem = q_smem + C::kQBuffers * C::kQBytes;
  const u32 v_smem = k_smem + C::kKStages * C::kStageBytes;
  if (threadIdx.x == 0) {
    for (int i = 0; i < C::kStages; ++i) {
      mbarrier_init(bar_at(bars.full, i), 1);
      mbarrier_init(bar_at(bars.v_empty, i), 8);
    }
    for (int i = 0; i < C::kKStages; ++i) mbarrier_init(bar_at(bars.k_empty, i), 8);
    for (int i = 0; i < C::kQBuffers; ++i) {
      mbarrier_init(bar_at(bars.q_full, i), 1);
      mbarrier_init(bar_at(bars.q_empty, i), 8);
    }
    fence_mbarrier_init();
  }
  // V rows no box writes keep what the stage held: zeros at first (uninitialized shared memory
  // could hold NaN), then earlier tiles' finite KV; rows past an item's KV are zeroed per tile.
  for (u32 a = v_smem + threadIdx.x * 16; a < v_smem + C::kStages * C::kStageBytes; a += (C::kThreads + 128) * 16)
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(a), "r"(0u) : "memory");
  fence_proxy_async_shared();
  __syncthreads();
  const int begin = p.plan.cta_work_indptr[blockIdx.x];
  const int end = p.plan.cta_work_indptr[blockIdx.x + 1];
  if (threadIdx.x >= C::kThreads) {  // the producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x < C::kThreads + 32) prefill_ws_produce<C>(p, begin, end, q_smem, k_smem, v_smem, bars);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  int g = 0, seq = 0;
  for (int wi = begin; wi < end; ++wi) {
    const PrefillWorkItem w = p.plan.work[wi];
    const int tiles = (w.kv_end - w.kv_start + C::kTile - 1) / C::kTile;
    prefill_ws_work_item<C>(p, w, g, seq, q_smem, k_smem, v_smem, bars);
    g += tiles;
    seq += tiles > 0;
    if (w.slot >= 0) prefill_arrive<C>(p, w);
  }
}

}  // namespace flashkv
