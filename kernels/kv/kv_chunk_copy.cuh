// How the attention kernels' loaders move one 16-byte shared-memory chunk of a K or V tile from
// the cache: a cp.async when the tile holds the cache's own element type, or, for an fp8 cache
// whose tile is staged widened to 16 bits, a load of 8 fp8 values that lands converted.
//
// Widened tiles serve the variants that rewrite keys or values in the staged tile (fused RoPE,
// key_transform, value_transform: variants/variant_smem.cuh). Rewriting an fp8 tile in place
// would round the result to fp8 a second time (3 mantissa bits for e4m3); widened, it rounds once
// to the query's 16-bit type, as with a 16-bit cache. The widening is exact (every e4m3 / e5m2
// value is an f16 and a bf16 value). It costs the asynchrony: the load is waited on before the
// store (the unrolled loader issues all of a tile's loads first), and the tile takes twice the
// shared memory of an fp8 one. Only these variants pay it.
#pragma once

#include "primitives/cp_async.cuh"
#include "primitives/types.cuh"

namespace flashkv {

// The element type a K / V tile is staged in: the cache's KVT, or T (the query's 16-bit type)
// where an fp8 cache is WIDENED.
template <class T, class KVT, bool WIDENED>
struct StagedKV {
  using type = KVT;
};
template <class T, class KVT>
struct StagedKV<T, KVT, true> {
  using type = T;
};

// The 16-byte chunks of one tile a thread loads, N of them: issue() each, then finish(). With
// the cache's own element type each is a cp.async (finish does nothing). Widened, issue() loads 8
// fp8 values (through L2, .cg, as cp.async.cg: not the read-only path, since the fused decode step
// reads rows its own launch appended) and finish() stores them converted: every load of the tile
// is in flight before the first store waits on one.
template <class SmemT, class MemT, int N>
struct KVChunkCopy {
  // (A function, not a static constexpr member: NVRTC's -default-device emits such a member as a
  // device variable, which renumbers the module's symbols.)
  __device__ __forceinline__ static constexpr bool widen() { return sizeof(SmemT) != sizeof(MemT); }
  static_assert(!widen() || (is_fp8<MemT>() && sizeof(SmemT) == 2), "fp8 widened to 16 bits");
  uint2 raw[widen() ? N : 1];
  u32 dst[widen() ? N : 1];

  // Chunk i (< N) into shared address `to` from `from`, the chunk's first element in the cache;
  // zeros when `valid` is false (nothing is read).
  __device__ __forceinline__ void issue(int i, u32 to, const void* from, bool valid) {
    if constexpr (!widen()) {
      cp_async_16(to, from, valid);
    } else {
      raw[i] = make_uint2(0u, 0u);
      if (valid)
        asm volatile("ld.global.cg.v2.u32 {%0, %1}, [%2];\n"
                     : "=r"(raw[i].x), "=r"(raw[i].y)
                     : "l"(from));
      dst[i] = to;
    }
  }

  __device__ __forceinline__ void finish() {
    if constexpr (widen()) {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const u32 a = fp8x2_to_16x2<SmemT, MemT>(raw[i].x);
        const u32 b = fp8x2_to_16x2<SmemT, MemT>(raw[i].x >> 16);
        const u32 c = fp8x2_to_16x2<SmemT, MemT>(raw[i].y);
        const u32 d = fp8x2_to_16x2<SmemT, MemT>(raw[i].y >> 16);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst[i]), "r"(a), "r"(b),
                     "r"(c), "r"(d));
      }
    }
  }
};

}  // namespace flashkv
