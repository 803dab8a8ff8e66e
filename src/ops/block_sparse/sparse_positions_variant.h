// ALiBi and RoPE for the block-sparse ops, at the tokens' own positions. The prefill kernels'
// built-ins take a key's position to be its index among its request's gathered keys, which is
// not the token's position once blocks are gathered out of order or with gaps. This builds a
// user variant (variant_spec.h, JIT-compiled into the prefill kernel) whose hooks read the true
// positions from the plan's own device arrays:
//   key (request b, gathered index j): ids[kv_ptr[b] + j / page] * page + j % page
//   query (request b, row i):          q_start[b] + i + (N - M)   (causal's bottom-right alignment)
// and which carries the plan's other parts (soft-cap, sinks, the custom mask), since a plan has
// one variant. RoPE rotates with rotate-half pairs and per-element (cos, sin) (the key_transform
// hook: gathered keys are not consecutive positions, so the kernels' step rotation does not
// apply); its frequencies are rope_frequencies', passed as float hi + lo pairs (exact doubles).
#pragma once

#include <cstdint>

#include "flashkv/block_sparse.h"
#include "flashkv/variant_spec.h"

namespace flashkv::ops {

struct SparsePositionsInputs {
  // Device arrays of the plan: page ids, each request's first page id entry ([requests + 1]),
  // each request's first query row ([requests + 1]); the page size; N - M.
  TensorView ids, kv_ptr, q_start;
  int page = 1;
  int64_t shift = 0;
  int head_dim = 128;
  // The parts (device tensors; alibi_slopes / sinks already sliced to the launch's query heads).
  TensorView alibi_slopes;
  RopeParams rope;
  float logits_soft_cap = 0.f;
  TensorView sinks;
  CustomMask custom_mask;
  // Device scratch for the frequencies: 2 x head_dim / 2 floats (written by the caller's upload).
  TensorView freq_hi_lo;
};

// True when `o` asks for what only this variant gives (ALiBi slopes or RoPE).
bool needs_sparse_positions(const BlockSparseOptions& o);

// The host image of the frequencies freq_hi_lo holds: hi[0 .. D/2), then lo[0 .. D/2).
std::vector<float> sparse_rope_freq_image(const RopeParams& rope, int head_dim);

Variant sparse_positions_variant(const SparsePositionsInputs& in);

}  // namespace flashkv::ops
