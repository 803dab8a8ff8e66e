// The prologue of both decode kernels' cp.async pipelines (CUDA-core decode.cuh, tensor-core
// decode_tc.cuh): issues KV tiles [0, kStages - 1) of a work item and reads the page ids of
// tile kStages - 1, which the main loop's first iteration issues.
//
// Every tile's loads wait on its page ids (a kv_indices read), so the ids of all kStages tiles are
// read first, in one batch, and only then are the tiles issued: one round trip to the page table
// before the first KV load instead of one per prologue tile. Each round trip costs ~1 us under
// memory load, and an item of a short request (benchmark D1: 8 tiles per item) is mostly ramp.
// The last prologue group also carries the copy of a split item's merge item (decode_common.cuh).
#pragma once

#include "attention/decode/decode_common.cuh"
#include "attention/decode/decode_step.cuh"
#include "primitives/cp_async.cuh"

namespace flashkv {

// stage(s, is_v): the byte address of pipeline stage s of K (is_v false) or V. A fused step
// (append_tile >= 0) appends its token before the tile that holds it is issued (tiles before it
// are already in flight); when that tile is issued by the main loop, before the main loop, whose
// first barrier then precedes the issue.
template <class C, class Stage>
__device__ __forceinline__ void decode_prologue(const DecodeParams& p, const DecodeWorkItem& w,
                                                int num_tiles, int append_tile, long long step_pos,
                                                const Stage& stage, DecodeTilePages<C>& next_pages,
                                                unsigned& bad_pages) {
  DecodeTilePages<C> pages[C::kStages - 1];
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < num_tiles) decode_tile_pages<C>(p, w, s, pages[s]);
  }
  if (C::kStages - 1 < num_tiles) decode_tile_pages<C>(p, w, C::kStages - 1, next_pages);
  const int append_at = append_tile < 0 ? -1 : min(append_tile, C::kStages - 1);
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s == append_at) decode_step_append<C>(p, w, step_pos);
    if (s < num_tiles)
      decode_issue_tile<C>(p, w, s, pages[s], stage(s, false), stage(s, true), bad_pages);
    if (s == C::kStages - 2) decode_prefetch_merge_item(p, w);  // after the tiles: off their path
    cp_async_commit();
  }
  if (append_at == C::kStages - 1) decode_step_append<C>(p, w, step_pos);
}

}  // namespace flashkv
