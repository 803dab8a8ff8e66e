#include "ops/prefill/prefill_tma.h"

#include <cuda.h>

#include <algorithm>
#include <cstring>

#include "runtime/driver.h"

namespace flashkv::ops {

bool prefill_kv_tma_fits(const PrefillKVTensors& kv) {
  const int64_t es = 2;  // 16-bit elements
  for (int64_t st : {kv.token_stride, kv.head_stride}) {
    if (st <= 0 || st * es % 16 != 0 || st * es >= (int64_t{1} << 40)) return false;
  }
  if (kv.head_dim % 64 != 0 || kv.num_pages <= 0 || kv.num_pages >= (int64_t{1} << 31))
    return false;
  if (kv.page_size == 0) return true;  // ragged
  const bool pow2 = (kv.page_size & (kv.page_size - 1)) == 0;
  return pow2 && kv.page_size >= 16 && kv.page_stride > 0 && kv.page_stride * es % 16 == 0 &&
         kv.page_stride * es < (int64_t{1} << 40);
}

namespace {

CUtensorMapDataType tma_type(DType t) {
  return t == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// A 4-D tiled map with 128-byte swizzle (wgmma's layout); zeros for boxes outside the tensor.
bool encode_4d(const void* ptr, DType t, const cuuint64_t (&dims)[4],
               const cuuint64_t (&strides)[3], const cuuint32_t (&box)[4], TmaDesc& out) {
  static_assert(sizeof(CUtensorMap) == sizeof(TmaDesc), "TmaDesc mirrors CUtensorMap");
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r = runtime::driver().cuTensorMapEncodeTiled(
      &map, tma_type(t), 4, const_cast<void*>(ptr), dims, strides, box, elem_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return false;
  std::memcpy(&out, &map, sizeof(TmaDesc));
  return true;
}

}  // namespace

bool encode_prefill_q_tma(const PrefillQTensor& q, int group, int tokens, PrefillParams& p) {
  const cuuint64_t es = 2;
  if (q.head_dim % 64 != 0 || q.rows <= 0 || group > 256 || tokens > 256) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(q.head_dim),
                              static_cast<cuuint64_t>(q.num_qo_heads),
                              static_cast<cuuint64_t>(q.rows), 1};
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(q.stride_n) * es;
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(q.stride_h) * es, row_bytes,
                                 (row_bytes * dims[2] + 15) / 16 * 16};
  for (cuuint64_t s : strides)
    if (s == 0 || s % 16 != 0 || s >= (cuuint64_t{1} << 40)) return false;
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(group), static_cast<cuuint32_t>(tokens),
                             1};
  if (!encode_4d(q.q, q.dtype, dims, strides, box, p.q_tma)) return false;
  p.q_tma_tokens = tokens;
  return true;
}

bool encode_prefill_kv_tma(const PrefillKVTensors& kv, PrefillParams& p) {
  const cuuint64_t es = 2;
  const bool paged = kv.page_size > 0;
  // (head_dim, token, head, page): a box is 64 columns of 16 (or 1) tokens of one head (of one
  // page).
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(kv.head_dim),
                              static_cast<cuuint64_t>(paged ? kv.page_size : kv.num_pages),
                              static_cast<cuuint64_t>(kv.num_kv_heads),
                              static_cast<cuuint64_t>(paged ? kv.num_pages : 1)};
  const cuuint64_t head_bytes = static_cast<cuuint64_t>(kv.head_stride) * es;
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(kv.token_stride) * es, head_bytes,
                                 paged ? static_cast<cuuint64_t>(kv.page_stride) * es
                                       : (head_bytes * dims[2] + 15) / 16 * 16};  // one "page"
  const cuuint32_t box16[4] = {64, 16, 1, 1}, box1[4] = {64, 1, 1, 1};
  return encode_4d(kv.k, kv.dtype, dims, strides, box16, p.k_tma) &&
         encode_4d(kv.v, kv.dtype, dims, strides, box16, p.v_tma) &&
         encode_4d(kv.k, kv.dtype, dims, strides, box1, p.k1_tma) &&
         encode_4d(kv.v, kv.dtype, dims, strides, box1, p.v1_tma);
}

}  // namespace flashkv::ops
