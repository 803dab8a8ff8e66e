"""Rotary position embedding on ragged queries and keys, FlashInfer's ``flashinfer.rope`` API.

q ``[nnz, num_qo_heads, head_dim]`` and k ``[nnz, num_kv_heads, head_dim]`` (any row and head
strides, last dimension contiguous; float16, bfloat16 or float32, one dtype for both). Positions
come from ``indptr`` + ``offsets`` (token j of request i, rows ``indptr[i]:indptr[i+1]``, has
position ``offsets[i] + j``) or from ``pos_ids`` ``[nnz]`` (int32; other integer dtypes are
converted). Only the first ``rotary_dim`` dimensions rotate (None: all of head_dim; even), the
rest are copied. ``interleave=False`` pairs dimension i with ``i + rotary_dim/2`` (NeoX),
``True`` pairs ``2i`` with ``2i+1`` (GPT-J). Pair i turns by ``position * freq[i]``,
``freq[i] = rope_theta ** (-2i / rotary_dim) / rope_scale`` (Llama), or with Llama 3.1's
wavelength-dependent scaling (``apply_llama31_*``: bands with wavelength below
``old_context_len / high_freq_factor`` keep their frequency, above
``old_context_len / low_freq_factor`` are divided by ``rope_scale``, smooth in between).

The out-of-place forms return new ``(q_rope, k_rope)`` in q's framework; the ``*_inplace`` forms
write into q and k and return None. Host arrays run the CPU reference (double precision, one
rounding); CUDA arrays run one kernel on the caller's current stream (float32 rotation, the
angle reduced in double), CUDA-graph safe. Bad arguments raise ValueError with the C++ message;
a negative position (or one past the cos/sin cache) raises on the host, and on the GPU leaves
that token unrotated (unwritten out of place) and is raised by
:func:`flashkv.check_device_errors`.
"""

from . import _C
from . import _arrays as A
from ._eager import _rope_pos_ids


def _rotary_dim(rotary_dim) -> int:
    return 0 if rotary_dim is None else int(rotary_dim)  # 0: the whole head_dim


def _llama31_args(low_freq_factor, high_freq_factor, old_context_len):
    return float(low_freq_factor), float(high_freq_factor), float(old_context_len)


def apply_rope(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1,
               rope_theta=1e4, *, stream=None):
    """Llama RoPE with positions ``offsets[i] + j`` (FlashInfer's ``flashinfer.apply_rope``).
    indptr ``[batch + 1]`` (0 ... nnz), offsets ``[batch]``. Returns (q_rope, k_rope)."""
    q_rope, k_rope = A.empty(q, q.shape), A.empty(k, k.shape)
    A.call(_C.apply_rope, q, k, q_rope, k_rope, A.index_i32(indptr, "indptr"),
           A.index_i32(offsets, "offsets"), _rotary_dim(rotary_dim), bool(interleave),
           float(rope_scale), float(rope_theta), A.cuda_stream(q, stream))
    return q_rope, k_rope


def apply_rope_inplace(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1,
                       rope_theta=1e4, *, stream=None):
    """:func:`apply_rope` written into q and k (FlashInfer's ``apply_rope_inplace``)."""
    A.call(_C.apply_rope, q, k, q, k, A.index_i32(indptr, "indptr"),
           A.index_i32(offsets, "offsets"), _rotary_dim(rotary_dim), bool(interleave),
           float(rope_scale), float(rope_theta), A.cuda_stream(q, stream))


def apply_rope_pos_ids(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1,
                       rope_theta=1e4, *, stream=None):
    """Llama RoPE with per-token positions pos_ids ``[nnz]`` (FlashInfer's
    ``flashinfer.apply_rope_pos_ids``). Returns (q_rope, k_rope)."""
    return _pos_ids("llama", False, q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
                    1.0, 4.0, 8192.0, stream)


def apply_rope_pos_ids_inplace(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1,
                               rope_theta=1e4, *, stream=None):
    """:func:`apply_rope_pos_ids` written into q and k (FlashInfer's
    ``apply_rope_pos_ids_inplace``)."""
    _pos_ids("llama", True, q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, 1.0,
             4.0, 8192.0, stream)


def _pos_ids(kind, inplace, q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
             low_freq_factor, high_freq_factor, old_context_len, stream):
    """The four pos_ids forms. kind: "llama" or "llama31" (the last three arguments are read for
    "llama31" only). On torch CUDA tensors (without ``stream``): the torch custom ops
    ``flashkv::rope_pos_ids`` / ``flashkv::rope_pos_ids_``."""
    args = (kind, _rotary_dim(rotary_dim), bool(interleave), float(rope_scale), float(rope_theta),
            *_llama31_args(low_freq_factor, high_freq_factor, old_context_len))
    ops = A.torch_ops(q) if stream is None else None
    if ops is not None:
        result = ops.rope_pos_ids(inplace, q, k, pos_ids, *args)
        if result is not NotImplemented:
            return result
    q_rope, k_rope = (q, k) if inplace else (A.empty(q, q.shape), A.empty(k, k.shape))
    _rope_pos_ids(q, k, q_rope, k_rope, pos_ids, *args, stream)
    return None if inplace else (q_rope, k_rope)


def apply_llama31_rope(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=8,
                       rope_theta=5e5, low_freq_factor=1, high_freq_factor=4,
                       old_context_len=8192, *, stream=None):
    """Llama 3.1 RoPE with positions ``offsets[i] + j`` (FlashInfer's
    ``flashinfer.apply_llama31_rope``; the defaults are the Llama 3.1 model's). Returns
    (q_rope, k_rope)."""
    q_rope, k_rope = A.empty(q, q.shape), A.empty(k, k.shape)
    A.call(_C.apply_llama31_rope, q, k, q_rope, k_rope, A.index_i32(indptr, "indptr"),
           A.index_i32(offsets, "offsets"), _rotary_dim(rotary_dim), bool(interleave),
           float(rope_scale), float(rope_theta),
           *_llama31_args(low_freq_factor, high_freq_factor, old_context_len),
           A.cuda_stream(q, stream))
    return q_rope, k_rope


def apply_llama31_rope_inplace(q, k, indptr, offsets, rotary_dim=None, interleave=False,
                               rope_scale=8, rope_theta=5e5, low_freq_factor=1,
                               high_freq_factor=4, old_context_len=8192, *, stream=None):
    """:func:`apply_llama31_rope` written into q and k (FlashInfer's
    ``apply_llama31_rope_inplace``)."""
    A.call(_C.apply_llama31_rope, q, k, q, k, A.index_i32(indptr, "indptr"),
           A.index_i32(offsets, "offsets"), _rotary_dim(rotary_dim), bool(interleave),
           float(rope_scale), float(rope_theta),
           *_llama31_args(low_freq_factor, high_freq_factor, old_context_len),
           A.cuda_stream(q, stream))


def apply_llama31_rope_pos_ids(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=8,
                               rope_theta=5e5, low_freq_factor=1, high_freq_factor=4,
                               old_context_len=8192, *, stream=None):
    """Llama 3.1 RoPE with per-token positions pos_ids ``[nnz]`` (FlashInfer's
    ``flashinfer.apply_llama31_rope_pos_ids``). Returns (q_rope, k_rope)."""
    return _pos_ids("llama31", False, q, k, pos_ids, rotary_dim, interleave, rope_scale,
                    rope_theta, low_freq_factor, high_freq_factor, old_context_len, stream)


def apply_llama31_rope_pos_ids_inplace(q, k, pos_ids, rotary_dim=None, interleave=False,
                                       rope_scale=8, rope_theta=5e5, low_freq_factor=1,
                                       high_freq_factor=4, old_context_len=8192, *, stream=None):
    """:func:`apply_llama31_rope_pos_ids` written into q and k (FlashInfer's
    ``apply_llama31_rope_pos_ids_inplace``)."""
    _pos_ids("llama31", True, q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
             low_freq_factor, high_freq_factor, old_context_len, stream)


def _heads(x, head_size: int, name: str):
    """x ``[nnz, num_heads * head_size]`` (vLLM's layout) as a view ``[nnz, num_heads,
    head_size]``; a 3-D x is taken as it is. ValueError when no view exists (in place, a copy
    would not write into x)."""
    shape = tuple(x.shape)
    if len(shape) == 3:
        if shape[2] != head_size:
            raise ValueError(f"{name}: expected head_size {head_size} as the last dimension, got "
                             f"shape {shape}")
        return x
    if len(shape) != 2 or head_size <= 0 or shape[1] % head_size:
        raise ValueError(f"{name}: expected shape [nnz, num_heads * {head_size}] (head_size "
                         f"{head_size}) or [nnz, num_heads, {head_size}], got {shape}")
    heads = (shape[0], shape[1] // head_size, head_size)
    fw = A.framework(x)
    if fw == "torch":
        try:
            return x.view(heads)
        except RuntimeError as e:
            raise ValueError(f"{name}: cannot view shape {shape} as {heads}: {e}") from None
    view = x.reshape(heads)
    if fw == "numpy":
        import numpy as np

        if not np.may_share_memory(view, x):
            raise ValueError(f"{name}: cannot view shape {shape} as {heads} without a copy")
    return view


def _cos_sin(positions, query, key, head_size, cos_sin_cache, is_neox, query_out, key_out,
             stream):
    head_size = int(head_size)
    A.call(_C.apply_rope_with_cos_sin_cache, _heads(query, head_size, "query"),
           _heads(key, head_size, "key"), _heads(query_out, head_size, "query"),
           _heads(key_out, head_size, "key"), A.index_i32(positions, "positions"), cos_sin_cache,
           bool(is_neox), A.cuda_stream(query, stream))


def apply_rope_with_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox=True,
                                  *, stream=None):
    """RoPE from a precomputed cos/sin cache, the vLLM / SGLang convention (FlashInfer's
    ``flashinfer.apply_rope_with_cos_sin_cache``).

    positions ``[nnz]``; query ``[nnz, num_q_heads * head_size]`` and key ``[nnz, num_k_heads *
    head_size]`` (3-D ``[nnz, heads, head_size]`` arrays are accepted too); cos_sin_cache
    float32 ``[max_position, rotary_dim]``, row p holding ``cos(p * freq)`` in its first half and
    ``sin(p * freq)`` in its second (rotary_dim is its width). ``is_neox`` True pairs dimension
    i with ``i + rotary_dim/2``, False pairs ``2i`` with ``2i+1``. Returns (query_out, key_out)
    with query's and key's shapes.
    """
    query_out, key_out = A.empty(query, query.shape), A.empty(key, key.shape)
    _cos_sin(positions, query, key, head_size, cos_sin_cache, is_neox, query_out, key_out, stream)
    return query_out, key_out


def apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache,
                                          is_neox=True, *, stream=None):
    """:func:`apply_rope_with_cos_sin_cache` written into query and key (FlashInfer's
    ``apply_rope_with_cos_sin_cache_inplace``)."""
    _cos_sin(positions, query, key, head_size, cos_sin_cache, is_neox, query, key, stream)
