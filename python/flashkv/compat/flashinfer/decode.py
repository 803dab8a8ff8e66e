"""``flashinfer.decode`` on flashkv (module docstring of flashkv.compat.flashinfer)."""

__path__ = []  # a package to importers: flashinfer.<this>.<sub> resolves to a stand-in

import functools

from ... import _common as C
from ... import decode as _d
from ._adapt import (PlanInfoMixin, check_head_dim, fold_16bit_scales, plan_with_head_dim_check,
                     scale_output)
from ._missing import module_getattr

__getattr__ = module_getattr("flashinfer.decode")


class BatchDecodeWithPagedKVCacheWrapper(PlanInfoMixin, _d.BatchDecodeWithPagedKVCacheWrapper):
    """flashkv.BatchDecodeWithPagedKVCacheWrapper with FlashInfer's float k_scale / v_scale on
    16-bit caches (flashkv.compat.flashinfer._adapt)."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 use_tensor_cores=False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None):
        # FlashInfer's "fa3" routes tensor-core decode to its Hopper prefill kernel: a speed hint
        # (flashkv picks its decode kernel itself).
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, use_tensor_cores,
                         paged_kv_indptr_buffer, paged_kv_indices_buffer,
                         paged_kv_last_page_len_buffer, "auto" if backend == "fa3" else backend,
                         jit_args)
        self.use_tensor_cores = bool(use_tensor_cores)
        self._backend = backend

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None,
            q_len_per_req=None, skip_softmax_threshold_scale_factor=None, kv_cache_sf=None):
        if skip_softmax_threshold_scale_factor is not None:
            C.not_implemented("skip_softmax_threshold_scale_factor",
                              skip_softmax_threshold_scale_factor, "None")
        if kv_cache_sf is not None:
            C.not_implemented("kv_cache_sf", "<array>", "None (NVFP4 caches)")
        k, _ = C.unpack_paged_kv_cache(paged_kv_cache)
        q, k_scale, v_scale, v_factor = fold_16bit_scales(q, k, k_scale, v_scale)
        return scale_output(super().run(
            q, paged_kv_cache, *args, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, out=out,
            lse=lse, return_lse=return_lse, enable_pdl=enable_pdl, window_left=window_left,
            sinks=sinks, q_len_per_req=q_len_per_req), v_factor)

    run_return_lse = functools.partialmethod(run, return_lse=True)
    def plan(self, *args, **kwargs):
        """flashkv's plan(), with FlashInfer 0.6's rule that multi-token decode (q_len_per_req >
        1) needs use_tensor_cores=True (flashkv runs it on its prefill path either way)."""
        if int(kwargs.get("q_len_per_req", 1)) > 1 and not self.use_tensor_cores:
            raise ValueError("q_len_per_req > 1 requires tensor-core decode (use_tensor_cores="
                             "True), as in FlashInfer 0.6")
        if int(kwargs.get("q_len_per_req", 1)) > 1 and self._backend == "fa3":
            raise NotImplementedError("q_len_per_req > 1 is supported on the fa2 / auto "
                                      "backends, not fa3 (as in FlashInfer 0.6)")
        return _checked_plan(self, *args, **kwargs)

    begin_forward = plan


_checked_plan = plan_with_head_dim_check(_d.BatchDecodeWithPagedKVCacheWrapper.plan, 5, "head_dim")


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FlashInfer's deprecated CUDA-graph decode wrapper: the decode wrapper in CUDA graph mode."""

    def __init__(self, workspace_buffer, indptr_buffer, indices_buffer, last_page_len_buffer,
                 kv_layout="NHD", use_tensor_cores=False):
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph=True,
                         use_tensor_cores=use_tensor_cores, paged_kv_indptr_buffer=indptr_buffer,
                         paged_kv_indices_buffer=indices_buffer,
                         paged_kv_last_page_len_buffer=last_page_len_buffer)


def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE",
                                use_tensor_cores=False, q_scale=None, k_scale=None, v_scale=None,
                                window_left=-1, logits_soft_cap=None, sm_scale=None,
                                rope_scale=None, rope_theta=None, return_lse=False, **kwargs):
    """flashkv.single_decode_with_kv_cache with FlashInfer's 16-bit-cache scales."""
    check_head_dim(q.shape[-1])
    q, k_scale, v_scale, v_factor = fold_16bit_scales(q, k, k_scale, v_scale)
    return scale_output(_d.single_decode_with_kv_cache(
        q, k, v, kv_layout, pos_encoding_mode, use_tensor_cores, q_scale, k_scale, v_scale,
        window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta, return_lse, **kwargs),
        v_factor)


fast_decode_plan = _d.fast_decode_plan
BatchDecodeMlaWithPagedKVCacheWrapper = __getattr__("BatchDecodeMlaWithPagedKVCacheWrapper")
