"""The array helpers flashkv's modules use (:mod:`flashkv._array_core`, re-exported here) and the
route to the torch custom ops (:mod:`flashkv._torch_ops`): torch_ops(), load_torch_ops() and the
wrappers' dispatch_run().

_torch_ops is imported lazily, from load_torch_ops() only, and the modules it is built on
(_common, _eager) import _array_core, never this module: the imports run one way, public modules
-> _arrays -> (lazily) _torch_ops -> _eager, _common -> _array_core, _C
(python/tests/test_import_graph.py checks that they have no cycle).
"""

from . import _common as C
from ._array_core import *  # noqa: F401,F403  (framework, empty, call, cuda_stream, ...)
from ._array_core import framework

_TORCH_OPS = []  # empty until the first try; then [flashkv._torch_ops] or [None]


def torch_ops(x):
    """flashkv._torch_ops when x is a tensor its torch custom ops take (a torch CUDA tensor) and
    torch.compile is tracing the call, else None. The ops are registered on the first call with a
    torch tensor (or when flashkv is imported after torch); None where torch lacks
    torch.library.custom_op. The wrappers route through here so that under torch.compile their
    run() becomes one custom op; eagerly they call the same body directly (_torch_ops.tracing
    says why)."""
    if framework(x) != "torch":
        return None
    if not _TORCH_OPS:
        _TORCH_OPS.append(load_torch_ops())
    ops = _TORCH_OPS[0]
    return ops if ops is not None and ops.wants(x) and ops.tracing() else None


def load_torch_ops():
    """flashkv._torch_ops (registering the ops), or None without a torch that has custom ops; a
    registration that fails otherwise warns and leaves flashkv on its eager paths."""
    try:
        from . import _torch_ops
    except ImportError:
        return None
    except Exception as e:  # noqa: BLE001  (flashkv must import whatever torch does)
        import warnings

        warnings.warn(f"flashkv: torch custom ops not registered ({type(e).__name__}: {e}); "
                      f"torch tensors take the eager path", RuntimeWarning, stacklevel=2)
        return None
    return _torch_ops


def dispatch_run(wrapper, op_name, q, k, v, out, lse, return_lse, scale=C.NO_SCALE):
    """The wrappers' run(): after plan(), torch CUDA tensors go through the torch custom op
    ``flashkv::<op_name>`` (which torch.compile captures), everything else to ``wrapper._run``.
    `scale`: the KV cache's dequantization scales (_common.KVScale)."""
    C.require_plan(wrapper._plan)
    ops = torch_ops(q)
    if ops is not None:
        return ops.wrapper_run(op_name, wrapper, q, k, v, out, lse, return_lse, scale)
    return wrapper._run(q, k, v, out, lse, return_lse, scale)
