// The prefill kernel's loaders: a query tile (GQA rows gathered from the ragged q) and KV tiles
// gathered from a paged cache (any page size, 1 included) or from ragged contiguous KV, into
// contiguous XOR-swizzled shared memory with cp.async. C is the kernel config (prefill.cuh,
// prefill_hopper.cuh): its smem_offset<tile rows>(row, chunk) is the tile layout its MMAs read.
#pragma once

#include "attention/prefill/prefill_params.cuh"
#include "kv/kv_chunk_copy.cuh"
#include "primitives/cp_async.cuh"
#include "primitives/mma.cuh"

namespace flashkv {

// Rows of a query tile are (query token, head-in-group) pairs: row r is token q_start + r / group,
// query head kv_head * group + r % group. Rows past the tile's tokens are zero-filled.
template <class C>
__device__ __forceinline__ void prefill_load_q(const PrefillParams& p, const PrefillWorkItem& w,
                                               int valid_rows, u32 q_smem) {
  typedef typename C::q_t q_t;
  constexpr int kRowStep = C::kThreads / C::kChunks;  // a thread keeps one chunk column
  static_assert(C::kThreads % C::kChunks == 0, "a thread keeps one chunk column");
  const q_t* q = static_cast<const q_t*>(p.q) + (int)(threadIdx.x % C::kChunks) * 8;
  const int row0 = threadIdx.x / C::kChunks;
  // (token, head) of row0, stepped by kRowStep rows without a division per row.
  int tok = row0 / p.group, head = row0 % p.group;
  const int step_tok = kRowStep / p.group, step_head = kRowStep % p.group;
#pragma unroll
  for (int j = 0; j < C::kRows / kRowStep; ++j) {
    const int row = row0 + j * kRowStep;
    const bool valid = row < valid_rows;
    const q_t* src = valid ? q + (long long)(w.q_base + w.q_start + tok) * p.q_stride_n +
                                 (long long)(w.kv_head * p.group + head) * p.q_stride_h
                           : q;
    cp_async_16(q_smem + C::template smem_offset<C::kRows>(row, threadIdx.x % C::kChunks), src,
                valid);
    tok += step_tok;
    head += step_head;
    if (head >= p.group) {
      head -= p.group;
      ++tok;
    }
  }
}

// Where one thread's 16-byte loads of one KV tile come from: the page id (paged) or 0 (ragged),
// -1 past the chunk end. Read a tile ahead of the loads that use it, so the page-table reads are
// never waited on when the loads are issued.
template <class C>
struct PrefillTilePages {
  int page[C::kLoads];
};

// Thread t loads 16-byte chunk t % kChunks of rows t / kChunks + j * kRowStep of each KV tile:
// the chunk (so the head and column offset) is the same for all its loads.
template <class C>
struct PrefillKVLoads {
  static constexpr int kRowStep = C::kThreads / C::kKVChunks;
  static_assert(C::kThreads % C::kKVChunks == 0, "a thread keeps one chunk column");
  __device__ __forceinline__ static int tid() { return (int)threadIdx.x - C::kLoaderThreadBase; }
  __device__ __forceinline__ static int row(int j) { return tid() / C::kKVChunks + j * kRowStep; }
  __device__ __forceinline__ static int chunk() { return tid() % C::kKVChunks; }
};

template <class C>
__device__ __forceinline__ void prefill_tile_pages(const PrefillParams& p, const PrefillWorkItem& w,
                                                   int tile, PrefillTilePages<C>& a) {
  typedef PrefillKVLoads<C> L;
#pragma unroll
  for (int j = 0; j < C::kLoads; ++j) {
    const int pos = w.kv_start + tile * C::kTile + L::row(j);
    if constexpr (C::kKV == kRaggedKV) {
      a.page[j] = pos < w.kv_end ? 0 : -1;
    } else {
      const int page_idx = C::kKV == kPagedPow2KV ? pos >> p.page_shift : pos / p.page_size;
      a.page[j] = pos < w.kv_end ? p.kv_indices[w.page_base + page_idx] : -1;
    }
  }
}

// Issues the cp.async loads of KV tile `tile` into one pipeline stage (shared addresses of its K
// and V tiles). Past the chunk end or on an out-of-range page id the 16 bytes are zero-filled:
// nothing outside the cache is read, and zeros keep P·V free of NaN from stale shared memory.
// Offsets within a page are 32-bit (the host checks they fit); one wide multiply per page.
template <class C>
__device__ __forceinline__ void prefill_issue_kv_tile(const PrefillParams& p,
                                                      const PrefillWorkItem& w, int tile,
                                                      const PrefillTilePages<C>& a, u32 k_stage,
                                                      u32 v_stage) {
  typedef typename C::kv_t kv_t;          // the stage's elements
  typedef typename C::kv_mem_t kv_mem_t;  // the cache's (kv/kv_chunk_copy.cuh)
  typedef PrefillKVLoads<C> L;
  constexpr int kChunkElems = 16 / (int)sizeof(kv_t);
  const int col = w.kv_head * p.head_stride + L::chunk() * kChunkElems;  // within a token
  const kv_mem_t* kg = static_cast<const kv_mem_t*>(p.k) + col;
  const kv_mem_t* vg = static_cast<const kv_mem_t*>(p.v) + col;
  KVChunkCopy<kv_t, kv_mem_t, 2 * C::kLoads> copy;
#pragma unroll
  for (int j = 0; j < C::kLoads; ++j) {
    const int pos = w.kv_start + tile * C::kTile + L::row(j);
    long long off;
    bool valid;
    if constexpr (C::kKV == kRaggedKV) {
      valid = a.page[j] == 0;
      off = (long long)(w.page_base + pos) * p.token_stride;
    } else {
      valid = (unsigned)a.page[j] < (unsigned)p.num_pages;
      const int slot = C::kKV == kPagedPow2KV ? pos & (p.page_size - 1) : pos % p.page_size;
      off = (long long)(valid ? a.page[j] : 0) * p.page_stride + slot * p.token_stride;
    }
    off = valid ? off : 0;
    const u32 so = C::kv_offset(L::row(j), L::chunk());
    copy.issue(2 * j, k_stage + so, kg + off, valid);
    copy.issue(2 * j + 1, v_stage + so, vg + off, valid);
  }
  copy.finish();
}

}  // namespace flashkv
