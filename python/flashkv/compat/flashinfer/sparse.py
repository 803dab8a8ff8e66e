"""``flashinfer.sparse`` on flashkv."""

__path__ = []  # a package to importers: flashinfer.<this>.<sub> resolves to a stand-in

from ... import sparse as _s
from ... import variable_sparse as _vs
from ._adapt import PlanInfoMixin
from ._missing import module_getattr

__getattr__ = module_getattr("flashinfer.sparse")


class BlockSparseAttentionWrapper(PlanInfoMixin, _s.BlockSparseAttentionWrapper):
    """flashkv.BlockSparseAttentionWrapper (FlashInfer's plan() and run())."""

    def plan_info(self):
        return {} if self._plan is None else {"planned": True}


class VariableBlockSparseAttentionWrapper(PlanInfoMixin, _vs.VariableBlockSparseAttentionWrapper):
    """flashkv.VariableBlockSparseAttentionWrapper (FlashInfer's plan() and run())."""

    def plan_info(self):
        return {} if self._plan is None else {"planned": True}
