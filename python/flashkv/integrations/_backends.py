"""The attention libraries a serving adapter can drive through one FlashInfer-shaped API: flashkv
itself, and FlashInfer (the paper's comparison: the same engine on FlashInfer). Both expose the
same wrapper classes and ``append_paged_kv_cache``; what differs is how the wrappers are made and
which variants exist (attention sinks are a flashkv extension)."""

from __future__ import annotations



def _import(name):
    if name == "flashkv":
        import flashkv

        return flashkv
    import flashinfer  # optional: the comparison backend

    return flashinfer


class AttentionBackend:
    """Makes planned wrappers of one library over caller-owned workspaces."""

    def __init__(self, name: str):
        if name not in ("flashkv", "flashinfer"):
            raise ValueError(f"backend: expected 'flashkv' or 'flashinfer', got {name!r}")
        self.name = name
        try:
            self.lib = _import(name)
        except ImportError as e:  # flashinfer is optional
            raise ImportError(f"backend {name!r}: cannot import {name} ({e})") from e

    @property
    def supports_sinks(self) -> bool:
        return self.name == "flashkv"

    def decode(self, workspace, layout):
        if self.name == "flashinfer":
            # Tensor cores for GQA groups, as serving engines configure FlashInfer.
            return self.lib.BatchDecodeWithPagedKVCacheWrapper(workspace, layout,
                                                               use_tensor_cores=True)
        return self.lib.BatchDecodeWithPagedKVCacheWrapper(workspace, layout)

    def prefill_paged(self, workspace, layout):
        return self.lib.BatchPrefillWithPagedKVCacheWrapper(workspace, layout)

    def prefill_ragged(self, workspace, layout):
        return self.lib.BatchPrefillWithRaggedKVCacheWrapper(workspace, layout)

    def variant_kwargs(self, sinks):
        """Plan keywords for attention sinks (a float32 [num_qo_heads] array), or none."""
        if sinks is None:
            return {}
        if not self.supports_sinks:
            raise NotImplementedError(
                f"s_aux (attention sinks, gpt-oss): the {self.name} backend has no sinks in its "
                "batch wrappers; use backend='flashkv'")
        return {"sinks": sinks}

    def append(self, k, v, batch_indices, positions, paged_kv, kv_indices, kv_indptr, last,
               k_scale=None, v_scale=None):
        if self.name == "flashinfer":
            if k_scale not in (None, 1.0) or v_scale not in (None, 1.0):
                raise NotImplementedError("k_scale / v_scale in append: flashinfer's append does "
                                          "not quantize")
            return self.lib.append_paged_kv_cache(k, v, batch_indices, positions, paged_kv,
                                                  kv_indices, kv_indptr, last, "NHD")
        return self.lib.append_paged_kv_cache(k, v, batch_indices, positions, paged_kv,
                                              kv_indices, kv_indptr, last, "NHD",
                                              k_scale=k_scale, v_scale=v_scale)
