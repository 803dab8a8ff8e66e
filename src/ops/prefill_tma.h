// The tensor maps of the Hopper prefill kernel's TMA KV loads (kernels/primitives/tma.cuh): K
// and V as 4-D tensors (head_dim, token in page, head, page), ragged KV as (head_dim, token, head,
// 1), boxes of 64 columns (128 bytes, 128-byte swizzle: wgmma's layout) x box tokens.
#pragma once

#include <cstdint>

#include "flashkv/dtype.h"
#include "attention/prefill_params.cuh"

namespace flashkv::ops {

// Where K and V are, as run() checked them.
struct PrefillKVTensors {
  const void* k = nullptr;
  const void* v = nullptr;
  DType dtype{};
  int head_dim = 0, num_kv_heads = 0;
  int64_t page_size = 0;   // paged: tokens per page; ragged: 0
  int64_t num_pages = 0;   // paged: pages; ragged: KV rows
  int64_t page_stride = 0, token_stride = 0, head_stride = 0;  // elements
  bool operator==(const PrefillKVTensors&) const = default;
};

// The box's tokens where the kernel may load this KV by TMA with `tile`-token KV tiles (every
// work item starting on a tile): a page (or a tile of it), or a tile of ragged rows; 0 where it
// may not (pages of fewer than 16 tokens or not a power of two: one box per page would be too
// many; strides or sizes TMA cannot describe).
int prefill_tma_box_tokens(const PrefillKVTensors& kv, int tile);

// Encodes p.k_tma / p.v_tma for `box` tokens; false (p untouched) if the driver refuses them.
bool encode_prefill_kv_tma(const PrefillKVTensors& kv, int box, PrefillParams& p);

// Where q is, as run() checked it: [rows, num_qo_heads, head_dim] with these element strides.
struct PrefillQTensor {
  const void* q = nullptr;
  DType dtype{};
  int head_dim = 0, num_qo_heads = 0;
  int64_t rows = 0, stride_n = 0, stride_h = 0;
  bool operator==(const PrefillQTensor&) const = default;
};

// Encodes p.q_tma: boxes of 64 columns x `group` heads x `tokens` tokens, a query tile's rows in
// its (token, head) order; false (p untouched) if the driver refuses it.
bool encode_prefill_q_tma(const PrefillQTensor& q, int group, int tokens, PrefillParams& p);

}  // namespace flashkv::ops
