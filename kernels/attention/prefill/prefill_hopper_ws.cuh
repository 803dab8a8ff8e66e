// The Hopper prefill kernel (sm_90a), warp-specialized as FA3: two consumer warpgroups compute
// (the wgmma building blocks of prefill_hopper.cuh: a 128-row query tile, S = Q Kᵀ and O += P V
// on wgmma, P V of tile t-1 under the softmax of tile t) and a producer warpgroup loads. The query
// tile is always a TMA box; KV tiles are TMA boxes where the KV allows (PrefillParams::kv_tma:
// ragged KV or pages of >= 16 tokens, work items starting on a tile), else the producer's 128
// threads gather them with cp.async (any page size). Why: with loads by every thread each KV tile
// needed a CTA-wide barrier (its data visible, its stage free); on the H200 a quarter of the warps'
// time went to waiting at it (ncu source counters, NOTES.md), and the two warpgroups stayed in
// step, so neither's softmax ran under the other's wgmma. Here stages are handed over by mbarriers:
//   full[s]      KV tile t (t % kStages == s) landed (TMA: tx bytes; cp.async: 128 arrivals)
//   k_empty[s]   every consumer warp's S = Q K(t)ᵀ is done: K stage t % kKStages may be refilled
//   v_empty[s]   every consumer warp's P·V(t) is done: V stage t % kStages may be refilled
//   q_full[b], q_empty[b]   the same for the query tile of the item with sequence number %
//   kQBuffers
// A barrier's n-th phase belongs to the n-th tile (or item) that uses its slot; the producer's
// first wait on an empty barrier checks the phase before the first (complete at init). The
// consumer warpgroups take turns issuing a step's wgmma (named barriers: FA3's ping-pong).
//
// Threads 0-255 are the consumers (warpgroups 0 and 1: the rows, epilogue and merge code index by
// threadIdx.x), threads 256-383 the producer. setmaxnreg moves registers from the producer to the
// consumers (PrefillWsConfig: 24/240 with TMA, 40/232 with the cp.async gather). The KV path is a
// template parameter: one kernel per path.
#pragma once

#include "attention/prefill/prefill_hopper.cuh"
#include "attention/prefill/prefill_hopper_variant.cuh"
#include "primitives/cp_async.cuh"
#include "primitives/named_barrier.cuh"
#include "primitives/pdl.cuh"
#include "primitives/tma.cuh"

namespace flashkv {

// The producer warp issues KV tile `tile` of item w by TMA, counted on barrier `bar` (lane 0's
// arrival expects the bytes): lane b the 16-token box b of K and V (kTma16 rows of one page, or of
// ragged rows), every 64-column block, for the whole 16-token groups of the item's tokens; lane j
// the j-th token of the group the item ends in, by the one-token maps, where the item ends inside
// one. So no row past kv_end is read: a cache's slots past a request's last token may hold NaN
// (torch.empty), and P = 0 there would not keep 0 x NaN out of P·V. V rows past kv_end keep earlier
// tiles' KV (finite; the V stages start zeroed); K rows there may hold anything, their logits are
// masked by a select. `page`: lane b's page id
// (paged KV), read by prefill_tma_page.
constexpr int kTma16 = 16;

template <class C>
__device__ __forceinline__ void prefill_tma_kv_tile(const PrefillParams& p,
                                                    const PrefillWorkItem& w, int tile, int page,
                                                    u32 k_stage, u32 v_stage, u32 bar) {
  constexpr int kColBlocks = C::kHeadDim / 64;
  static_assert(C::kTile % kTma16 == 0 && C::kTile / kTma16 <= 32,
                "a tile is whole 16-token boxes, a lane each");
  const int lane = threadIdx.x % 32;
  const int pos0 = w.kv_start + tile * C::kTile;
  const int valid = min(C::kTile, w.kv_end - pos0);
  const int boxes = valid / kTma16, rest = valid % kTma16;
  // Paged: the page of the group the item ends in is lane `boxes`'s (a group lies in one page).
  const int rest_page = __shfl_sync(0xffffffffu, page, boxes % 32);
  if (lane == 0) mbarrier_arrive_expect_tx(bar, (u32)(valid * 128 * kColBlocks * 2));
  const auto load = [&](const TmaDesc* k, const TmaDesc* v, int row, int pg) {
    const int pos = pos0 + row;
    const int token = C::kKV == kRaggedKV ? w.page_base + pos : pos & (p.page_size - 1);
    const int page_id = C::kKV == kRaggedKV ? 0 : pg;
#pragma unroll
    for (int cb = 0; cb < kColBlocks; ++cb) {
      const u32 off = (u32)(cb * (C::kTile * 128) + row * 128);
      tma_load_4d(k_stage + off, k, bar, cb * 64, token, w.kv_head, page_id);
      tma_load_4d(v_stage + off, v, bar, cb * 64, token, w.kv_head, page_id);
    }
  };
  if (lane < boxes) load(&p.k_tma, &p.v_tma, lane * kTma16, page);
  if (lane < rest) load(&p.k1_tma, &p.v1_tma, boxes * kTma16 + lane, rest_page);
}

// Lane b's page id for 16-token box b of KV tile `tile` of item w (paged KV by TMA; 0 past it).
template <class C>
__device__ __forceinline__ int prefill_tma_page(const PrefillParams& p, const PrefillWorkItem& w,
                                                int tile) {
  if constexpr (C::kKV == kRaggedKV) {
    return 0;
  } else {
    const int lane = threadIdx.x % 32;
    const int pos = w.kv_start + tile * C::kTile + lane * kTma16;
    return lane * kTma16 < C::kTile && pos < w.kv_end
               ? p.kv_indices[w.page_base + (pos >> p.page_shift)]
               : 0;
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
  if (threadIdx.x % 32 == 0)
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar_at(b, i)) : "memory");
}

// The producer's cp.async loads (KV not loadable by TMA: pages of 1-15 tokens, or work items not
// starting on a tile): the loaders of prefill_loader.cuh over the producer warpgroup's 128
// threads (threadIdx.x 256-383). Rows past kv_end are zero-filled.
template <class C>
struct PrefillProducerLoads : C {
  static constexpr int kThreads = 128;
  static constexpr int kLoaderThreadBase = C::kThreads;
  static constexpr int kLoads = C::kTile * C::kChunks / 128;
  static_assert(C::kTile * C::kChunks % 128 == 0,
                "a KV tile splits evenly over the producer's threads");
};

// fp8 KV: the producer's cp.async gather of fp8 rows into a staging slot (rows of kHeadDim
// bytes, plain), widened afterwards into the 16-bit stage (prefill_ws_widen_fp8). A thread widens
// exactly the 16-byte chunks it loaded, so its own cp.async wait is all the ordering it needs.
template <class C>
struct PrefillProducerLoadsFp8 : C {
  using kv_t = typename C::kv_mem_t;
  static constexpr int kThreads = 128;
  static constexpr int kLoaderThreadBase = C::kThreads;
  static constexpr int kKVChunks = C::kHeadDim / 16;
  static constexpr int kLoads = C::kTile * kKVChunks / 128;
  static constexpr int kSlotBytes = 2 * C::kTile * C::kHeadDim;  // K, then V
  __device__ __forceinline__ static u32 kv_offset(int row, int chunk) {
    return (u32)((row * kKVChunks + chunk) * 16);
  }
  static_assert(C::kTile * kKVChunks % 128 == 0, "a KV tile splits evenly over the producer");
};

__device__ __forceinline__ uint4 ld_shared_v4(u32 addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
__device__ __forceinline__ void st_shared_v4(u32 addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

// Eight fp8 values (two words) widened to eight elements of T (one 16-byte chunk), exactly.
template <class T, class F>
__device__ __forceinline__ uint4 widen_fp8x8(u32 lo, u32 hi) {
  return make_uint4(fp8x2_to_16x2<T, F>(lo), fp8x2_to_16x2<T, F>(lo >> 16), fp8x2_to_16x2<T, F>(hi),
                    fp8x2_to_16x2<T, F>(hi >> 16));
}

// This producer thread's chunks of the staged fp8 tile `slot` widened into the 16-bit K and V
// stages (the consumers' swizzled layout), after its copies into the slot landed. Thread c of a
// row widens fp8 chunk c into 16-bit chunks 2c and 2c + 1. A 16-byte store is served a
// quarter-warp at a time, here one row's 8 threads: chunks 2c of threads c < 4 and c >= 4 lie in
// different 128-byte column blocks but at the same swizzled 16-byte slots (2-way bank
// conflicts, 4.1 M extra wavefronts per ms of GQA P4 in ncu-prefill-fp8-2026-12-02.txt), so
// threads with c / 4 odd store their odd chunk first: each store's 8 slots differ.
template <class C>
__device__ __forceinline__ void prefill_ws_widen_fp8(u32 slot, u32 k_stage, u32 v_stage) {
  typedef PrefillProducerLoadsFp8<C> PL;
  typedef PrefillKVLoads<PL> L;
  typedef typename C::q_t T;
  typedef typename C::kv_mem_t F;
  const int c = L::chunk();
  const bool odd_first = (c / 4) & 1;
#pragma unroll
  for (int j = 0; j < PL::kLoads; ++j) {
    const int row = L::row(j);
    const u32 src = slot + PL::kv_offset(row, c);
    uint4 k8 = ld_shared_v4(src), v8 = ld_shared_v4(src + C::kTile * C::kHeadDim);
    u32 first = C::template smem_offset<C::kTile>(row, 2 * c);
    u32 second = C::template smem_offset<C::kTile>(row, 2 * c + 1);
    if (odd_first) {
      const u32 t = first;
      first = second;
      second = t;
      k8 = make_uint4(k8.z, k8.w, k8.x, k8.y);
      v8 = make_uint4(v8.z, v8.w, v8.x, v8.y);
    }
    st_shared_v4(k_stage + first, widen_fp8x8<T, F>(k8.x, k8.y));
    st_shared_v4(v_stage + first, widen_fp8x8<T, F>(v8.x, v8.y));
    st_shared_v4(k_stage + second, widen_fp8x8<T, F>(k8.z, k8.w));
    st_shared_v4(v_stage + second, widen_fp8x8<T, F>(v8.z, v8.w));
  }
}

// The fp8 producer's hand-over of global tile g (loads landed: the caller waited): waits for its
// K and V stages to be free, widens into them, arrives on full (count 128; the arrival releases
// the stores, the consumers' proxy fence orders them before their wgmma).
template <class C>
__device__ __forceinline__ void prefill_ws_hand_over_fp8(int g, u32 staging, u32 k_smem, u32 v_smem,
                                                         PrefillHopperBarriers<C>& bars) {
  typedef PrefillProducerLoadsFp8<C> PL;
  mbarrier_wait_parity(bar_at(bars.k_empty, g % C::kKStages), ((g / C::kKStages) & 1) ^ 1);
  mbarrier_wait_parity(bar_at(bars.v_empty, g % C::kStages), ((g / C::kStages) & 1) ^ 1);
  prefill_ws_widen_fp8<C>(staging + (g % C::kStagingSlots) * PL::kSlotBytes,
                          k_smem + (g % C::kKStages) * C::kStageBytes,
                          v_smem + (g % C::kStages) * C::kStageBytes);
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar_at(bars.full, g % C::kStages))
               : "memory");
}

// The producer: every work item's query tile and KV tiles, in the consumers' order, each once its
// slot is free. The query tile is one TMA box per 64 columns (thread 0 of the warpgroup). KV by TMA
// (C::kKvTma): one warp, full[s] expects the boxes' bytes; else by cp.async: all 128 threads, each
// arriving on full[s] (count 128) once its copies landed.
// fp8 KV (gathered, never by TMA): tile g's fp8 rows go to staging slot g % kStagingSlots, and the
// oldest staged tile is widened and handed over whenever the slots are full, so kStagingSlots - 1
// tiles stay in flight. Before the query tile of item `seq` waits for its buffer, every tile of
// item seq - kQBuffers (the buffer's last user, which the consumers release after that item's
// last tile) is handed over.
template <class C>
__device__ __forceinline__ void prefill_ws_produce(const PrefillParams& p, int begin, int end,
                                                   u32 q_smem, u32 k_smem, u32 v_smem,
                                                   PrefillHopperBarriers<C>& bars, u32 staging) {
  typedef PrefillProducerLoads<C> PL;
  constexpr bool kFp8 = is_fp8<typename C::kv_mem_t>();
  constexpr int kColBlocks = C::kHeadDim / 64;
  const int ptid = threadIdx.x - C::kThreads;
  int g = 0, seq = 0;
  int handed = 0;                   // fp8: tiles [0, handed) are handed over, [handed, g) staged
  int item_end[C::kQBuffers] = {};  // fp8: the tile after each query buffer's last item
  for (int wi = begin; wi < end; ++wi) {
    const PrefillWorkItem w = p.plan.work[wi];
    const int tiles = (w.kv_end - w.kv_start + C::kTile - 1) / C::kTile;
    // Tiles left of every row's window are never loaded (the consumers skip them alike).
    const int t0 = prefill_hopper_first_tile<C>(p, w, tiles);
    if (tiles == t0) continue;  // the consumers write it empty
    if constexpr (kFp8) {
      if (seq >= C::kQBuffers && handed < item_end[seq % C::kQBuffers]) {
        cp_async_wait<0>();
        while (handed < g) prefill_ws_hand_over_fp8<C>(handed++, staging, k_smem, v_smem, bars);
      }
    }
    const int b = seq % C::kQBuffers;
    const u32 q_buf = q_smem + b * C::kQBytes;
    if (ptid == 0) {
      mbarrier_wait_parity(bar_at(bars.q_empty, b), ((seq / C::kQBuffers) & 1) ^ 1);
      // Box: 64 columns x group heads x q_tma_tokens tokens = rows (token, head) in tile order.
      mbarrier_arrive_expect_tx(bar_at(bars.q_full, b),
                                (u32)(kColBlocks * 128 * p.group * p.q_tma_tokens));
#pragma unroll
      for (int cb = 0; cb < kColBlocks; ++cb)
        tma_load_4d(q_buf + cb * (C::kRows * 128), &p.q_tma, bar_at(bars.q_full, b), cb * 64,
                    w.kv_head * p.group, w.q_base + w.q_start, 0);
    }
    for (int tile = t0; tile < tiles; ++tile, ++g) {
      const u32 k_stage = k_smem + (g % C::kKStages) * C::kStageBytes;
      const u32 v_stage = v_smem + (g % C::kStages) * C::kStageBytes;
      const u32 full = bar_at(bars.full, g % C::kStages);
      if constexpr (kFp8) {
        typedef PrefillProducerLoadsFp8<C> PL8;
        PrefillTilePages<PL8> pages;
        prefill_tile_pages<PL8>(p, w, tile, pages);
        const u32 slot = staging + (g % C::kStagingSlots) * PL8::kSlotBytes;
        prefill_issue_kv_tile<PL8>(p, w, tile, pages, slot, slot + C::kTile * C::kHeadDim);
        cp_async_commit();
        if (g + 1 - handed == C::kStagingSlots) {  // slots full: the oldest tile's copies landed
          cp_async_wait<C::kStagingSlots - 1>();
          prefill_ws_hand_over_fp8<C>(handed++, staging, k_smem, v_smem, bars);
        }
      } else if constexpr (C::kKvTma) {
        const int page = prefill_tma_page<C>(p, w, tile);
        if (ptid == 0) {
          mbarrier_wait_parity(bar_at(bars.k_empty, g % C::kKStages), ((g / C::kKStages) & 1) ^ 1);
          mbarrier_wait_parity(bar_at(bars.v_empty, g % C::kStages), ((g / C::kStages) & 1) ^ 1);
        }
        __syncwarp();
        prefill_tma_kv_tile<C>(p, w, tile, page, k_stage, v_stage, full);
      } else {
        PrefillTilePages<PL> pages;
        prefill_tile_pages<PL>(p, w, tile, pages);
        mbarrier_wait_parity(bar_at(bars.k_empty, g % C::kKStages), ((g / C::kKStages) & 1) ^ 1);
        mbarrier_wait_parity(bar_at(bars.v_empty, g % C::kStages), ((g / C::kStages) & 1) ^ 1);
        prefill_issue_kv_tile<PL>(p, w, tile, pages, k_stage, v_stage);
        cp_async_mbarrier_arrive(full);
      }
    }
    if constexpr (kFp8) item_end[seq % C::kQBuffers] = g;
    ++seq;
  }
  if constexpr (kFp8) {
    cp_async_wait<0>();
    while (handed < g) prefill_ws_hand_over_fp8<C>(handed++, staging, k_smem, v_smem, bars);
  }
}

// The kernel's config with its KV path fixed at compile time (KV_TMA: TMA boxes by one producer
// warp; else the producer warpgroup's cp.async gather) and the setmaxnreg split that goes with
// it: the TMA producer needs 24 registers, the gather 40 (it spills page ids at 24), the fp8
// gather-and-widen 56 (at 40 ptxas spilled 80 bytes, and the H200 profile of GQA P4 showed 6.5 M
// local-memory requests against the f16 kernel's 6 K: ncu-prefill-fp8-2026-12-02.txt); either
// way producer x 128 + consumer x 256 = the 168 x 384 the launch bound gives (the host checks
// 168). The consumers fit 224 without spilling (ptxas -v, every head_dim).
template <class C0, bool KV_TMA>
struct PrefillWsConfig : C0 {
  static constexpr bool kKvTma = KV_TMA;
  static constexpr int kProducerRegs = KV_TMA ? 24 : is_fp8<typename C0::kv_mem_t>() ? 56 : 40;
  static constexpr int kConsumerRegs = KV_TMA ? 240 : is_fp8<typename C0::kv_mem_t>() ? 224 : 232;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 256 == 168 * 384,
                "the register split fills the launch bound");
};

// Named barriers 2 and 3: warpgroup w waits at 2 + w for its turn to issue (bar 1: prefill_arrive).
constexpr int kPingPongBarrier = 2;

// One consumer step: KV tile g (the item's tile `tile`) has its S = Q Kᵀ issued, then
// (kPendingPV) the previous tile's P·V with the P in `pa`, whose wgmma runs under this tile's
// softmax; K(g) is handed back once S lands, V(g-1) once that P·V does (and the query tile after
// the item's last S). `pa` then holds this tile's P. Two instantiations, no wgmma under a
// condition: ptxas serializes every wgmma of a kernel that has one (C7518).
// sm_scale_log2: the plan's, times the key scale of an fp8 cache.
template <class C, bool kPendingPV>
__device__ __forceinline__ void prefill_ws_step(const PrefillParams& p, const PrefillWorkItem& w,
                                                int tile, int g, bool last, u32 q_buf, int qb,
                                                u32 k_smem, u32 v_smem,
                                                PrefillHopperBarriers<C>& bars, int wg,
                                                const PrefillHopperRows& rows,
                                                const PrefillRowPos<C>& rp, PrefillWarpState<C>& st,
                                                u32 (&pa)[1][C::kNT / 2][4], float sm_scale_log2) {
  const int lane = threadIdx.x % 32;
  float(&o)[C::kHeadDim / 2] = reinterpret_cast<float(&)[C::kHeadDim / 2]>(st.o);
  mbarrier_wait_parity(bar_at(bars.full, g % C::kStages),
                       (g / C::kStages) & 1);  // K(g), V(g) landed
  // cp.async writes shared memory through the generic proxy, wgmma reads it through the async
  // proxy: the mbarrier makes the writes visible to this thread, the fence to its wgmma (TMA
  // writes are async-proxy already).
  if constexpr (!C::kKvTma) fence_proxy_async_shared();
  float s[1][C::kNT][4];
  float(&sf)[C::kTile / 2] = reinterpret_cast<float(&)[C::kTile / 2]>(s);
  // Ping-pong (FA3): the warpgroups take turns issuing a step's wgmma, so one's softmax runs
  // while the other's matrix products use the tensor cores.
  named_barrier(kPingPongBarrier + wg, 256);
  prefill_hopper_qk<C>(q_buf, k_smem + (g % C::kKStages) * C::kStageBytes, wg, sf);
  if constexpr (kPendingPV)
    prefill_hopper_pv<C>(pa, v_smem + ((g - 1) % C::kStages) * C::kStageBytes, o);
  named_barrier_arrive(kPingPongBarrier + (1 - wg), 256);
  if constexpr (kPendingPV) {
    wgmma_wait<1>();  // S (committed first) has landed; P·V may still run
  } else {
    wgmma_wait<0>();
  }
  wgmma_fence_operands(sf);
  consumer_release(bars.k_empty, g % C::kKStages);
  if (last) consumer_release(bars.q_empty, qb);
  float rescale[1][2];
  u32 pa_new[1][C::kNT / 2][4];  // not pa: the P·V in flight reads it
  const int first = w.kv_start + tile * C::kTile;
  const int pos0 = first + 2 * (lane % 4);
  // The causal limit (and a window's key range), per warp: every row sees the whole tile.
  const bool unmasked = first + C::kTile - 1 <= rows.warp_min && first >= rows.warp_lo_max;
  if constexpr (kPrefillHopperPerLogit<C>) {
    if (unmasked) {
      prefill_softmax_variant<C, false, false>(p, w, st, s, pos0, rows.lim, rp, pa_new,
                                               sm_scale_log2, rescale);
    } else {
      prefill_softmax_variant<C, true, false>(p, w, st, s, pos0, rows.lim, rp, pa_new,
                                              sm_scale_log2, rescale);
    }
  } else if (unmasked) {
    prefill_softmax<C, false, false>(st, s, pos0, rows.lim, sm_scale_log2, pa_new, rescale);
  } else if constexpr (kWindowIsKeyRange<typename C::Variant>) {
    prefill_softmax<C, true, false>(st, s, pos0, rows.lim, sm_scale_log2, pa_new, rescale, rows.lo);
  } else {
    prefill_softmax<C, true, false>(st, s, pos0, rows.lim, sm_scale_log2, pa_new, rescale);
  }
  if constexpr (kPendingPV) {
    wgmma_wait<0>();
    wgmma_fence_operands(o);
    consumer_release(bars.v_empty, (g - 1) % C::kStages);
  }
  // pa = pa_new, as asm after the wait: a plain copy would be folded into the softmax, defining
  // the in-flight P·V's operand registers early (ptxas then serializes every wgmma).
#pragma unroll
  for (int j = 0; j < C::kNT / 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      asm volatile("mov.b32 %0, %1;\n" : "=r"(pa[0][j][e]) : "r"(pa_new[0][j][e]));
  if constexpr (kPendingPV) {
    if (__any_sync(0xffffffffu, rescale[0][0] != 1.f || rescale[0][1] != 1.f)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) st.rescale(0, h, rescale[0][h]);
    }
  }
}

// One consumer warpgroup's work item: its tiles [t0, tiles) (t0: the first any row's window sees)
// are the CTA's global tiles [g0, g0 + tiles - t0), its query tile in buffer seq % kQBuffers.
// Every warpgroup runs every such tile (rows that see none of it get P = 0). Returns how many
// tiles it ran.
template <class C>
__device__ __forceinline__ int prefill_ws_work_item(const PrefillParams& p,
                                                    const PrefillWorkItem& w, int g0, int seq,
                                                    u32 q_smem, u32 k_smem, u32 v_smem,
                                                    PrefillHopperBarriers<C>& bars, int wg) {
  const int tiles = (w.kv_end - w.kv_start + C::kTile - 1) / C::kTile;
  const int t0 = prefill_hopper_first_tile<C>(p, w, tiles);
  PrefillHopperRows rows = prefill_hopper_rows<C>(p, w);
  prefill_hopper_window_rows<C>(p, w, rows);
  const PrefillRowPos<C> rp = prefill_hopper_row_pos<C>(p, w);
  PrefillWarpState<C> st;
  st.init();
  float(&o)[C::kHeadDim / 2] = reinterpret_cast<float(&)[C::kHeadDim / 2]>(st.o);
  const int qb = seq % C::kQBuffers;
  const u32 q_buf = q_smem + qb * C::kQBytes;
  u32 pa[1][C::kNT / 2][4];  // P of the previous tile, pending its P·V
  float sm_scale_log2 = p.sm_scale_log2;
  // fp8 keys are dequantized through the logits: q·(k * s) = (q·k) * s.
  if constexpr (is_fp8<typename C::kv_mem_t>()) sm_scale_log2 *= kv_scale_k(p.scale, w.kv_head);
  if (tiles > t0) {
    mbarrier_wait_parity(bar_at(bars.q_full, qb), (seq / C::kQBuffers) & 1);
    prefill_hopper_transform_q<C>(p, w, q_buf, wg);
    prefill_ws_step<C, false>(p, w, t0, g0, tiles == t0 + 1, q_buf, qb, k_smem, v_smem, bars, wg,
                              rows, rp, st, pa, sm_scale_log2);
    for (int tile = t0 + 1; tile < tiles; ++tile)
      prefill_ws_step<C, true>(p, w, tile, g0 + tile - t0, tile == tiles - 1, q_buf, qb, k_smem,
                               v_smem, bars, wg, rows, rp, st, pa, sm_scale_log2);
    const int g = g0 + tiles - t0 - 1;
    prefill_hopper_pv<C>(pa, v_smem + (g % C::kStages) * C::kStageBytes, o);
    wgmma_wait<0>();
    wgmma_fence_operands(o);
    consumer_release(bars.v_empty, g % C::kStages);
  }
  prefill_write_warp<C>(p, w, st, threadIdx.x / 32, rows.valid_rows);
  return tiles - t0;
}

// KV_TMA: the instantiation for p.kv_tma (the host launches the one that matches). Two kernels,
// not a branch: with the cp.async gather in the same kernel the producer needs 40 registers and
// spills, and the TMA kernel ran 5-10 % slower on the H200 (P1 GQA 375 -> 416 us, NOTES.md).
template <class Config, class V = DefaultVariant, bool KV_TMA = true>
__global__ void __launch_bounds__(Config::kThreads + 128, 1)
    batch_prefill_hopper_ws_kernel(const __grid_constant__ PrefillParams p) {
  typedef PrefillWsConfig<PrefillWithVariant<Config, V>, KV_TMA> C;
  static_assert(kPrefillHopperRuns<typename C::Traits>,
                "variants that rewrite keys or values take the mma.sync kernel");
  static_assert(C::kThreads == 256, "two consumer warpgroups");
  static_assert(!(KV_TMA && is_fp8<typename C::kv_mem_t>()),
                "fp8 KV is gathered and widened by the producer, never loaded by TMA");
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ PrefillHopperBarriers<C> bars;
  const u32 q_smem = (smem_addr(smem) + 1023u) & ~1023u;
  const u32 k_smem = q_smem + C::kQBuffers * C::kQBytes;
  const u32 v_smem = k_smem + C::kKStages * C::kStageBytes;
  if (threadIdx.x == 0) {
    for (int i = 0; i < C::kStages; ++i) {
      mbarrier_init(bar_at(bars.full, i),
                    C::kKvTma ? 1 : 128);  // TMA: one arrival + bytes; cp.async: 128
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
  // could hold NaN), then earlier tiles' KV, finite (prefill_tma_kv_tile reads no row past kv_end).
  for (u32 a = v_smem + threadIdx.x * 16; a < v_smem + C::kStages * C::kStageBytes;
       a += (C::kThreads + 128) * 16)
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(a), "r"(0u) : "memory");
  fence_proxy_async_shared();
  pdl_launch_dependents();
  __syncthreads();
  // Under PDL the set-up above ran while the previous kernel drained; what follows reads q, KV
  // and page ids and writes outputs and split state, which that kernel may still own.
  pdl_wait();
  const int begin = p.plan.cta_work_indptr[blockIdx.x];
  const int end = p.plan.cta_work_indptr[blockIdx.x + 1];
  // The warpgroup, warp-uniform as far as ptxas can see (a shuffle's result): wgmma after a
  // branch on threadIdx.x would be serialized (C7518).
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
  if (wg == C::kThreads / 128) {  // the producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kProducerRegs) : "memory");
    if (!C::kKvTma || threadIdx.x < C::kThreads + 32)  // TMA: one warp issues every box
      prefill_ws_produce<C>(p, begin, end, q_smem, k_smem, v_smem, bars,
                            v_smem + C::kStages * C::kStageBytes);
    if constexpr (!C::kKvTma) cp_async_wait_all();  // no copy outlives its thread
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kConsumerRegs) : "memory");
  if (wg == 1) named_barrier_arrive(kPingPongBarrier, 256);  // warpgroup 0 issues first
  int g = 0, seq = 0;
  for (int wi = begin; wi < end; ++wi) {
    const PrefillWorkItem w = p.plan.work[wi];
    const int tiles = prefill_ws_work_item<C>(p, w, g, seq, q_smem, k_smem, v_smem, bars, wg);
    g += tiles;
    seq += tiles > 0;
    if (w.slot >= 0) prefill_arrive<C>(p, w);
  }
}

}  // namespace flashkv
