"""``flashinfer.attention``: FlashInfer's persistent BatchAttention and its attention-sink wrapper
(built on FlashInfer's JIT customization) are not implemented by flashkv; flashkv's decode and
prefill wrappers take ``sinks=`` in plan() instead."""

__path__ = []  # a package to importers: flashinfer.<this>.<sub> resolves to a stand-in

from ._missing import missing, module_getattr

__getattr__ = module_getattr("flashinfer.attention")

BatchAttention = missing("flashinfer.BatchAttention", "persistent batch attention")
BatchAttentionWithAttentionSinkWrapper = missing(
    "flashinfer.BatchAttentionWithAttentionSinkWrapper",
    "FlashInfer's JIT-customized sink wrapper; flashkv's wrappers take plan(sinks=...)")
