"""``flashinfer.sparse`` on flashkv."""

__path__ = []  # a package to importers: flashinfer.<this>.<sub> resolves to a stand-in

from ... import sparse as _s
from ... import variable_sparse as _vs
from ._adapt import PlanInfoMixin
from ._missing import module_getattr

__getattr__ = module_getattr("flashinfer.sparse")


def _backend(backend):
    """FlashInfer's "fa2" / "fa3" pick its kernel; flashkv picks its own ("auto")."""
    return "auto" if backend in ("fa2", "fa3") else backend


class BlockSparseAttentionWrapper(PlanInfoMixin, _s.BlockSparseAttentionWrapper):
    """flashkv.BlockSparseAttentionWrapper (FlashInfer's plan() and run())."""

    def __init__(self, float_workspace_buffer, backend="auto"):
        super().__init__(float_workspace_buffer, _backend(backend))

    def plan_info(self):
        return {} if self._plan is None else {"planned": True}


class VariableBlockSparseAttentionWrapper(PlanInfoMixin, _vs.VariableBlockSparseAttentionWrapper):
    """flashkv.VariableBlockSparseAttentionWrapper (FlashInfer's plan() and run())."""

    def __init__(self, float_workspace_buffer, backend="auto", layout="HND"):
        super().__init__(float_workspace_buffer, _backend(backend), layout)

    def plan_info(self):
        return {} if self._plan is None else {"planned": True}
