"""``flashinfer.prefill`` on flashkv (module docstring of flashkv.compat.flashinfer)."""

__path__ = []  # a package to importers: flashinfer.<this>.<sub> resolves to a stand-in

import functools

from ... import _common as C
from ... import prefill as _p
from ._adapt import (PlanInfoMixin, check_head_dim, fold_16bit_scales, plan_with_head_dim_check,
                     scale_output)
from ._missing import module_getattr

__getattr__ = module_getattr("flashinfer.prefill")


class BatchPrefillWithPagedKVCacheWrapper(PlanInfoMixin, _p.BatchPrefillWithPagedKVCacheWrapper):
    """flashkv.BatchPrefillWithPagedKVCacheWrapper with FlashInfer's float k_scale / v_scale on
    16-bit caches (flashkv.compat.flashinfer._adapt)."""

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None, **kwargs):
        if sinks is not None:
            C.not_implemented("sinks", "<array>", "None at run(); flashkv takes sinks at plan()")
        for name, value in kwargs.items():
            if value is not None:
                C.not_implemented(name, type(value).__name__, "None")
        k, _ = C.unpack_paged_kv_cache(paged_kv_cache)
        q, k_scale, v_scale, v_factor = fold_16bit_scales(q, k, k_scale, v_scale)
        return scale_output(super().run(
            q, paged_kv_cache, *args, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, out=out,
            lse=lse, return_lse=return_lse, enable_pdl=enable_pdl, window_left=window_left),
            v_factor)

    run_return_lse = functools.partialmethod(run, return_lse=True)
    plan = plan_with_head_dim_check(_p.BatchPrefillWithPagedKVCacheWrapper.plan, 6, "head_dim_qk")
    begin_forward = plan


class BatchPrefillWithRaggedKVCacheWrapper(PlanInfoMixin, _p.BatchPrefillWithRaggedKVCacheWrapper):
    """flashkv.BatchPrefillWithRaggedKVCacheWrapper with FlashInfer's float k_scale / v_scale on
    16-bit KV."""

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, sinks=None, **kwargs):
        if sinks is not None:
            C.not_implemented("sinks", "<array>", "None at run(); flashkv takes sinks at plan()")
        for name, value in kwargs.items():
            if value is not None:
                C.not_implemented(name, type(value).__name__, "None")
        q, k_scale, v_scale, v_factor = fold_16bit_scales(q, k, k_scale, v_scale)
        return scale_output(super().run(
            q, k, v, *args, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, out=out, lse=lse,
            return_lse=return_lse, enable_pdl=enable_pdl), v_factor)

    run_return_lse = functools.partialmethod(run, return_lse=True)
    plan = plan_with_head_dim_check(_p.BatchPrefillWithRaggedKVCacheWrapper.plan, 4, "head_dim_qk")
    begin_forward = plan


def single_prefill_with_kv_cache(q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None,
                                 custom_mask=None, packed_custom_mask=None, causal=False,
                                 kv_layout="NHD", pos_encoding_mode="NONE",
                                 use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
                                 logits_soft_cap=None, rope_scale=None, rope_theta=None,
                                 backend="auto", return_lse=False, kv_cache_sf=None, k_scale=None,
                                 v_scale=None, **kwargs):
    """flashkv.single_prefill_with_kv_cache with FlashInfer 0.6's scale arguments: ``k_scale`` /
    ``v_scale`` are the KV's calibration (dequantization) scales, flashkv's ``scale_k`` /
    ``scale_v`` (on a 16-bit KV they scale logits and output, _adapt); ``scale_q`` / ``scale_k``
    / ``scale_v`` are FlashInfer's per-head scales of FP8 queries, which it reads only for an
    fp8 q (flashkv: NotImplementedError for fp8 q, ignored otherwise, as FlashInfer ignores
    them)."""
    check_head_dim(q.shape[-1])
    if kv_cache_sf is not None:
        C.not_implemented("kv_cache_sf", "<arrays>", "None (NVFP4 KV caches)")
    del scale_q, scale_k, scale_v  # FP8-query scales: q is 16-bit here (checked below)
    q, k_scale, v_scale, v_factor = fold_16bit_scales(q, k, k_scale, v_scale)
    return scale_output(_p.single_prefill_with_kv_cache(
        q, k, v, None, k_scale, v_scale, o_dtype, custom_mask, packed_custom_mask, causal,
        kv_layout, pos_encoding_mode, use_fp16_qk_reduction, sm_scale, window_left,
        logits_soft_cap, rope_scale, rope_theta, backend, return_lse, **kwargs), v_factor)


single_prefill_with_kv_cache_return_lse = functools.partial(single_prefill_with_kv_cache,
                                                            return_lse=True)
