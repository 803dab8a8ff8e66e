"""flashkv: attention over paged KV caches for LLM serving, with FlashInfer's Python API.

Swap ``import flashinfer`` for ``import flashkv`` where these are used:

* :class:`BatchDecodeWithPagedKVCacheWrapper`, :func:`single_decode_with_kv_cache`
* :class:`BatchPrefillWithPagedKVCacheWrapper`, :class:`BatchPrefillWithRaggedKVCacheWrapper`,
  :func:`single_prefill_with_kv_cache`
* :func:`merge_state`, :func:`merge_state_in_place`, :func:`merge_states`

Arrays cross into C++ through DLPack without copies: PyTorch, CuPy, NumPy (and anything else with
``__dlpack__``). CUDA arrays run flashkv's GPU kernels on the caller's current stream; host arrays
(NumPy, CPU tensors) run the CPU reference backend, so everything here also works without a GPU.

LSE: like FlashInfer, every function here returns and takes **base-2** log-sum-exp. (The C++ API
and ``flashkv._C`` use natural logs; the wrappers convert.) Arguments flashkv does not implement
yet (RoPE inside attention, sliding windows, logit soft-capping, custom masks, FP8 scales, custom
variants) raise ``NotImplementedError`` naming the argument. Bad inputs raise ``ValueError``
(``TypeError`` for an unsupported dtype or device) with the C++ library's message; failures of
CUDA or NVRTC raise ``RuntimeError``.
"""

# The built extension may live in another directory than these sources (a CMake build dir on
# PYTHONPATH, see python/CMakeLists.txt): let `flashkv._C` be found in any `flashkv` directory on
# sys.path.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from . import _C  # noqa: E402
from .cascade import merge_state, merge_state_in_place, merge_states  # noqa: E402
from .decode import BatchDecodeWithPagedKVCacheWrapper, single_decode_with_kv_cache  # noqa: E402
from .prefill import (  # noqa: E402
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
)

__version__ = "0.1.0"


def cuda_available() -> bool:
    """True when the CUDA driver loaded and reports a device (flashkv itself needs no torch)."""
    return _C.cuda_available()


__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "cuda_available",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache",
]
