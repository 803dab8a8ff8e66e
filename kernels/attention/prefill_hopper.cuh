// Batch prefill / append attention on Hopper's warpgroup MMA (wgmma, sm_90a): the same plan, work
// items, loaders, online softmax and epilogue as the mma.sync kernel (prefill.cuh), with the two
// matrix products moved to wgmma. Why a second kernel: on mma.sync every K/V fragment passes
// through registers (ldmatrix) and the kernel is latency-bound at 255 registers with the tensor
// pipe ~47 % busy (NOTES.md, "Profile at e3957d3"); wgmma reads K and V straight from shared
// memory, 64 rows x a whole KV tile per instruction, asynchronously, so one tile's softmax runs
// while the previous tile's P·V is on the tensor cores.
//
// A CTA is two warpgroups; warpgroup g owns rows [64 g, 64 g + 64) of the 128-row query tile, and
// warp w of the CTA rows [16 w, 16 w + 16): wgmma's accumulator layout gives each warp the
// mma.m16n8k16 C fragment of its 16 rows, so the per-warp softmax, masks and epilogue of the
// mma.sync kernel apply unchanged (kRowTiles = 1, kWarpRows = 16). Per KV tile and warpgroup:
//   S = Q Kᵀ    wgmma, Q and K from shared memory (K-major, 128-byte swizzle)
//   softmax     per warp, in registers; P packed to 16 bits as the A fragment
//   O += P V    wgmma, P from registers, V from shared memory (MN-major: transposed by wgmma),
//               issued in the next tile's step, after its S = Q Kᵀ, to overlap its softmax
// The KV pipeline is the mma.sync kernel's cp.async gather (any page size); only the shared
// layout differs (wgmma.cuh). Plain attention only: variants keep the mma.sync kernel. Where every
// load can be a TMA box (ragged KV, pages of >= 16 tokens), the host runs this kernel's
// warp-specialized form instead (prefill_hopper_ws.cuh), which reuses its pieces.
#pragma once

#include "attention/prefill_config.cuh"
#include "attention/prefill_epilogue.cuh"
#include "attention/prefill_loader.cuh"
#include "attention/prefill_mainloop.cuh"
#include "attention/prefill_params.cuh"
#include "attention/prefill_shape.cuh"
#include "attention/prefill_variant.cuh"
#include "primitives/wgmma.cuh"

namespace flashkv {

template <class T, int HEAD_DIM, int KV_SOURCE>
struct PrefillHopperConfig : PrefillConfigCommon<T, HEAD_DIM, 128, KV_SOURCE, true> {
  typedef PrefillConfigCommon<T, HEAD_DIM, 128, KV_SOURCE, true> Base;
  // kStages V stages, the loads running kStages - 1 tiles ahead; K is free once S = Q Kᵀ lands,
  // so it has one stage fewer.
  static constexpr int kKStages = Base::kStages - 1;
  static constexpr int kQBuffers = Base::kShape.q_buffers;

  // wgmma's 128-byte-swizzled column blocks (wgmma.cuh).
  template <int kTileRows>
  __device__ __forceinline__ static u32 smem_offset(int row, int chunk) {
    return sw128_offset<kTileRows>(row, chunk);
  }

  static_assert(Base::kWarps == 8 && Base::kRowTiles == 1 && Base::kWarpsKV == 1,
                "two warpgroups of 64 rows, a warp's 16 rows over the whole KV tile");
  static_assert(Base::kQBytes % 1024 == 0 && Base::kStageBytes % 1024 == 0, "tiles on swizzle-atom boundaries");
  // The host refuses the kernel where the GPU offers less (src/ops/prefill_core.cpp); on Hopper
  // (227 KB per block) every head_dim fits, 1 KB of static shared memory included.
  static_assert(Base::kSmemBytes + 1024 <= 227 * 1024, "fits Hopper's shared memory per block");
};

// Issues S[64 x kTile] of warpgroup `wg` = Q(its rows) · K(stage)ᵀ, over head_dim in k-steps of
// 16, as one wgmma group (the caller waits).
template <class C>
__device__ __forceinline__ void prefill_hopper_qk(u32 q_smem, u32 k_stage, int wg, float (&s)[C::kTile / 2]) {
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

// Waits until at most n (0 <= n < kMax) committed cp.async groups are in flight.
template <int kMax>
__device__ __forceinline__ void cp_async_wait_at_most(int n) {
  if constexpr (kMax > 1) {
    if (n >= kMax - 1) {
      cp_async_wait<kMax - 1>();
      return;
    }
    cp_async_wait_at_most<kMax - 1>(n);
  } else {
    cp_async_wait<0>();
  }
}

// The CTA's load cursor over its work items' KV tiles, run ahead of the compute across item
// boundaries, so the next item's query tile and first KV tiles land while this one finishes (with
// one CTA per SM nothing else would hide them). Global tile g (the CTA's g-th KV tile, items in
// order) goes to K stage g % kKStages and V stage g % kStages, as its own commit group (V stays
// in use until the next tile's step, K not: one stage fewer); an item's query tile joins the group
// of its first KV tile, into buffer (item's sequence number among the items with KV) % kQBuffers.
template <class C>
struct PrefillHopperLoader {
  int wi;      // the work item being loaded
  int end;     // one past the CTA's last work item
  int tile;    // its next tile to issue
  int tiles;   // its tile count
  int seq;     // items with KV tiles entered so far
  int issued;  // tiles issued so far (all items)
  PrefillWorkItem w;
  PrefillTilePages<C> pages;  // page ids of `tile`, read ahead

  __device__ __forceinline__ void init(int begin, int end_) {
    wi = begin - 1;
    end = end_;
    tile = tiles = 0;
    seq = issued = 0;
  }

  // Issues tiles until `target` are issued, entering a new item only while its query buffer is
  // free: the item's sequence number is below `compute_seq` (the item being computed) + kQBuffers.
  __device__ __forceinline__ void issue_until(const PrefillParams& p, int target, int compute_seq, u32 q_smem,
                                              u32 k_smem, u32 v_smem) {
    while (issued < target) {
      if (tile == tiles) {  // the next item with KV tiles, if its query buffer is free
        if (seq >= compute_seq + C::kQBuffers) return;
        int n = 0;
        while (n == 0 && wi + 1 < end) {
          w = p.plan.work[++wi];
          n = (w.kv_end - w.kv_start + C::kTile - 1) / C::kTile;
        }
        if (n == 0) return;  // no more KV to load
        tiles = n;
        tile = 0;
        prefill_load_q<C>(p, w, (w.q_end - w.q_start) * p.group, q_smem + (seq % C::kQBuffers) * C::kQBytes);
        ++seq;
        prefill_tile_pages<C>(p, w, 0, pages);
      }
      prefill_issue_kv_tile<C>(p, w, tile, pages, k_smem + (issued % C::kKStages) * C::kStageBytes,
                               v_smem + (issued % C::kStages) * C::kStageBytes);
      cp_async_commit();
      ++issued;
      if (++tile < tiles) prefill_tile_pages<C>(p, w, tile, pages);
    }
  }
};

// One KV tile's step of a work item: global tile g (the item's tile `tile`) has its S = Q Kᵀ
// issued, then (kPendingPV) the previous tile's P·V with the P in `pa`; the softmax of S runs
// while that P·V is on the tensor cores, and O is rescaled once it lands; `pa` then holds this
// tile's P, its P·V left to the next step (or the item's end).
template <class C, bool kPendingPV>
__device__ __forceinline__ void prefill_hopper_step(const PrefillParams& p, const PrefillWorkItem& w,
                                                    PrefillHopperLoader<C>& ld, int g, int tile, int seq,
                                                    u32 q_smem, u32 k_smem, u32 v_smem, int wg,
                                                    const int (&lim)[1][2], int warp_min,
                                                    PrefillWarpState<C>& st, u32 (&pa)[1][C::kNT / 2][4]) {
  const int lane = threadIdx.x % 32;
  float(&o)[C::kHeadDim / 2] = reinterpret_cast<float(&)[C::kHeadDim / 2]>(st.o);
  // One barrier per step, so the warpgroups may drift apart by up to a step (one's softmax under
  // the other's wgmma). Before it, another warpgroup may still be in step g-1 (reading K(g-1),
  // V(g-2)); after it, every warp is past step g-1. Tile t takes K stage t % kKStages and V stage
  // t % kStages, so before the barrier only tile g itself may be issued (if it is not yet: at the
  // start, or when its item's query buffer was busy), after it tiles up to g + kStages - 2.
  if constexpr (!kPendingPV && C::kQBuffers == 1) {
    __syncthreads();  // the previous item's last S = Q Kᵀ is done in every warp: Q may be refilled
  }
  ld.issue_until(p, g + 1, seq, q_smem, k_smem, v_smem);
  cp_async_wait_at_most<C::kStages>(ld.issued - g - 1);  // tile g and the Q with it landed
  fence_proxy_async_shared();  // written by cp.async; read by wgmma
  __syncthreads();
  ld.issue_until(p, g + C::kStages - 1, seq, q_smem, k_smem, v_smem);
  float s[1][C::kNT][4];
  float(&sf)[C::kTile / 2] = reinterpret_cast<float(&)[C::kTile / 2]>(s);
  const u32 q_buf = q_smem + (seq % C::kQBuffers) * C::kQBytes;  // this item's query tile
  prefill_hopper_qk<C>(q_buf, k_smem + (g % C::kKStages) * C::kStageBytes, wg, sf);
  if constexpr (kPendingPV) {
    prefill_hopper_pv<C>(pa, v_smem + ((g - 1) % C::kStages) * C::kStageBytes, o);
    wgmma_wait<1>();  // S (committed first) has landed; P·V may still run
  } else {
    wgmma_wait<0>();
  }
  wgmma_fence_operands(sf);
  float rescale[1][2];
  u32 pa_new[1][C::kNT / 2][4];  // not pa: the P·V in flight reads it
  const int first = w.kv_start + tile * C::kTile;
  const int pos0 = first + 2 * (lane % 4);
  if (first + C::kTile - 1 <= warp_min) {
    prefill_softmax<C, false, false>(st, s, pos0, lim, p.sm_scale_log2, pa_new, rescale);
  } else {
    prefill_softmax<C, true, false>(st, s, pos0, lim, p.sm_scale_log2, pa_new, rescale);
  }
  if constexpr (kPendingPV) {
    wgmma_wait<0>();
    wgmma_fence_operands(o);
  }
  // pa = pa_new, as asm after the wait: a plain copy would be folded into the softmax, defining
  // the in-flight P·V's operand registers early (ptxas then serializes every wgmma).
#pragma unroll
  for (int j = 0; j < C::kNT / 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("mov.b32 %0, %1;\n" : "=r"(pa[0][j][e]) : "r"(pa_new[0][j][e]));
  // Once a row's maximum settles its factor is 1: skip the head_dim / 2 multiplies per row
  // when every row of the warp has it.
  if (__any_sync(0xffffffffu, rescale[0][0] != 1.f || rescale[0][1] != 1.f)) {
#pragma unroll
    for (int h = 0; h < 2; ++h) prefill_rescale_o(st, 0, h, rescale[0][h]);
  }
}

// The per-warp view of a work item: its rows, the last KV position each of this thread's rows may
// see (-1: not a real row; it never decreases with the row) and the warp's smallest real one
// (masking is per warp).
struct PrefillHopperRows {
  int valid_rows;
  int lim[1][2];
  int warp_min;
};

template <class C>
__device__ __forceinline__ PrefillHopperRows prefill_hopper_rows(const PrefillParams& p, const PrefillWorkItem& w) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  PrefillHopperRows r;
  r.valid_rows = (w.q_end - w.q_start) * p.group;
  r.warp_min = 0x7fffffff;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = warp * 16 + lane / 4 + 8 * h;
    int l = w.kv_end - 1;
    if (p.causal) l = min(l, w.diag + w.q_start + row / p.group);
    r.lim[0][h] = row < r.valid_rows ? l : -1;
    if (row < r.valid_rows) r.warp_min = min(r.warp_min, l);
  }
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) r.warp_min = min(r.warp_min, __shfl_xor_sync(0xffffffffu, r.warp_min, off));
  return r;
}

// One work item's compute: its tiles are the CTA's global tiles [g0, g0 + tiles); its query tile
// is in buffer seq % kQBuffers. C: a PrefillWithVariant<PrefillHopperConfig, DefaultVariant>.
template <class C>
__device__ __forceinline__ void prefill_hopper_work_item(const PrefillParams& p, const PrefillWorkItem& w,
                                                         PrefillHopperLoader<C>& ld, int g0, int seq,
                                                         u32 q_smem, u32 k_smem, u32 v_smem) {
  const int warp = threadIdx.x / 32, wg = warp / 4;
  const int num_tiles = (w.kv_end - w.kv_start + C::kTile - 1) / C::kTile;
  const PrefillHopperRows rows = prefill_hopper_rows<C>(p, w);
  PrefillWarpState<C> st;
  st.init();
  float(&o)[C::kHeadDim / 2] = reinterpret_cast<float(&)[C::kHeadDim / 2]>(st.o);
  // Per tile: S = Q Kᵀ of this tile is issued, then P·V of the previous tile (whose P is ready),
  // and this tile's softmax runs while that P·V is on the tensor cores; O is rescaled once it
  // lands. So the previous tile's V stage is in use until the middle of this tile's step. Every
  // warpgroup runs every tile of the item (rows that see none of it get P = 0): wgmma issued
  // under a condition makes ptxas serialize the pipeline.
  u32 pa[1][C::kNT / 2][4];  // P of the previous tile, pending its P·V
  if (num_tiles > 0) {
    prefill_hopper_step<C, false>(p, w, ld, g0, 0, seq, q_smem, k_smem, v_smem, wg, rows.lim, rows.warp_min, st, pa);
    for (int tile = 1; tile < num_tiles; ++tile)
      prefill_hopper_step<C, true>(p, w, ld, g0 + tile, tile, seq, q_smem, k_smem, v_smem, wg, rows.lim, rows.warp_min, st, pa);
    prefill_hopper_pv<C>(pa, v_smem + ((g0 + num_tiles - 1) % C::kStages) * C::kStageBytes, o);
    wgmma_wait<0>();
    wgmma_fence_operands(o);
  }
  prefill_write_warp<C>(p, w, st, warp, rows.valid_rows);
}

// The Hopper kernels run plain attention; variants take the mma.sync kernel.
template <class Tr>
constexpr bool kPrefillHopperPlain = !Tr::kPerLogit && !Tr::kQueryTransform && !Tr::kKVTransform &&
                                     !Tr::kFirstVisibleKey && !Tr::kSink && !Tr::kOutputTransform &&
                                     Tr::kUseSoftmax;

template <class Config, class V = DefaultVariant>
__global__ void __launch_bounds__(Config::kThreads, 1)
    batch_prefill_hopper_kernel(const __grid_constant__ PrefillParams p) {
  typedef PrefillWithVariant<Config, V> C;
  static_assert(kPrefillHopperPlain<typename C::Traits>, "plain attention only: variants take the mma.sync kernel");
  extern __shared__ __align__(1024) unsigned char smem[];
  const u32 q_smem = (smem_addr(smem) + 1023u) & ~1023u;  // swizzle atoms are 1024-byte aligned
  const u32 k_smem = q_smem + C::kQBuffers * C::kQBytes;
  const u32 v_smem = k_smem + C::kKStages * C::kStageBytes;
  const int begin = p.plan.cta_work_indptr[blockIdx.x];
  const int end = p.plan.cta_work_indptr[blockIdx.x + 1];
  PrefillHopperLoader<C> ld;
  ld.init(begin, end);
  int g = 0, seq = 0;  // the CTA's tiles and items with KV computed so far
  for (int wi = begin; wi < end; ++wi) {
    const PrefillWorkItem w = p.plan.work[wi];
    const int tiles = (w.kv_end - w.kv_start + C::kTile - 1) / C::kTile;
    prefill_hopper_work_item<C>(p, w, ld, g, seq, q_smem, k_smem, v_smem);
    g += tiles;
    seq += tiles > 0;
    if (w.slot >= 0) prefill_arrive<C>(p, w);
  }
  cp_async_wait<0>();
}

}  // namespace flashkv
