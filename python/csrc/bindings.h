// The parts of flashkv._C, one per op family, each in its own file (module.cpp calls them in
// order; the variants' bind_variants is in variant.h): a new op family adds one bind_* function
// here and its *_binding.cpp.
#pragma once

#include "array_view.h"

namespace flashkv::python {

// _C.AttentionShape, _C.PageTableNames and the checks the ops share (plan_binding.cpp).
void bind_plan_types(nb::module_& m);
// _C.BatchDecode, DecodePlanOptions / DecodePlanInfo, single_decode, the CPU reference.
void bind_decode(nb::module_& m);
// _C.BatchPrefillPaged / BatchPrefillRagged, PrefillPlanOptions / PrefillPlanInfo,
// single_prefill, the CPU references.
void bind_prefill(nb::module_& m);
// _C.MultiLevelCascade, CascadeShape / CascadePlanOptions / CascadePlanInfo.
void bind_cascade(nb::module_& m);
// _C.BlockSparseAttention, VariableBlockSparseAttention, their CPU references
// (block_sparse_binding.cpp).
void bind_block_sparse(nb::module_& m);
// merge_state, merge_state_in_place, merge_states.
void bind_merge(nb::module_& m);
// append_paged_kv_cache, get_batch_indices_positions and the RoPE ops.
void bind_kv_rope(nb::module_& m);
// quantize_kv, dequantize_kv, nvfp4_tensor_scale, kv_format_info: the quantized KV formats'
// host quantizers (kv_quant_binding.cpp).
void bind_kv_quant(nb::module_& m);
// precompile, precompile_kernel_ids, precompile_ops, precompile_defaults (filling the kernel
// cache ahead of time; not an op family).
void bind_precompile(nb::module_& m);

}  // namespace flashkv::python
