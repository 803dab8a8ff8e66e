"""A ``flashinfer``-compatible namespace on flashkv: FlashInfer 0.6's attention API (decode,
prefill paged / ragged / single, cascade, page, rope, sparse, fp8 arguments; sinks through
plan(sinks=...)) mapped onto flashkv's wrappers, which already take FlashInfer's arguments.

Import it as ``flashinfer`` with one line: ``flashkv.compat.install_as_flashinfer()``. Names
flashkv does not implement (MLA without flashkv.mla, FP8 queries, XQA, cuDNN / TRT-LLM /
CuTe-DSL backends, BatchAttention, the JIT sink wrapper, NVFP4, ...) are stand-ins: importing
them works, using them raises NotImplementedError naming the feature. Differences in behaviour
the namespace adapts (flashkv.compat.flashinfer._adapt): FlashInfer's float k_scale / v_scale on
16-bit caches, ``_plan_info``. Not adapted (flashkv's rules, documented in its wrappers): variants
are compiled into plan() (forward()'s variant arguments must equal the plan's), sinks go to plan(),
output dtype = q's (o_data_type otherwise raises NotImplementedError), head_dim 64 / 128 / 256.
"""

import flashkv as _fk

from . import (attention, cascade, decode, jit, mla, page, prefill, quantization, rope,  # noqa
               sparse, testing, utils)
from ._missing import module_getattr

__getattr__ = module_getattr("flashinfer")
__version__ = "0.6.17+flashkv." + _fk.__version__
__git_version__ = __version__

BatchAttention = attention.BatchAttention
BatchAttentionWithAttentionSinkWrapper = attention.BatchAttentionWithAttentionSinkWrapper
BatchDecodeWithPagedKVCacheWrapper = decode.BatchDecodeWithPagedKVCacheWrapper
CUDAGraphBatchDecodeWithPagedKVCacheWrapper = decode.CUDAGraphBatchDecodeWithPagedKVCacheWrapper
BatchDecodeMlaWithPagedKVCacheWrapper = decode.BatchDecodeMlaWithPagedKVCacheWrapper
fast_decode_plan = decode.fast_decode_plan
single_decode_with_kv_cache = decode.single_decode_with_kv_cache
BatchPrefillWithPagedKVCacheWrapper = prefill.BatchPrefillWithPagedKVCacheWrapper
BatchPrefillWithRaggedKVCacheWrapper = prefill.BatchPrefillWithRaggedKVCacheWrapper
single_prefill_with_kv_cache = prefill.single_prefill_with_kv_cache
single_prefill_with_kv_cache_return_lse = prefill.single_prefill_with_kv_cache_return_lse
MultiLevelCascadeAttentionWrapper = cascade.MultiLevelCascadeAttentionWrapper
BatchDecodeWithSharedPrefixPagedKVCacheWrapper = \
    cascade.BatchDecodeWithSharedPrefixPagedKVCacheWrapper
BatchPrefillWithSharedPrefixPagedKVCacheWrapper = \
    cascade.BatchPrefillWithSharedPrefixPagedKVCacheWrapper
merge_state = cascade.merge_state
merge_state_in_place = cascade.merge_state_in_place
merge_states = cascade.merge_states
append_paged_kv_cache = page.append_paged_kv_cache
append_paged_mla_kv_cache = page.append_paged_mla_kv_cache
get_batch_indices_positions = page.get_batch_indices_positions
get_seq_lens = page.get_seq_lens
packbits = quantization.packbits
segment_packbits = quantization.segment_packbits
apply_rope = rope.apply_rope
apply_rope_inplace = rope.apply_rope_inplace
apply_rope_pos_ids = rope.apply_rope_pos_ids
apply_rope_pos_ids_inplace = rope.apply_rope_pos_ids_inplace
apply_llama31_rope = rope.apply_llama31_rope
apply_llama31_rope_inplace = rope.apply_llama31_rope_inplace
apply_llama31_rope_pos_ids = rope.apply_llama31_rope_pos_ids
apply_llama31_rope_pos_ids_inplace = rope.apply_llama31_rope_pos_ids_inplace
apply_rope_with_cos_sin_cache = rope.apply_rope_with_cos_sin_cache
apply_rope_with_cos_sin_cache_inplace = rope.apply_rope_with_cos_sin_cache_inplace
BlockSparseAttentionWrapper = sparse.BlockSparseAttentionWrapper
VariableBlockSparseAttentionWrapper = sparse.VariableBlockSparseAttentionWrapper
next_positive_power_of_2 = utils.next_positive_power_of_2
