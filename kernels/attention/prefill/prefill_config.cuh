// What the prefill kernels' configs share: the element types, the geometry read off the kernel's
// shape function (prefill_shape.cuh: mma.sync or Hopper wgmma) and the counts derived from it.
// PrefillConfig (prefill.cuh) and PrefillHopperConfig (prefill_hopper.cuh) add their shared-memory
// layout (smem_offset) and their own checks.
#pragma once

#include "attention/prefill/prefill_params.cuh"
#include "attention/prefill/prefill_shape.cuh"
#include "kv/kv_chunk_copy.cuh"
#include "primitives/types.cuh"

namespace flashkv {

// The KV element type a kernel's MMAs read from shared memory (kv_t) and the one in memory
// (kv_mem_t): both T, or, with fp8 KV, fp8 in the mma.sync kernel (widened in registers) and T
// where the tile is widened as it is staged: the Hopper kernel (by its producer:
// prefill_hopper_ws.cuh) and the mma.sync kernel with a variant that rewrites the staged keys or
// values (WIDEN_KV; kv/kv_chunk_copy.cuh says why).
template <class T, int HEAD_DIM, int ROWS, int KV_SOURCE, bool HOPPER, class KVT = T,
          bool WIDEN_KV = false>
struct PrefillConfigCommon {
  using q_t = T;
  using kv_t = typename StagedKV<T, KVT, HOPPER || WIDEN_KV>::type;
  using kv_mem_t = KVT;
  using o_t = T;
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kRows = ROWS;
  static constexpr int kKV = KV_SOURCE;  // PrefillKVSource
  static constexpr PrefillShape kShape = HOPPER ? prefill_hopper_shape(HEAD_DIM, (int)sizeof(KVT))
                                                : prefill_shape(HEAD_DIM, ROWS, (int)sizeof(kv_t));
  static constexpr int kRowTiles = kShape.row_tiles;  // 16-row MMA tiles per warp
  static constexpr int kWarpRows = kShape.warp_rows;
  static constexpr int kWarpsQ = kShape.warps_q;
  static constexpr int kWarpsKV = kShape.warps_kv;
  static constexpr int kWarps = kShape.warps;
  static constexpr int kThreads = kShape.threads;
  static constexpr int kTile = kShape.tile;
  static constexpr int kWarpTokens = kTile / kWarpsKV;  // this warp's slice of a KV tile
  static constexpr int kNT = kWarpTokens / 8;           // n-tiles of S per warp
  static constexpr int kChunks = HEAD_DIM / 8;          // 16-byte chunks per (16-bit) Q row
  static constexpr int kKVChunks = HEAD_DIM * (int)sizeof(kv_t) / 16;  // and per K / V stage row
  static constexpr int kDTiles = HEAD_DIM / 8;                         // n-tiles of O
  static constexpr int kLoads =
      kTile * kKVChunks / kThreads;            // 16-byte KV loads per thread per stage
  static constexpr int kLoaderThreadBase = 0;  // the KV loaders' threads are threadIdx.x - this
  static constexpr int kQBytes = kShape.q_bytes;
  static constexpr int kStageBytes = kShape.stage_bytes;  // K (or V) of one stage
  static constexpr int kStages = kShape.stages;
  static constexpr int kSmemBytes = kShape.smem_bytes;

  static_assert(sizeof(T) == 2 && (sizeof(KVT) == 2 || is_fp8<KVT>()),
                "prefill takes 16-bit q and out, 16-bit or fp8 KV");
  static_assert(!WIDEN_KV || is_fp8<KVT>(), "only an fp8 cache is widened");
  static_assert(KV_SOURCE == kRaggedKV || KV_SOURCE == kPagedPow2KV || KV_SOURCE == kPagedKV,
                "KV source");
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256, "head_dim 64, 128 or 256");
  static_assert(kWarpTokens % 16 == 0, "a warp's KV slice is whole 16-token MMA k-steps");
  static_assert(kTile * kKVChunks % kThreads == 0 && ROWS * kChunks % kThreads == 0, "even loads");
};

}  // namespace flashkv
