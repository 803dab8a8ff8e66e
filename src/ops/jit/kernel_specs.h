// The JIT specializations each op uses, named once so run() and precompile() agree on them.
#pragma once

#include <string>

#include "attention/decode/decode_key.h"
#include "attention/prefill/prefill_key.h"
#include "flashkv/dtype.h"
#include "ops/jit/jit_util.h"
#include "ops/jit/variant_jit.h"
#include "runtime/kernel_cache.h"
#include "tuning/policy.cuh"

namespace flashkv::ops {

using flashkv::DecodeTCTuning;

struct KernelSpec {
  std::string id;
  runtime::RequestFactory make;
};

// merge_state / merge_states / merge_lse kernels for value type `t`.
KernelSpec merge_kernel_spec(DType t);

// A key type's kernel (attention/decode/decode_key.h, attention/prefill/prefill_key.h): its id,
// and the request that compiles its header with its name expressions (and a user variant's source).
template <class Key>
KernelSpec kernel_spec(const Key& key) {
  const std::string id = key.cache_id();
  return {id, [id, header = std::string(key.header()), names = key.name_expressions(),
               extra = key.variant.source, preamble = key.preamble()] {
            runtime::CompileRequest r = make_request(id, header, names, extra);
            r.source = preamble + r.source;
            return r;
          }};
}

// The shapes BatchDecode's auto mode (BatchDecodeConfig.ctas_per_sm = 0) picks besides the default
// at head_dim <= 128 (ops/decode/decode_shape_choice.cpp says when; tuning/sm90.cuh why): 4 CTAs of
// 2 warps per SM, 1 of 8.
inline constexpr DecodeTCTuning kDecodeTCSmallCtas{0, tuning::Policy::kDecodeSmallCtaWarps,
                                                   tuning::Policy::kDecodeSmallCtasPerSm};
inline constexpr DecodeTCTuning kDecodeTCOneCta{0, tuning::Policy::kDecodeOneCtaWarps,
                                                tuning::Policy::kDecodeOneCtaPerSm};

// Whether the Hopper wgmma prefill kernel (attention/prefill/prefill_hopper_ws.cuh) can run a
// plan: an sm_90a target, 128-row query tiles (two warpgroups of 64 rows), a softmax variant that
// does not rewrite staged keys or values (those keep the mma.sync kernel:
// kernels/attention/prefill/prefill_hopper_variant.cuh) and its shared memory at head_dim within
// the GPU's per-block limit. Empty when it can, else why not (the error of
// PrefillPlanOptions.backend = kWgmma names it).
// kv_elem_bytes: 1 for fp8 KV (the kernel then also stages fp8 tiles).
std::string prefill_wgmma_unsupported(const std::string& arch, int rows, bool variant_rewrites_kv,
                                      int head_dim, int max_smem_per_block, int kv_elem_bytes = 2,
                                      bool variant_softmax = true);

// The RoPE kernel (kv/rope.cuh) for element type `t`: both vector widths and both pairings.
KernelSpec rope_kernel_spec(DType t);
// The append kernel (kv/append.cuh) for rows of `src` into a cache of `cache` (equal: the copy
// kernel; an fp8 cache and wider rows: the quantizing one): both vector widths.
KernelSpec kv_append_kernel_spec(DType cache, DType src);
// get_batch_indices_positions' kernel (kv/append.cuh; no element type).
KernelSpec batch_indices_positions_kernel_spec();

// The multi-level cascade's gather and merge kernels (attention/cascade/cascade_merge.cuh).
KernelSpec cascade_kernel_spec(DType dtype);
}  // namespace flashkv::ops
