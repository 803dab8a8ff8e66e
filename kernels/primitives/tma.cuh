// Hopper's tensor memory accelerator (TMA: cp.async.bulk.tensor) and the shared-memory mbarriers
// that count its bytes (sm_90). Why TMA for KV tiles: one instruction moves a whole box (a page's
// tokens x 64 columns), already in wgmma's 128-byte-swizzled layout, where cp.async needs one
// instruction per 16 bytes per thread (on the H200 the per-thread loads were a third of the
// prefill kernel's instructions, and they queue with wgmma in the MIO pipe).
#pragma once

#include "primitives/tma_desc.cuh"
#include "primitives/types.cuh"

namespace flashkv {

__device__ __forceinline__ void mbarrier_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Makes the barriers' initialization visible to the async proxy (TMA) before their first use.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also expects `bytes` more bytes (from complete_tx) in the current phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Waits until the phase with parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbarrier_wait_parity(u32 bar, u32 parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Loads the box at coordinates (c0, c1, c2, c3) of a 4-D tensor map into shared memory at `dst`
// (1024-byte aligned for the 128-byte swizzle), counting its bytes on barrier `bar`. Boxes
// outside the tensor are filled with zeros.
__device__ __forceinline__ void tma_load_4d(u32 dst, const TmaDesc* desc, u32 bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3, %4, "
      "%5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(desc)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

}  // namespace flashkv
