// The tensor maps of the Hopper prefill kernel's TMA KV loads (kernels/primitives/tma.cuh): K
// and V as 4-D tensors (head_dim, token in page, head, page), ragged KV as (head_dim, token, head,
// 1), boxes of 64 columns (128 bytes, 128-byte swizzle: wgmma's layout) x box tokens.
#pragma once

#include <cstdint>

#include "attention/prefill/prefill_params.cuh"
#include "flashkv/dtype.h"

namespace flashkv::ops {

// Where K and V are, as run() checked them.
struct PrefillKVTensors {
  const void* k = nullptr;
  const void* v = nullptr;
  DType dtype{};
  int head_dim = 0, num_kv_heads = 0;
  int64_t page_size = 0;                                       // paged: tokens per page; ragged: 0
  int64_t num_pages = 0;                                       // paged: pages; ragged: KV rows
  int64_t page_stride = 0, token_stride = 0, head_stride = 0;  // elements
  bool operator==(const PrefillKVTensors&) const = default;
};

// Whether the kernel may load this KV by TMA, in boxes of 16 tokens of one page (or of ragged
// rows): ragged KV or pages of >= 16 tokens, a power of two (smaller pages would need a box per
// few tokens), with strides and sizes TMA can describe.
bool prefill_kv_tma_fits(const PrefillKVTensors& kv);

// Encodes p.k_tma / p.v_tma (16-token boxes) and p.k1_tma / p.v1_tma (one token); false if the
// driver refuses one (the maps are then not to be used; PrefillCore keeps them in a scratch).
bool encode_prefill_kv_tma(const PrefillKVTensors& kv, PrefillParams& p);

// Where q is, as run() checked it: [rows, num_qo_heads, head_dim] with these element strides.
struct PrefillQTensor {
  const void* q = nullptr;
  DType dtype{};
  int head_dim = 0, num_qo_heads = 0;
  int64_t rows = 0, stride_n = 0, stride_h = 0;
  bool operator==(const PrefillQTensor&) const = default;
};

// Encodes p.q_tma: boxes of 64 columns x `group` heads x `tokens` tokens, a query tile's rows in
// its (token, head) order; false if the driver refuses it.
bool encode_prefill_q_tma(const PrefillQTensor& q, int group, int tokens, PrefillParams& p);

}  // namespace flashkv::ops
