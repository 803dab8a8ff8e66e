"""flashkv: attention over paged KV caches for LLM serving, with FlashInfer's Python API.

Swap ``import flashinfer`` for ``import flashkv`` where these are used:

* :class:`BatchDecodeWithPagedKVCacheWrapper`, :func:`single_decode_with_kv_cache`
* :class:`BatchPrefillWithPagedKVCacheWrapper`, :class:`BatchPrefillWithRaggedKVCacheWrapper`,
  :func:`single_prefill_with_kv_cache`
* :func:`merge_state`, :func:`merge_state_in_place`, :func:`merge_states`,
  :class:`MultiLevelCascadeAttentionWrapper` (explicit per-level page tables)
* :func:`append_paged_kv_cache`, :func:`get_batch_indices_positions`, :func:`get_seq_lens`
  (``flashkv.page``)
* :func:`apply_rope`, :func:`apply_rope_pos_ids`, :func:`apply_llama31_rope`,
  :func:`apply_llama31_rope_pos_ids`, :func:`apply_rope_with_cos_sin_cache` and their
  ``*_inplace`` forms (``flashkv.rope``)

flashkv's own additions: :class:`MultiLevelCascadeWrapper` (a cascade that finds shared prefixes
in the batch's page table itself), ``BatchDecodeWithPagedKVCacheWrapper.run_step`` (RoPE +
append + decode attention in one launch) and :func:`check_device_errors` (errors the GPU kernels
found in device-resident indices, such as an append position past a request's pages).

Arrays cross into C++ through DLPack without copies: PyTorch, CuPy, NumPy (and anything else with
``__dlpack__``). CUDA arrays run flashkv's GPU kernels on the caller's current stream; host arrays
(NumPy, CPU tensors) run the CPU reference backend, so everything here also works without a GPU.

With PyTorch (>= 2.4), the GPU functions are also torch custom ops (``torch.ops.flashkv.*``,
:mod:`flashkv._torch_ops`): the wrappers' run(), the merges, the KV append and the pos_ids RoPE
call them on torch CUDA tensors, so ``torch.compile(fullgraph=True)`` captures them (plan() stays
outside the graph). ``python -m flashkv.bench`` runs the standard benchmark through this API.

LSE: like FlashInfer, every function here returns and takes **base-2** log-sum-exp. (The C++ API
and ``flashkv._C`` use natural logs; the wrappers convert.) Attention variants: the decode and
prefill functions take FlashInfer's ``pos_encoding_mode`` / ``window_left`` / ``logits_soft_cap``
/ ``rope_scale`` / ``rope_theta`` (prefill also ``custom_mask`` / ``packed_custom_mask``),
flashkv's ``sinks`` / ``alibi_slopes`` / ``sigmoid``, and user variants (:class:`Variant`, device
C++ compiled into the kernels; GPU only). Arguments flashkv does not implement yet (variants in
cascades, query scales) raise ``NotImplementedError`` naming the argument. Bad inputs raise
``ValueError`` (``TypeError`` for an unsupported dtype or device) with the C++ library's message;
failures of CUDA or NVRTC raise ``RuntimeError``.

FP8 KV caches: the decode and prefill wrappers, single_decode_with_kv_cache,
single_prefill_with_kv_cache, append_paged_kv_cache, run_step and
MultiLevelCascadeAttentionWrapper take ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` caches
(q and out float16 or bfloat16; plan()'s ``kv_data_type`` a torch dtype or its name; on the host
also NumPy arrays of ml_dtypes' float8 types) with FlashInfer's ``k_scale`` / ``v_scale`` (the
dequantization scales: real key = stored key * k_scale): None, a float, or (flashkv extension) a
float32 tensor of 1 or num_kv_heads elements on the cache's device, which the kernels read when
they run (CUDA graphs replay with its current value). append_paged_kv_cache and run_step
quantize float16 / bfloat16 / float32 rows into an fp8 cache with the same keyword-only
``k_scale`` / ``v_scale`` (round to nearest even, saturating). A 16-bit cache takes only None or
1.0 (``ValueError`` otherwise: fold the scale into ``sm_scale``); ``q_scale`` other than None or
1.0 raises ``NotImplementedError``.

Quantized KV formats beyond that (:mod:`flashkv.kv_quant`: ``"e4m3-per-token"``,
``"int4-g64"``, ``"nvfp4"``, ...) are plan()'s ``kv_data_type`` values of the decode and paged
prefill wrappers, with their group scales in run(); host wrappers read them through the CPU
reference, GPU plans raise ``NotImplementedError`` until their kernels land (issue 42).
:func:`quantize_kv` / :func:`dequantize_kv` are the host quantizers.
"""

# The built extension may live in another directory than these sources (a CMake build dir on
# PYTHONPATH, see python/CMakeLists.txt): let `flashkv._C` be found in any `flashkv` directory on
# sys.path.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from . import _C  # noqa: E402
from . import _nvrtc_wheel  # noqa: E402

_nvrtc_wheel.register()  # NVRTC from the nvidia-cuda-nvrtc wheel where it is installed
from .cascade import (  # noqa: E402
    MultiLevelCascadeAttentionWrapper,
    MultiLevelCascadeWrapper,
    merge_state,
    merge_state_in_place,
    merge_states,
)
from .decode import BatchDecodeWithPagedKVCacheWrapper, single_decode_with_kv_cache  # noqa: E402
from .page import (  # noqa: E402
    append_paged_kv_cache,
    check_device_errors,
    get_batch_indices_positions,
    get_seq_lens,
)
from .kv_quant import dequantize_kv, quantize_kv  # noqa: E402
from .prefill import (  # noqa: E402
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
)
from .rope import (  # noqa: E402
    apply_llama31_rope,
    apply_llama31_rope_inplace,
    apply_llama31_rope_pos_ids,
    apply_llama31_rope_pos_ids_inplace,
    apply_rope,
    apply_rope_inplace,
    apply_rope_pos_ids,
    apply_rope_pos_ids_inplace,
    apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
)
from .sparse import BlockSparseAttentionWrapper, head_pages, token_pages  # noqa: E402
from .variable_sparse import VariableBlockSparseAttentionWrapper  # noqa: E402
from .variants import Variant  # noqa: E402

__version__ = "0.1.0"

# torch custom ops (flashkv._torch_ops): registered now when torch is already loaded, else at the
# first call that sees a torch tensor. flashkv never imports torch itself.
if "torch" in __import__("sys").modules:
    from . import _arrays as _A  # noqa: E402

    _A._TORCH_OPS[:] = [_A.load_torch_ops()]


def cuda_available() -> bool:
    """True when the CUDA driver loaded and reports a device (flashkv itself needs no torch)."""
    return _C.cuda_available()


def nvrtc_library() -> str:
    """The NVRTC file flashkv compiles its kernels with, loading it if needed: the
    nvidia-cuda-nvrtc wheel's when installed, else the loader's or the CUDA toolkit's. Raises
    RuntimeError naming every place it looked when there is none."""
    return _C.nvrtc_library()


__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "BlockSparseAttentionWrapper",
    "MultiLevelCascadeAttentionWrapper",
    "MultiLevelCascadeWrapper",
    "Variant",
    "append_paged_kv_cache",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "check_device_errors",
    "cuda_available",
    "dequantize_kv",
    "get_batch_indices_positions",
    "get_seq_lens",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "nvrtc_library",
    "quantize_kv",
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache",
    "token_pages",
    "head_pages",
    "VariableBlockSparseAttentionWrapper",
]
