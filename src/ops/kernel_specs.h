// The JIT specializations each op uses, named once so run() and precompile() agree on them.
#pragma once

#include <string>

#include "flashkv/dtype.h"
#include "ops/variant_jit.h"
#include "runtime/kernel_cache.h"

namespace flashkv::ops {

struct KernelSpec {
  std::string id;
  runtime::RequestFactory make;
};

// merge_state / merge_states / merge_lse kernels for value type `t`.
KernelSpec merge_kernel_spec(DType t);


// The tensor-core decode kernel's pipeline stages, warps and the CTAs per SM its grid is sized
// for (0: the defaults of kernels/attention/decode_shape.cuh); ignored by the CUDA-core kernel.
struct DecodeTCTuning {
  int stages = 0;
  int warps = 0;
  int ctas = 0;
  bool operator==(const DecodeTCTuning&) const = default;
};
// The shapes BatchDecode's auto mode (BatchDecodeConfig.ctas_per_sm = 0) picks besides the default
// at head_dim <= 128 (ops/decode_shape_choice.cpp says when): 4 CTAs of 2 warps per SM, 1 of 8.
inline constexpr DecodeTCTuning kDecodeTCSmallCtas{0, 2, 4};
inline constexpr DecodeTCTuning kDecodeTCOneCta{0, 8, 1};

// The batch decode kernel (and its merge stage) for one configuration.
// check_pages: the kernel also reports page ids outside the cache (DecodePlanOptions::
// check_page_ids; attention/decode_common.cuh), a slower variant with its own id.
KernelSpec decode_kernel_spec(DType q_dtype, DType kv_dtype, int head_dim, int group_size,
                              int page_size, bool tensor_cores = false,
                              const VariantJit& variant = plain_variant_jit(),
                              DecodeTCTuning tuning = {}, bool check_pages = false);
// The name expression of that kernel (its function in the compiled module).
std::string decode_kernel_name(DType q_dtype, DType kv_dtype, int head_dim, int group_size,
                               int page_size, bool tensor_cores, const VariantJit& variant,
                               DecodeTCTuning tuning = {});
// Whether the tensor-core decode kernel supports this shape (its accumulators fit in registers).
bool decode_tc_supported(int head_dim, int group_size);

// The batch prefill kernel for one (dtype, head_dim, query-tile rows, KV source: 0 ragged,
// 1 paged with a power-of-two page size, 2 any page size); see ops/prefill_kernel.h.
// With a variant (ops/variant_jit.h) its id joins the kernel id and its source the module.
KernelSpec prefill_kernel_spec(DType dtype, int head_dim, int rows, int kv_source,
                               const VariantJit& variant = plain_variant_jit());
// The Hopper wgmma prefill kernel (attention/prefill_hopper_ws.cuh) for one (dtype, head_dim, KV
// source); its query tile is always 128 rows and it runs plain attention only.
KernelSpec prefill_hopper_kernel_spec(DType dtype, int head_dim, int kv_source);
// Whether that kernel can run a plan: an sm_90a target, 128-row query tiles (two warpgroups of 64
// rows), plain attention (variants keep the mma.sync kernel) and its shared memory at head_dim
// within the GPU's per-block limit. Empty when it can, else why not (the error of
// PrefillPlanOptions.backend = kWgmma names it).
std::string prefill_wgmma_unsupported(const std::string& arch, int rows, bool plain_attention,
                                      int head_dim, int max_smem_per_block);

// The RoPE kernel (kv/rope.cuh) for element type `t`: both vector widths and both pairings.
KernelSpec rope_kernel_spec(DType t);
// The append kernel (kv/append.cuh) for element type `t`: both vector widths.
KernelSpec kv_append_kernel_spec(DType t);
// get_batch_indices_positions' kernel (kv/append.cuh; no element type).
KernelSpec batch_indices_positions_kernel_spec();

// The multi-level cascade's gather and merge kernels (attention/cascade_merge.cuh).
KernelSpec cascade_kernel_spec(DType dtype);
}  // namespace flashkv::ops
