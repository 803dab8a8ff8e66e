"""``flashinfer.rope`` on flashkv."""

__path__ = []  # a package to importers: flashinfer.<this>.<sub> resolves to a stand-in

from ... import rope as _r
from ._missing import missing, module_getattr

__getattr__ = module_getattr("flashinfer.rope")

apply_rope = _r.apply_rope
apply_rope_inplace = _r.apply_rope_inplace
apply_rope_pos_ids = _r.apply_rope_pos_ids
apply_rope_pos_ids_inplace = _r.apply_rope_pos_ids_inplace
apply_llama31_rope = _r.apply_llama31_rope
apply_llama31_rope_inplace = _r.apply_llama31_rope_inplace
apply_llama31_rope_pos_ids = _r.apply_llama31_rope_pos_ids
apply_llama31_rope_pos_ids_inplace = _r.apply_llama31_rope_pos_ids_inplace
apply_rope_with_cos_sin_cache = _r.apply_rope_with_cos_sin_cache
apply_rope_with_cos_sin_cache_inplace = _r.apply_rope_with_cos_sin_cache_inplace
rope_quantize_fp8 = missing("flashinfer.rope.rope_quantize_fp8", "FP8 queries")
mla_rope_quantize_fp8 = missing("flashinfer.rope.mla_rope_quantize_fp8", "MLA, FP8 queries")
rope_quantize_fp8_append_paged_kv_cache = missing(
    "flashinfer.rope.rope_quantize_fp8_append_paged_kv_cache",
    "flashkv's fused equivalent is BatchDecodeWithPagedKVCacheWrapper.run_step")
