// Tensor-core primitives (sm_80+): ldmatrix and mma.sync m16n8k16 with f32 accumulation.
// One wrapper per PTX instruction, named after it. Fragment layouts are the PTX ISA's
// ("Matrix Fragments for mma.m16n8k16"): for A (16x16, row-major) thread t holds rows t/4 and
// t/4 + 8, columns 2*(t%4) + {0,1} and + 8; for C/D (16x8, f32) thread t holds row t/4 and
// t/4 + 8, columns 2*(t%4) + {0,1}.
#pragma once

#include "primitives/types.cuh"

namespace flashkv {

// Four 8x8 b16 matrices from shared memory; lane l supplies the row address of matrix l/8, row l%8.
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 smem_row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_row_addr));
}

// As ldmatrix_x4, each 8x8 matrix transposed (for the B operand of P·V from row-major V).
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 smem_row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_row_addr));
}

// Byte permute (PRMT): byte i of the result is byte selector[4i..4i+3] of {b, a} (a: bytes 0-3).
__device__ __forceinline__ u32 byte_perm(u32 a, u32 b, u32 selector) {
  u32 r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

// D = A·B + C, A 16x16 (row), B 16x8 (col), 16-bit inputs T, f32 accumulators.
template <class T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]);

template <>
__device__ __forceinline__ void mma_m16n8k16<half_t>(float (&d)[4], const u32 (&a)[4],
                                                     const u32 (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<bf16_t>(float (&d)[4], const u32 (&a)[4],
                                                     const u32 (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a shared-memory tile whose rows are
// `kRowChunks` 16-byte chunks long, XOR-swizzled so that the 8 rows an ldmatrix reads at one
// chunk column hit 8 different bank groups (no conflicts, no padding).
// Rows of 64 bytes (fp8 rows of head_dim 64) pair up: row r's chunks are XORed with (r / 2) % 4,
// so rows r and r + 1 fill the two halves of the 8 bank groups.
template <int kRowChunks>
__device__ __forceinline__ u32 swizzled_offset(int row, int chunk) {
  static_assert(kRowChunks % 8 == 0 || kRowChunks == 4,
                "swizzle needs rows of 64 bytes or a multiple of 128 bytes");
  if constexpr (kRowChunks == 4) {
    return (u32)((row * 4 + (chunk ^ ((row >> 1) & 3))) * 16);
  } else {
    return (u32)((row * kRowChunks + (chunk ^ (row % 8))) * 16);
  }
}

}  // namespace flashkv
