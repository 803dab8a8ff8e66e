"""``flashinfer.cascade`` on flashkv."""

__path__ = []  # a package to importers: flashinfer.<this>.<sub> resolves to a stand-in

from ... import cascade as _c
from ._missing import missing, module_getattr

__getattr__ = module_getattr("flashinfer.cascade")

merge_state = _c.merge_state
merge_state_in_place = _c.merge_state_in_place
merge_states = _c.merge_states


class MultiLevelCascadeAttentionWrapper(_c.MultiLevelCascadeAttentionWrapper):
    """flashkv's MultiLevelCascadeAttentionWrapper (FlashInfer's constructor, plan() and run())."""


BatchDecodeWithSharedPrefixPagedKVCacheWrapper = missing(
    "flashinfer.cascade.BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
    "deprecated in FlashInfer; use MultiLevelCascadeAttentionWrapper")
BatchPrefillWithSharedPrefixPagedKVCacheWrapper = missing(
    "flashinfer.cascade.BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
    "deprecated in FlashInfer; use MultiLevelCascadeAttentionWrapper")
