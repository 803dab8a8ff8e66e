// How an op turns a Variant (flashkv/variant_spec.h) into JIT source and kernel arguments: the
// variant's C++ type for the kernel template, the source that defines it, a short id for the
// kernel cache key, and the packed parameter block (kernels/variants/variant_args.cuh).
#pragma once

#include <cstdint>
#include <string>

#include "common/kernel_key.h"
#include "flashkv/variant_spec.h"
#include "variants/variant_args.cuh"

namespace flashkv::ops {

struct VariantJit {
  std::string id;      // "" (plain), "b<flags>" (built-in), "u<hash>" (user): part of kernel ids
  std::string type;    // the kernel template argument, e.g. "flashkv::BuiltinVariant<10>"
  std::string source;  // appended after the kernel header: defines `type` (user variants)
  bool use_softmax = true;
  bool transforms_qk = false;  // a built-in RoPE (user variants: unknown, false)
  // Rewrites staged keys or values (a built-in RoPE; a user variant naming key_transform,
  // value_transform or key_rope_pos): an fp8 cache is then staged widened (fp8_kv_widened).
  bool transforms_kv = false;
  bool causal = false;   // the built-in description's causal flag
  float sm_scale = 0.f;  // the built-in description's sm_scale (0: the op's)
  bool operator==(const VariantJit& o) const { return id == o.id; }
  // What a kernel key holds of it (common/kernel_key.h).
  KernelVariant kernel() const { return {type, id, source}; }
};

// Whether kernels stage a `kv_dtype` cache widened to 16 bits for variant `v`: an fp8 cache
// whose variant rewrites the staged keys or values (kernels/kv/kv_chunk_copy.cuh says why).
inline bool fp8_kv_widened(DType kv_dtype, const VariantJit& v) {
  return is_fp8_dtype(kv_dtype) && v.transforms_kv;
}

// Plain attention (flashkv::DefaultVariant): the kernels' default variant.
inline VariantJit plain_variant_jit() {
  VariantJit j;
  j.type = "flashkv::DefaultVariant";
  return j;
}

// The kernel side of `v` for head_dim `head_dim` (plan time; checks the user spec's shape: names,
// identifiers, parameter kinds).
VariantJit variant_jit(const Variant& v);

// The variant the batch decode kernel is compiled with: `v` without a built-in sliding window.
// Decode needs no mask for it: its schedule holds only the window's keys, and no key of a request
// lies right of its one row (BatchDecode::plan, precompile).
Variant decode_kernel_variant(const Variant& v);

// What the variant's tensors are checked against when a kernel is launched.
struct VariantCallShape {
  const char* op;  // for messages
  Device device;   // every variant tensor must be here
  int64_t batch;   // requests
  int64_t q_rows;  // rows of q in the call (decode: batch)
  int num_qo_heads;
  int head_dim;
  // A batch of one request: qo_len * kv_len, the bits its custom mask must hold when no
  // mask_indptr is given (checked). -1: not known here (a device mask_indptr is trusted).
  int64_t single_request_mask_bits = -1;
};

// The parameter block of `v` for one launch (run time): validates every argument against the
// call and packs it. Throws flashkv::Error naming the argument.
VariantArgsBlock pack_variant_args(const Variant& v, const VariantCallShape& call);

// Whether two packed blocks are the same bytes (a captured CUDA graph keeps its block by value:
// a plan with other arguments must not replay it).
bool same_variant_args(const VariantArgsBlock& a, const VariantArgsBlock& b);

}  // namespace flashkv::ops
