// Pieces both decode kernels share (CUDA-core decode.cuh, tensor-core decode_tc.cuh): the
// epilogue that writes one row's normalized output (or its partial state), and the fused merge
// stage of split tiles. C is the kernel's config: kGroup, kHeadDim, kThreads, o_t.
#pragma once

#include "attention/decode/decode_params.cuh"
#include "attention/merge/split_merge.cuh"
#include "attention/state.cuh"
#include "attention/work_loop.cuh"
#include "attention/work_timeline.cuh"
#include "kv/kv_chunk_copy.cuh"
#include "primitives/cp_async.cuh"
#include "primitives/l2_hint.cuh"
#include "primitives/types.cuh"
#include "variants/variant.cuh"

namespace flashkv {

// A kernel config C with the attention variant V (kernels/variants/variant.cuh) the kernel runs.
template <class C, class V>
struct DecodeWithVariant : C {
  using Variant = V;
  using Traits = VariantTraits<V>;
};

// The variant's view of query head `g` of work item w (decode: one query row per request).
template <class C>
__device__ __forceinline__ VariantRow decode_variant_row(const DecodeWorkItem& w, int g) {
  return VariantRow{w.request, w.request, 0, 1, w.kv_len, w.kv_head * C::kGroup + g, w.kv_head};
}

// Writes 8 normalized output elements [col, col + 8) of query head `g` of work item w: to the
// output when the tile is not split, else to the item's partial-state slot (base-2 LSE).
// The page ids behind one thread's 16-byte loads of one KV tile (C: kTile tokens of kChunks
// 16-byte chunks, kLoads loads per thread; -1 past the chunk end). Read a tile ahead of their use
// and consumed only when that tile's loads are issued, an iteration later, so the page-table
// reads are never waited on: under full memory load even an L2 hit takes microseconds, and
// waiting on it every tile held the pipeline far below the memory bandwidth.
template <class C>
struct DecodeTilePages {
  int page[C::kLoads];
};
// A load past the chunk's end: no page (as a page id it is out of range, so nothing is read).
constexpr int kDecodeNoPage = -2147483647 - 1;

// The loads' address arithmetic was most of what a decode CTA issued (H200 profile of GQA D4:
// ~560 of ~725 warp instructions per warp and tile, the math the rest), and the loop was
// issue-bound, so it is kept cheap: a thread's j-th row is its first plus j row steps (no
// division per load), token positions are unsigned (a power-of-two page size divides with a
// shift), and offsets are 32-bit within the page (the host checks they fit: BatchDecode::run).
// Now ~390 per warp and tile, D4 5 % faster (NOTES.md).
template <class C>
__device__ __forceinline__ int decode_load_row(int j) {
  static_assert(C::kThreads % C::kChunks == 0, "each load step covers whole rows");
  return (int)threadIdx.x / C::kChunks + j * (C::kThreads / C::kChunks);
}

// (The page table is read with the L2 evict_last hint, as the plan: each run's first page ids are
// a dependent round trip before its first KV load.)
template <class C>
__device__ __forceinline__ void decode_tile_pages(const DecodeParams& p, const DecodeWorkItem& w,
                                                  int tile, DecodeTilePages<C>& a) {
  const int len = w.kv_end - w.kv_start;
  const u64 policy = l2_evict_last_policy();
  const int* ids = p.kv_indices + w.page_base;
  constexpr int kRowStep = C::kThreads / C::kChunks;  // rows between a thread's loads
  const int t0 = tile * C::kTile + decode_load_row<C>(0);
  const unsigned pos0 = (unsigned)(w.kv_start + t0);  // >= 0
#pragma unroll
  for (int j = 0; j < C::kLoads; ++j) {
    const int t = t0 + j * kRowStep;
    // Whole pages between a thread's rows: its j-th page id is j * kRowStep / page_size after its
    // first (an immediate offset); else each row's page is its own division.
    const int* id = kRowStep % C::kPageSize == 0
                        ? ids + pos0 / C::kPageSize + j * (kRowStep / C::kPageSize)
                        : ids + (pos0 + j * kRowStep) / C::kPageSize;
    a.page[j] = t < len ? ld_evict_last(id, policy) : kDecodeNoPage;
  }
}

// The decode plan as the work loop reads it (attention/work_loop.cuh): this CTA's unit's items
// [begin, end) and item wi of them (decode_plan.cuh), read with the L2 evict_last hint: they are
// the first dependent round trips of every CTA, and the KV stream of the previous run would
// otherwise have evicted them.
struct DecodeWorkList {
  const DecodePlanPtrs& plan;

  __device__ __forceinline__ WorkRange cta_items() const {
    const u64 policy = l2_evict_last_policy();
    const int unit = (int)blockIdx.x / plan.ctas_per_unit;
    WorkRange r;
    r.begin = ld_evict_last(plan.unit_work_indptr + unit, policy);
    r.end = ld_evict_last(plan.unit_work_indptr + unit + 1, policy);
    return r;
  }
  __device__ __forceinline__ DecodeWorkItem item(int wi) const {
    static_assert(sizeof(DecodeWorkItem) == 32, "two 16-byte loads (items are 16-byte aligned)");
    const u64 policy = l2_evict_last_policy();
    const int4* src = reinterpret_cast<const int4*>(plan.work + wi);
    const int4 a = ld_evict_last(src, policy), b = ld_evict_last(src + 1, policy);
    return decode_cta_work_item(DecodeWorkItem{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}, blockIdx.x,
                                plan.ctas_per_unit);
  }
};

// Page ids outside [0, num_pages) are always read as zeros (never outside the cache). Reporting
// them is compiled in only where asked (DecodePlanOptions::check_page_ids, or the debug mode
// FLASHKV_CHECK_DEVICE_ERRORS=1: the kernel source then starts with this define), because it
// costs: a flag per load in the loads' loop made GQA D1-D4 and MHA D2/D3 1-6 % slower on the H200
// (bench/results/decode-page-check-ab-2026-11-30.log). (The page table is in device memory:
// checking it on the host would cost a copy and a synchronization per run.) The loads note a bad
// id in `bad_pages`; after the item's loop, if any thread saw one, thread 0 rescans the item's page
// ids and records the first bad one for check_device_errors().
#ifndef FLASHKV_DECODE_CHECK_PAGES
#define FLASHKV_DECODE_CHECK_PAGES 0
#endif
constexpr bool kDecodeCheckPages = FLASHKV_DECODE_CHECK_PAGES != 0;

template <class C>
__device__ __noinline__ void decode_report_bad_pages(const DecodeParams& p,
                                                     const DecodeWorkItem& w) {
  const int op = p.step.new_k != nullptr ? kDeviceOpBatchDecodeStep : kDeviceOpBatchDecode;
  const int first = w.kv_start / C::kPageSize, last = (w.kv_end - 1) / C::kPageSize;
  for (int i = first; i <= last; ++i) {
    const int page = p.kv_indices[w.page_base + i];
    if ((unsigned long long)page >= (unsigned long long)p.num_pages) {
      const int pos = max(w.kv_start, i * C::kPageSize);
      report_device_error(p.error, kDeviceErrorPageIndex, op, pos, page, p.num_pages,
                          w.page_base + i, w.request);
      return;
    }
  }
}
// Every thread of the CTA calls it (a barrier where page ids are checked).
template <class C>
__device__ __forceinline__ void decode_check_pages(const DecodeParams& p, const DecodeWorkItem& w,
                                                   unsigned bad_pages) {
  if constexpr (kDecodeCheckPages) {
    if (__syncthreads_or(bad_pages != 0) && threadIdx.x == 0) decode_report_bad_pages<C>(p, w);
  }
}

// Issues the cp.async loads of KV tile `tile` into one pipeline stage (byte pointers to its K
// and V tiles). Each config lays a stage out with C::chunk_offset(row, chunk) (bytes): plain rows
// for the CUDA-core kernel, XOR-swizzled rows for ldmatrix in the tensor-core kernel. Past the
// chunk end (kDecodeNoPage) or on an out-of-range page id the 16 bytes are zero-filled: nothing is
// read outside the cache, and zeros keep P·V free of NaN from stale shared memory. An
// out-of-range id sets bad_pages where page ids are checked (kDecodeCheckPages; reported after the
// item: decode_check_pages).
template <class C>
__device__ __forceinline__ void decode_issue_tile(const DecodeParams& p, const DecodeWorkItem& w,
                                                  int tile, const DecodeTilePages<C>& a,
                                                  unsigned char* k_stage, unsigned char* v_stage,
                                                  unsigned& bad_pages) {
  typedef typename C::kv_t kv_t;          // the stage's elements
  typedef typename C::kv_mem_t kv_mem_t;  // the cache's (kv/kv_chunk_copy.cuh)
  constexpr u32 kElem = sizeof(kv_mem_t);
  const char* kg = static_cast<const char*>(p.k);
  const char* vg = static_cast<const char*>(p.v);
  const int chunk = threadIdx.x % C::kChunks;
  // Byte offsets in 32-bit pieces (the host checks the page stride and every in-page offset fit
  // in 32 bits): one wide multiply-add per load, shared by its K and V copies. Page ids are
  // int32, so num_pages clamps to 2^31. Shared-memory addresses are 32-bit (no generic-address
  // conversion per copy).
  const u32 page_bytes = (u32)p.page_stride * kElem, token_bytes = (u32)p.token_stride * kElem;
  const u32 in_page =
      ((u32)w.kv_head * (u32)p.head_stride + (u32)chunk * (16 / (u32)sizeof(kv_t))) * kElem;
  const u32 num_pages = (u32)(p.num_pages < 0x80000000LL ? p.num_pages : 0x80000000LL);
  const u32 k_dst = smem_addr(k_stage), v_dst = smem_addr(v_stage);
  KVChunkCopy<kv_t, kv_mem_t, 2 * C::kLoads> copy;
#pragma unroll
  for (int j = 0; j < C::kLoads; ++j) {
    const int row = decode_load_row<C>(j);
    const unsigned pos = (unsigned)(w.kv_start + tile * C::kTile + row);
    const bool valid = (u32)a.page[j] < num_pages;  // kDecodeNoPage (past the chunk end) is not
    if constexpr (kDecodeCheckPages) {  // by position: a page id equal to kDecodeNoPage is bad too
      bad_pages |= (unsigned)(!valid && tile * C::kTile + row < w.kv_end - w.kv_start);
    }
    const u32 page = valid ? (u32)a.page[j] : 0u;
    const u64 off = (u64)page * page_bytes + ((pos % C::kPageSize) * token_bytes + in_page);
    const u32 so = C::chunk_offset(row, chunk);
    copy.issue(2 * j, k_dst + so, kg + off, valid);
    copy.issue(2 * j + 1, v_dst + so, vg + off, valid);
  }
  copy.finish();
}

// An fp8 cache's values are dequantized here, once per output row: o times the value scale.
template <class C>
__device__ __forceinline__ void decode_store_row(const DecodeParams& p, const DecodeWorkItem& w,
                                                 int g, int col, const float (&o_in)[8], float lse2,
                                                 bool write_lse) {
  float o[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = o_in[e];
  if constexpr (is_fp8<typename C::kv_mem_t>()) {
    const float vs = kv_scale_v(p.scale, w.kv_head);
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] *= vs;
  }
  if (w.slot < 0) {
    const int qo_head = w.kv_head * C::kGroup + g;
    typename C::o_t* op = static_cast<typename C::o_t*>(p.out) +
                          (long long)w.request * p.o_stride_n + (long long)qo_head * p.o_stride_h +
                          col;
    if constexpr (C::Traits::kOutputTransform) {
      float t[8];
      const VariantRow row = decode_variant_row<C>(w, g);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        t[e] = C::Variant::output_transform(variant_args<typename C::Variant>(p.variant), row,
                                            col + e, o[e]);
      *reinterpret_cast<uint4*>(op) = Vec16<typename C::o_t>::from_floats(t);
    } else {
      *reinterpret_cast<uint4*>(op) = Vec16<typename C::o_t>::from_floats(o);
    }
    if (C::Traits::kUseSoftmax && p.lse != nullptr && write_lse)
      p.lse[(long long)w.request * p.lse_stride_n + qo_head] = lse2 * kLn2;
  } else {
    float* po = p.plan.partial_o + ((long long)w.slot * C::kGroup + g) * C::kHeadDim + col;
    *reinterpret_cast<float4*>(po) = make_float4(o[0], o[1], o[2], o[3]);
    *reinterpret_cast<float4*>(po + 4) = make_float4(o[4], o[5], o[6], o[7]);
    if (write_lse) p.plan.partial_lse[(long long)w.slot * C::kGroup + g] = lse2;
  }
}

// Writes 4 merged columns [col, col + 4) of query head g of a split tile (base-2 LSE lse2).
template <class C>
__device__ __forceinline__ void decode_merge_write(const DecodeParams& p,
                                                   const DecodeMergeItem& item, int g, int col,
                                                   float (&acc)[4], float lse2) {
  const int qo_head = item.kv_head * C::kGroup + g;
  typename C::o_t* op = static_cast<typename C::o_t*>(p.out) +
                        (long long)item.request * p.o_stride_n + (long long)qo_head * p.o_stride_h +
                        col;
  // Without softmax every partial state has lse 0, so ⊕ averaged them: the sum is that times
  // the number of states, 2^lse2.
  if constexpr (!C::Traits::kUseSoftmax) {
    const float n = lse2 == neg_inf() ? 0.f : exp2f(lse2);
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] *= n;
  }
  if constexpr (C::Traits::kOutputTransform) {
    const VariantRow row{item.request, item.request, 0, 1, item.kv_len, qo_head, item.kv_head};
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[e] = C::Variant::output_transform(variant_args<typename C::Variant>(p.variant), row,
                                            col + e, acc[e]);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) op[e] = from_float<typename C::o_t>(acc[e]);
  if (C::Traits::kUseSoftmax && p.lse != nullptr && col == 0)
    p.lse[(long long)item.request * p.lse_stride_n + qo_head] = lse2 * kLn2;
}

// The merge stage of one split (request, kv_head) tile: ⊕ of its partial states in KV order,
// written to the output. Run by the CTA that wrote the tile's last partial state. A thread merges
// one float4 of the tile over the slots; where the CTA has more threads than the tile has float4s
// (small groups, 8-warp CTAs), kParts threads share each float4, each merging a contiguous share
// of the slots, and the shares' states meet (⊕) in `scratch` (kThreads * 5 floats of shared
// memory): one round of L2 reads instead of two for a tile split 17 ways on 8 warps (GQA D4).
template <class C>
__device__ __forceinline__ void decode_merge_tile(const DecodeParams& p,
                                                  const DecodeMergeItem& item, float* scratch) {
  constexpr int kVecs = C::kGroup * C::kHeadDim / 4;  // float4s per tile
  constexpr int kParts = kVecs >= C::kThreads ? 1 : C::kThreads / kVecs;
  const long long o_stride = (long long)item.slot_stride * C::kGroup * C::kHeadDim;
  const long long lse_stride = (long long)item.slot_stride * C::kGroup;
  if constexpr (kParts == 1) {
    for (int v = threadIdx.x; v < kVecs; v += C::kThreads) {
      const int g = v / (C::kHeadDim / 4);
      const int col = (v % (C::kHeadDim / 4)) * 4;
      float acc[4];
      // 16 slots in flight per thread: one long request split over every CTA is merged in few
      // dependent rounds of L2 reads.
      const long long first = (long long)item.slot_begin * C::kGroup + g;
      const float lse2 =
          merge_split_slots4<16>(p.plan.partial_o + first * C::kHeadDim + col, o_stride,
                                 p.plan.partial_lse + first, lse_stride, 0, item.num_slots, acc);
      decode_merge_write<C>(p, item, g, col, acc, lse2);
    }
  } else {
    const int v = threadIdx.x % kVecs, part = threadIdx.x / kVecs;
    const int g = v / (C::kHeadDim / 4);
    const int col = (v % (C::kHeadDim / 4)) * 4;
    if (part < kParts) {
      float acc[4];
      const long long first = (long long)item.slot_begin * C::kGroup + g;
      const float lse2 = merge_split_slots4<16>(
          p.plan.partial_o + first * C::kHeadDim + col, o_stride, p.plan.partial_lse + first,
          lse_stride, part * item.num_slots / kParts, (part + 1) * item.num_slots / kParts, acc);
      float* mine = scratch + (part * kVecs + v) * 5;
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[e] = acc[e];
      mine[4] = lse2;
    }
    __syncthreads();
    if (part == 0) {  // ⊕ of the shares' normalized states, in slot order
      float m = neg_inf();
#pragma unroll
      for (int q = 0; q < kParts; ++q) m = fmaxf(m, scratch[(q * kVecs + v) * 5 + 4]);
      float acc[4] = {0.f, 0.f, 0.f, 0.f}, d = 0.f;
      if (m != neg_inf()) {
#pragma unroll
        for (int q = 0; q < kParts; ++q) {
          const float* st = scratch + (q * kVecs + v) * 5;
          // weight 0 for an empty share (lse -inf)
          softmax_merge_add_normalized(m, st[4], st, d, acc);
        }
      }
      const float inv = softmax_inv(d);
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] *= inv;
      decode_merge_write<C>(p, item, g, col, acc, softmax_lse2(m, d));
    }
    __syncthreads();  // the scratch is the next work item's shared memory
  }
}

// atomicAdd with acquire-release semantics at GPU scope: the release publishes the writes that
// precede it (cumulatively: also other threads' writes ordered before it by a barrier), the acquire
// makes the writes released by earlier adders visible to this thread (and, after a barrier, to
// its CTA). One round trip where a fence and then an atomic took two.
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* address, int value) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;"
               : "=r"(old)
               : "l"(address), "r"(value)
               : "memory");
  return old;
}

// The merge item of the split tile whose partial state this CTA's current work item writes,
// staged in shared memory while the item streams its KV (decode_prefetch_merge_item, issued by
// the prologue): the arrival and the merge read it from here instead of paying two dependent L2
// round trips each (the plan header's merge_offset, then the item) at the tail of the item, where
// nothing hides them (a split tile's merge is the kernel's last work: benchmark D4).
__device__ __forceinline__ DecodeMergeItem& decode_merge_item_smem() {
  __shared__ __align__(8) DecodeMergeItem item;
  return item;
}

// Thread 0 copies work item w's merge item into decode_merge_item_smem with cp.async (into the
// caller's current commit group); decode_arrive waits for it. Nothing for an unsplit item.
__device__ __forceinline__ void decode_prefetch_merge_item(const DecodeParams& p,
                                                           const DecodeWorkItem& w) {
  static_assert(sizeof(DecodeMergeItem) == 24, "three 8-byte copies");
  if (w.slot < 0 || threadIdx.x != 0) return;
  // Merge items start 16-byte aligned and are 24 bytes: every item is 8-byte aligned.
  const char* src = reinterpret_cast<const char*>(decode_merge_items(p.plan) + w.merge);
  const u32 dst = smem_addr(&decode_merge_item_smem());
#pragma unroll
  for (int i = 0; i < 3; ++i) cp_async_8(dst + 8 * i, src + 8 * i);
}

// After a CTA wrote a partial state of a split tile: count it, and if it was the tile's last,
// merge the tile here (one launch for decode and merge; no CTA ever waits for another).
// timeline: the item's first event in a profiling build (work_timeline.cuh), else unused.
// smem: the kernel's dynamic shared memory (free between work items), the merge's scratch.
template <class C>
__device__ __forceinline__ void decode_arrive(const DecodeParams& p, const DecodeWorkItem& w,
                                              unsigned char* smem, int timeline = -1) {
  __shared__ int is_last;
  cp_async_wait<0>();  // thread 0's copy of the merge item (decode_prefetch_merge_item)
  __syncthreads();     // every thread's partial-state writes precede thread 0's release below
  if (threadIdx.x == 0) {
    const int num_slots = decode_merge_item_smem().num_slots;
    const int arrived = atomic_add_acq_rel_gpu(p.plan.merge_arrivals + w.merge, 1) + 1;
    is_last = arrived == num_slots;
  }
  __syncthreads();  // after thread 0's acquire: the other CTAs' partial states are visible to all
  if (timeline >= 0) work_timeline_stamp(timeline + 4);
  if (is_last) {
    const DecodeMergeItem item = decode_merge_item_smem();
    decode_merge_tile<C>(p, item, reinterpret_cast<float*>(smem));
    if (threadIdx.x == 0) p.plan.merge_arrivals[w.merge] = 0;  // ready for the next run / replay
    __syncthreads();  // the staged merge item is refilled by the next work item's prologue
  }
}

}  // namespace flashkv
