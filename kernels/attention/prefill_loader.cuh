// The prefill kernel's loaders: a query tile (GQA rows gathered from the ragged q) and KV tiles
// gathered from a paged cache (any page size, 1 included) or from ragged contiguous KV, into
// contiguous XOR-swizzled shared memory with cp.async. C is the kernel config (prefill.cuh).
#pragma once

#include "attention/prefill_params.cuh"
#include "primitives/cp_async.cuh"
#include "primitives/mma.cuh"

namespace flashkv {

// Rows of a query tile are (query token, head-in-group) pairs: row r is token q_start + r / group,
// query head kv_head * group + r % group. Rows past the tile's tokens are zero-filled.
template <class C>
__device__ __forceinline__ void prefill_load_q(const PrefillParams& p, const PrefillWorkItem& w,
                                               int valid_rows, unsigned char* q_smem) {
  typedef typename C::q_t q_t;
  const q_t* q = static_cast<const q_t*>(p.q);
#pragma unroll
  for (int j = 0; j < C::kRows * C::kChunks / C::kThreads; ++j) {
    const int ci = threadIdx.x + j * C::kThreads;
    const int row = ci / C::kChunks, chunk = ci % C::kChunks;
    const bool valid = row < valid_rows;
    const int tok = w.q_start + row / p.group, head = w.kv_head * p.group + row % p.group;
    const q_t* src = valid ? q + (long long)(w.q_base + tok) * p.q_stride_n +
                                 (long long)head * p.q_stride_h + chunk * 8
                           : q;
    cp_async_16(q_smem + swizzled_offset<C::kChunks>(row, chunk), src, valid);
  }
}

// Where one thread's 16-byte loads of one KV tile come from: the page id (paged) or 0 (ragged),
// -1 past the chunk end. Read a tile ahead of the loads that use it, so the page-table reads are
// never waited on when the loads are issued.
template <class C>
struct PrefillTilePages {
  int page[C::kLoads];
};

template <class C>
__device__ __forceinline__ void prefill_tile_pages(const PrefillParams& p, const PrefillWorkItem& w,
                                                   int tile, PrefillTilePages<C>& a) {
#pragma unroll
  for (int j = 0; j < C::kLoads; ++j) {
    const int pos = w.kv_start + tile * C::kTile + (threadIdx.x + j * C::kThreads) / C::kChunks;
    a.page[j] = pos >= w.kv_end ? -1
                : p.page_size > 0 ? p.kv_indices[w.page_base + pos / p.page_size]
                                  : 0;
  }
}

// Issues the cp.async loads of KV tile `tile` into one pipeline stage. Past the chunk end or on
// an out-of-range page id the 16 bytes are zero-filled: nothing outside the cache is read, and
// zeros keep P·V free of NaN from stale shared memory.
template <class C>
__device__ __forceinline__ void prefill_issue_kv_tile(const PrefillParams& p, const PrefillWorkItem& w,
                                                      int tile, const PrefillTilePages<C>& a,
                                                      unsigned char* k_stage, unsigned char* v_stage) {
  typedef typename C::kv_t kv_t;
  const kv_t* kg = static_cast<const kv_t*>(p.k);
  const kv_t* vg = static_cast<const kv_t*>(p.v);
#pragma unroll
  for (int j = 0; j < C::kLoads; ++j) {
    const int ci = threadIdx.x + j * C::kThreads;
    const int row = ci / C::kChunks, chunk = ci % C::kChunks;
    const int pos = w.kv_start + tile * C::kTile + row;
    long long off = 0;
    bool valid;
    if (p.page_size > 0) {
      valid = (unsigned long long)a.page[j] < (unsigned long long)p.num_pages;
      if (valid) off = (long long)a.page[j] * p.page_stride + (long long)(pos % p.page_size) * p.token_stride;
    } else {
      valid = a.page[j] == 0;
      off = (long long)(w.page_base + pos) * p.token_stride;
    }
    off = valid ? off + (long long)w.kv_head * p.head_stride + chunk * 8 : 0;
    const u32 so = swizzled_offset<C::kChunks>(row, chunk);
    cp_async_16(k_stage + so, kg + off, valid);
    cp_async_16(v_stage + so, vg + off, valid);
  }
}

}  // namespace flashkv
