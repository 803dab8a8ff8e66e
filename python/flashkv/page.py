"""Writing new tokens into a paged KV cache, FlashInfer's ``flashinfer.page`` API
(``append_paged_kv_cache``, ``get_batch_indices_positions``, ``get_seq_lens``), and
``check_device_errors`` for the errors the GPU kernels find in device-resident indices.

The page table passed here describes the cache AFTER the append, as in FlashInfer: the caller has
allocated the pages and counted the new tokens in ``kv_last_page_len``. Host arrays (NumPy, CPU
tensors; page table included) run flashkv's CPU reference, which checks every index before
writing anything. CUDA arrays run flashkv's kernels on the caller's current stream (no
synchronization, CUDA-graph safe); the values of device-resident indices are checked by the
kernel: a bad token is skipped (never written out of bounds) and reported by the next
:func:`check_device_errors`.
"""

import sys

from . import _C
from . import _arrays as A
from . import _common as C
from ._eager import _append_paged_kv_cache


def get_batch_indices_positions(append_indptr, seq_lens, nnz, batch_indices=None, positions=None,
                                *, stream=None):
    """The batch index and position of every appended token (FlashInfer's
    ``flashinfer.get_batch_indices_positions``).

    append_indptr ``[batch + 1]`` splits the ``nnz`` new tokens by request; seq_lens ``[batch]``
    are the requests' KV lengths after the append. Token j of request i (row
    ``append_indptr[i] + j``) gets ``batch_indices = i`` and
    ``positions = seq_lens[i] - (append_indptr[i+1] - append_indptr[i]) + j``. Returns
    (batch_indices, positions), int32 ``[nnz]``, in append_indptr's framework and on its device.
    On the host, ``nnz`` must equal ``append_indptr[-1]`` (ValueError otherwise); on the GPU a
    malformed append_indptr or a seq_len shorter than its append is reported by
    :func:`check_device_errors` (those rows are left unwritten). ``batch_indices`` /
    ``positions`` (FlashInfer 0.6): int32 ``[nnz]`` arrays to write into (beside
    append_indptr), else allocated.
    """
    nnz = int(nnz)
    if nnz < 0:
        raise ValueError(f"nnz: expected >= 0, got {nnz}")
    if batch_indices is None:
        batch_indices = A.empty(append_indptr, (nnz,), dtype="i32")
    if positions is None:
        positions = A.empty(append_indptr, (nnz,), dtype="i32")
    for name, x in (("batch_indices", batch_indices), ("positions", positions)):
        if tuple(x.shape) != (nnz,) or str(x.dtype).replace("torch.", "") != "int32":
            raise ValueError(f"{name}: expected an int32 array of shape [nnz = {nnz}], got "
                             f"{x.dtype} {tuple(x.shape)}")
    A.call(_C.get_batch_indices_positions, A.index_i32(append_indptr, "append_indptr"),
           A.index_i32(seq_lens, "seq_lens"), batch_indices, positions,
           A.cuda_stream(append_indptr, stream))
    return batch_indices, positions


def get_seq_lens(kv_indptr, kv_last_page_len, page_size):
    """KV lengths ``[batch]`` from a page table (FlashInfer's ``flashinfer.get_seq_lens``):
    ``max(pages - 1, 0) * page_size + kv_last_page_len``, computed in the arrays' framework."""
    pages_before_last = kv_indptr[1:] - kv_indptr[:-1] - 1
    if A.framework(kv_indptr) == "torch":
        import torch

        return torch.clamp(pages_before_last, min=0) * page_size + kv_last_page_len
    return pages_before_last.clip(0, None) * page_size + kv_last_page_len


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                          kv_indices, kv_indptr, kv_last_page_len, kv_layout="NHD", *,
                          stream=None, k_scale=None, v_scale=None):
    """Writes new tokens' keys and values into their pages (FlashInfer's
    ``flashinfer.append_paged_kv_cache``).

    append_key / append_value ``[nnz, num_kv_heads, head_dim]`` (the cache's dtype; any row and
    head strides, last dimension contiguous; into an fp8 cache also float16 / bfloat16 /
    float32 rows, quantized on the way in, below); batch_indices / positions ``[nnz]`` (from
    :func:`get_batch_indices_positions`): token t goes to slot ``positions[t] % page_size`` of
    page ``kv_indices[kv_indptr[b] + positions[t] // page_size]``, ``b = batch_indices[t]``.
    paged_kv_cache: a ``(k_cache, v_cache)`` tuple of ``[num_pages, page_size, num_kv_heads,
    head_dim]`` (NHD) or ``[num_pages, num_kv_heads, page_size, head_dim]`` (HND) arrays, or one
    ``[num_pages, 2, ...]`` array; written in place. kv_indices, kv_indptr ``[batch + 1]``,
    kv_last_page_len ``[batch]``: the page table after the append, on the cache's side (host or
    the cache's GPU). Index arrays of another integer dtype are converted to int32 (a copy).

    fp8 caches (``torch.float8_e4m3fn`` / ``torch.float8_e5m2``; on the host also NumPy arrays of
    ml_dtypes' float8 types): rows of the cache's dtype are copied as they are; float16 /
    bfloat16 / float32 rows are quantized, each element to ``float(x) / scale`` (a float32
    division) rounded to nearest even and saturated to the format's largest finite value (NaN
    stays NaN). ``k_scale`` / ``v_scale`` (keyword-only, flashkv extension; FlashInfer's names of
    the dequantization scales the attention wrappers' run() takes): None (1), a float > 0, or a
    float32 tensor of 1 or num_kv_heads elements on the cache's device (per KV head; read when
    the kernel runs, so a CUDA graph appends with its current value). Pass the scales attention
    will read the cache with. A 16-bit cache takes only None or 1.0 (ValueError otherwise).

    A token whose position is outside its request's KV length (or whose batch index is out of
    range) is an error: on the host a ValueError naming it, raised before anything is written
    (two tokens writing one slot are an error too); on the GPU that token is skipped and the next
    :func:`check_device_errors` raises. Returns None. On torch CUDA tensors (without ``stream``)
    this is the torch custom op ``flashkv::append_paged_kv_cache`` (mutating the cache; pass an
    interleaved cache as the one array, not as two views of it, under torch.compile).
    """
    C.check_layout(kv_layout)
    scale = C.NO_SCALE
    if k_scale is not None or v_scale is not None:
        k_cache = C.unpack_paged_kv_cache(paged_kv_cache)[0]
        scale = C.kv_scales(k_scale, v_scale, k_cache, C.kv_heads(k_cache, kv_layout))
    ops = A.torch_ops(append_key) if stream is None else None
    if ops is not None and ops.append_paged_kv_cache(
            append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices,
            kv_indptr, kv_last_page_len, kv_layout, scale) is not NotImplemented:
        return
    _append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                           kv_indices, kv_indptr, kv_last_page_len, kv_layout, stream, scale)


def check_device_errors(device=0, stream=None):
    """Raises the first error a flashkv kernel recorded on ``device`` since the last check
    (ValueError with the message, e.g. "append_paged_kv_cache: positions[17] = 4096 is outside
    request 3's KV length 4095 (batch_indices[17] = 3); that token was not written"), and clears
    it. flashkv extension (FlashInfer has no counterpart).

    The ops that record errors from device-resident input are :func:`append_paged_kv_cache`,
    :func:`get_batch_indices_positions`, the RoPE functions and
    ``BatchDecodeWithPagedKVCacheWrapper.run_step`` on CUDA arrays. This synchronizes ``stream``
    (default: torch's current stream on ``device`` when torch is loaded, else the legacy default
    stream), so call it where a synchronization is acceptable (tests, debugging, after a step),
    never during CUDA-graph capture. With ``FLASHKV_CHECK_DEVICE_ERRORS=1`` in the environment
    every such op checks right after its launch. ``device``: an int or a ``torch.device``. A
    no-op where no such op ran on the device (e.g. on machines without a GPU).
    """
    index = getattr(device, "index", device)
    index = 0 if index is None else int(index)
    if stream is not None:
        handle = A.cuda_stream(None, stream)
    else:
        handle = 0
        torch = sys.modules.get("torch")
        if torch is not None and _C.cuda_available() and torch.cuda.is_available():
            handle = torch.cuda.current_stream(index).cuda_stream
    _C.check_device_errors(index, handle)
