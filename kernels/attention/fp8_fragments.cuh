// fp8 KV on the 16-bit MMAs (mma.sync m16n8k16): the tensor-core decode kernel (decode_tc.cuh)
// and the mma.sync prefill kernel (prefill_mainloop.cuh) keep fp8 K and V tiles in shared memory
// and widen fragments in registers. ldmatrix moves 16-bit elements, i.e. pairs of fp8 values, so
// the fragments it yields from fp8 rows are not the m16n8k16 layouts; each is fixed by a column
// order that the math does not see, instead of shuffles:
// - S = Q·Kᵀ: a non-transposed ldmatrix of K gives lane l the 4 fp8 values of columns
//   4(l%4) + {0..3} of a 16-column chunk; widened, they are its B fragment when the chunk's
//   k positions 2c + e and 8 + 2c + e stand for columns 4c + e and 4c + 2 + e (c = l%4).
//   The dot product over k does not depend on the order, so Q's staged columns are permuted the
//   same way (fp8_permute_q_rows), once per work item.
// - O = P·V: a transposed ldmatrix of V gives lane l tokens 2c, 2c + 1 of columns 2n, 2n + 1
//   (n = l/4): one byte permute splits them into the B fragments of two n-tiles, the chunk's even
//   columns and its odd ones (fp8_v_fragments). The epilogues write those columns back in order.
#pragma once

#include "primitives/mma.cuh"
#include "primitives/types.cuh"

namespace flashkv {

// Staged Q rows [0, rows) (16-bit, rows of kQChunks swizzled 16-byte chunks) permuted in place:
// within each 16 columns, position 2c + e holds column 4c + e and position 8 + 2c + e column
// 4c + 2 + e. A thread owns a row's pair of 8-column chunks. Every thread of the CTA calls it,
// after a barrier that follows Q's arrival.
template <int kQChunks, int kThreads>
__device__ __forceinline__ void fp8_permute_q_rows(unsigned char* q_smem, int rows) {
  constexpr int kPairs = kQChunks / 2;
  for (int idx = threadIdx.x; idx < rows * kPairs; idx += kThreads) {
    const int row = idx / kPairs, j = idx % kPairs;
    uint4* lo = reinterpret_cast<uint4*>(q_smem + swizzled_offset<kQChunks>(row, 2 * j));
    uint4* hi = reinterpret_cast<uint4*>(q_smem + swizzled_offset<kQChunks>(row, 2 * j + 1));
    const uint4 a = *lo, b = *hi;  // words: columns (0,1) (2,3) (4,5) (6,7) | (8,9) ... (14,15)
    *lo = make_uint4(a.x, a.z, b.x, b.z);
    *hi = make_uint4(a.y, a.w, b.y, b.w);
  }
}

// From kb, an ldmatrix_x4 of K (matrices: tokens 0-7 / 8-15 of a 32-column pair of chunks' first
// chunk, then of its second), the B fragments of 16-column chunk `half`: tokens 0-7 (b0) and
// 8-15 (b1), widened to the MMA type T.
template <class T, class F>
__device__ __forceinline__ void fp8_k_fragments(const u32 (&kb)[4], int half, u32 (&b0)[2],
                                                u32 (&b1)[2]) {
  b0[0] = fp8x2_to_16x2<T, F>(kb[2 * half]);
  b0[1] = fp8x2_to_16x2<T, F>(kb[2 * half] >> 16);
  b1[0] = fp8x2_to_16x2<T, F>(kb[2 * half + 1]);
  b1[1] = fp8x2_to_16x2<T, F>(kb[2 * half + 1] >> 16);
}

// From vb, an ldmatrix_x4_trans of V (the same matrices), the B fragments of chunk `half`'s even
// columns and of its odd ones. A register holds bytes (tok 2c, col 2n) (tok 2c, col 2n+1)
// (tok 2c+1, col 2n) (tok 2c+1, col 2n+1).
template <class T, class F>
__device__ __forceinline__ void fp8_v_fragments(const u32 (&vb)[4], int half, u32 (&even)[2],
                                                u32 (&odd)[2]) {
  even[0] = fp8x2_to_16x2<T, F>(byte_perm(vb[2 * half], 0, 0x0020));
  even[1] = fp8x2_to_16x2<T, F>(byte_perm(vb[2 * half + 1], 0, 0x0020));
  odd[0] = fp8x2_to_16x2<T, F>(byte_perm(vb[2 * half], 0, 0x0031));
  odd[1] = fp8x2_to_16x2<T, F>(byte_perm(vb[2 * half + 1], 0, 0x0031));
}

}  // namespace flashkv
