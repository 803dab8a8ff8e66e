"""Block-sparse attention, FlashInfer's ``flashinfer.sparse`` API (C++ ``flashkv::BlockSparseAttention``,
include/flashkv/block_sparse.h).

:class:`BlockSparseAttentionWrapper` takes a block-sparse row (BSR) mask: an ``M x N`` attention
matrix in ``R x C`` blocks (any R, C >= 1), block row i attending to block columns
``indices[indptr[i]:indptr[i + 1]]`` (each at most once per row, any order), optionally with an
element mask inside the stored blocks (``mask`` bool ``[nnz, R, C]`` or ``packed_mask``, its
``numpy.packbits(..., bitorder="little")``). ``causal`` is by position, aligned to the end of the
keys as every flashkv op: key n is visible to query row m iff ``n <= m + N - M`` (FlashInfer's
wrapper applies its causal mask inside each block row's gathered keys instead). A row that sees no
key gets zeros and lse -inf. ``logits_soft_cap`` and (flashkv extension) ``sinks`` float32
``[num_qo_heads]`` as in the prefill wrappers; fp8 k / v (q float16 or bfloat16) with run()'s
``k_scale`` / ``v_scale``. ``pos_encoding_mode`` "ALIBI" (FlashInfer's slopes) and "ROPE_LLAMA"
(``rope_scale``, ``rope_theta``) act at the tokens' own positions (query row m at m + N - M, key
n at n), not at a key's index among the gathered blocks.

:func:`token_pages` views a paged cache as pages of one token, for sparse-KV decode over
selected tokens (Quest-style selection) with the ordinary decode wrapper; :func:`head_pages` as
one KV head, for selections per request and KV head.

A host workspace runs the CPU reference (dense masked attention built from the layout). The GPU
path (a CUDA workspace) composes batch prefill over k, v viewed as pages of C tokens.
"""

import numpy as np

from . import _C
from . import _arrays as A
from . import _common as CM  # (C is FlashInfer's name for the block columns)
from . import _workspace
from ._sparse_positions import positional
from ._workspace import OpSlot


def _host_array(x) -> np.ndarray:
    """A host NumPy copy (or view) of an array from any framework."""
    fw = A.framework(x)
    if fw == "torch":
        return x.detach().to("cpu").numpy()
    if fw == "cupy":
        return x.get()
    return np.asarray(x)


def _host_mask(mask, packed_mask, nnz, R, C_):
    """The element mask as a contiguous host uint8 [nnz, R, C] array, or None."""
    if mask is not None and packed_mask is not None:
        raise ValueError("mask / packed_mask: give one of them")
    n = int(nnz) * int(R) * int(C_)
    if packed_mask is not None:
        p = np.ascontiguousarray(_host_array(packed_mask), dtype=np.uint8).reshape(-1)
        if p.size * 8 < n:
            raise ValueError(f"packed_mask: {p.size} bytes hold fewer than the nnz * R * C = {n} "
                             f"bits of the stored blocks")
        return np.unpackbits(p, bitorder="little")[:n].reshape(int(nnz), int(R), int(C_))
    if mask is None:
        return None
    m = np.asarray(_host_array(mask))
    if m.size != n:
        raise ValueError(f"mask: expected [nnz, R, C] = {n} elements, got shape {m.shape}")
    return np.ascontiguousarray(m.reshape(int(nnz), int(R), int(C_)), dtype=np.uint8)


def token_pages(k_cache, kv_layout="NHD"):
    """A paged cache ``[pages, page_size, num_kv_heads, head_dim]`` (NHD) as pages of one token,
    ``[pages * page_size, 1, num_kv_heads, head_dim]``, the same memory (a view: appends to the
    cache show in it). Token s of page p is page ``p * page_size + s`` of the view: a selection of
    single tokens (sparse-KV decode, C++ flashkv::token_pages) is then an ordinary page table for
    the decode and prefill wrappers with page_size 1. A selection of whole pages needs no view:
    plan with the selected page ids (a CUDA graph replays with new ids written into the same
    indices array). NHD only (an HND cache's tokens are not evenly strided across pages)."""
    if kv_layout != "NHD":
        raise ValueError(f"kv_layout: token_pages takes an NHD cache, got {kv_layout!r} (an HND "
                         f"cache's tokens are not evenly strided across pages)")
    if len(k_cache.shape) != 4:
        raise ValueError(f"k_cache: expected [pages, page_size, num_kv_heads, head_dim], got "
                         f"shape {tuple(k_cache.shape)}")
    p, s, h, d = (int(x) for x in k_cache.shape)
    if A.framework(k_cache) == "torch":
        return k_cache.view(p * s, 1, h, d)  # raises where no view exists
    view = np.asarray(k_cache).view()
    view.shape = (p * s, 1, h, d)  # raises where no view exists
    return view


def head_pages(k_cache, kv_layout="NHD"):
    """The cache as one KV head, for selections per request AND KV head (Quest selects per KV
    head; C++ flashkv::head_pages): (request r, KV head h) becomes request ``r * H + h`` of a
    decode wrapper planned with ``num_qo_heads / H`` query heads and 1 KV head, and q / out
    ``[B, num_qo_heads, D]`` are the same memory as ``[B * H, num_qo_heads / H, D]``
    (``q.view(B * H, -1, D)``). A view, no copy:

    - NHD ``[P, S, H, D]`` -> ``[P * S * H, 1, 1, D]``: page ``(p * S + s) * H + h`` is token s of
      page p in head h (select tokens, or a page as its S tokens; plan with page_size 1).
    - HND ``[P, H, S, D]`` -> ``[P * H, 1, S, D]`` (HND): page ``p * H + h`` is page p of head h
      (select pages; plan with page_size S).
    """
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")
    if len(k_cache.shape) != 4:
        raise ValueError(f"k_cache: expected a paged cache of 4 dimensions, got shape "
                         f"{tuple(k_cache.shape)}")
    p, a, b, d = (int(x) for x in k_cache.shape)
    shape = (p * a * b, 1, 1, d) if kv_layout == "NHD" else (p * a, 1, b, d)
    if A.framework(k_cache) == "torch":
        return k_cache.view(shape)  # raises where no view exists
    view = np.asarray(k_cache).view()
    view.shape = shape  # raises where no view exists
    return view


class BlockSparseAttentionWrapper:
    """FlashInfer's ``BlockSparseAttentionWrapper``: plan() the mask, run() attention under it.

    ``float_workspace_buffer``: a CUDA buffer (ValueError naming the needed size if too small) or
    a host one (the CPU reference). ``backend`` "auto" only (flashkv picks the kernel)."""

    def __init__(self, float_workspace_buffer, backend="auto"):
        if backend != "auto":
            raise NotImplementedError(f"backend={backend!r}: flashkv picks its kernel ('auto')")
        _workspace.check_alignment(float_workspace_buffer, "float_workspace_buffer")
        self._float_workspace_buffer = float_workspace_buffer
        self._on_gpu = A.is_cuda(float_workspace_buffer)
        self._device = A.device_index(float_workspace_buffer)
        self._slot = (OpSlot(_C.BlockSparseAttention, float_workspace_buffer, self._device,
                             frozen=False) if self._on_gpu else None)
        self._plan = None

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        """Use another workspace buffer (same side, host or CUDA). Call plan() again."""
        _workspace.reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer)

    def plan(self, indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, mask=None,
             packed_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, logits_soft_cap=None, sm_scale=None, rope_scale=None,
             rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type=None,
             non_blocking=True, *, sinks=None):
        """Plan the mask: indptr int32 ``[M / R + 1]``, indices int32 ``[nnz]`` (host or device:
        host copies are taken), the sizes and heads. Bad layouts raise ValueError naming the
        argument (M not a multiple of R, indptr not monotone, a block column out of range or
        repeated in a row). ``use_fp16_qk_reduction`` is accepted and ignored (flashkv reduces in
        float32); ``non_blocking`` too."""
        del use_fp16_qk_reduction, non_blocking
        pos = positional(pos_encoding_mode, num_qo_heads, rope_scale, rope_theta, self._on_gpu,
                          self._float_workspace_buffer)
        q_dt, kv_dt, o_dt = CM.plan_dtypes(q_data_type, kv_data_type, o_data_type)
        if (kv_dt != q_dt and kv_dt not in A.FP8_DTYPES) or o_dt != q_dt:
            raise ValueError(f"kv_data_type / o_data_type: expected the q dtype {q_dt} (k, v may "
                             f"be fp8), got {kv_dt} / {o_dt}")
        M, N, R, C_ = int(M), int(N), int(R), int(C)
        if R < 1 or C_ < 1:
            raise ValueError(f"R, C: expected >= 1, got {R}, {C_}")
        indptr_h = A.host_i32(indptr, "indptr")
        indices_h = A.host_i32(indices, "indices")
        nnz = int(indptr_h[-1]) if indptr_h.size else 0
        mask_h = _host_mask(mask, packed_mask, nnz, R, C_)
        if sinks is not None:
            CM.check_same_side(self._on_gpu, self._device, sinks, "sinks")
        # The C++ layout checks, on both paths; and the mask bytes the GPU plan uploads.
        mask_bytes = _C.block_sparse_mask_bytes(indptr_h, indices_h, M, N, R, C_, mask_h,
                                                bool(causal))
        plan = dict(q_dtype=q_dt, kv_dtype=kv_dt, o_dtype=o_dt, num_qo_heads=int(num_qo_heads),
                    num_kv_heads=int(num_kv_heads), head_dim=int(head_dim), M=M, N=N, R=R, C=C_,
                    indptr=indptr_h, indices=indices_h, mask=mask_h, causal=bool(causal),
                    sm_scale=CM.sm_scale_arg(sm_scale),
                    logits_soft_cap=float(logits_soft_cap or 0.0), sinks=sinks, pos=pos)
        self._plan = None  # a plan() that raises leaves the wrapper unplanned
        what = f"M {M}, N {N}, R {R}, C {C_}, {nnz} blocks, num_qo_heads {num_qo_heads}"
        if not self._on_gpu:
            CM.check_host_workspace(self._float_workspace_buffer,
                                   CM.host_workspace_need_bytes(_C.BlockSparseAttention, {}), what)
            self._plan = plan
            return
        need = dict(max_rows=max(M, 1), max_block_rows=max(M // R, 1), max_blocks=max(nnz, 1),
                    max_mask_bytes=int(mask_bytes), num_qo_heads=plan["num_qo_heads"],
                    head_dim=plan["head_dim"])
        op = self._slot.acquire(need, what)
        A.call(op.plan, indptr_h, indices_h, M, N, R, C_, mask_h, plan["num_qo_heads"],
               plan["num_kv_heads"], plan["head_dim"], q_dt, kv_dt, plan["causal"],
               plan["sm_scale"], plan["logits_soft_cap"], sinks, *pos,
               A.cuda_stream(self._float_workspace_buffer))
        self._plan = plan

    def run(self, q, k, v, out=None, lse=None, return_lse=False, enable_pdl=None, *,
            k_scale=None, v_scale=None):
        """q ``[M, num_qo_heads, head_dim]``, k, v ``[N, num_kv_heads, head_dim]``. Returns out,
        or (out, lse) with ``return_lse`` (lse float32 ``[M, num_qo_heads]``, base 2)."""
        del enable_pdl
        plan = self._plan
        CM.require_plan(plan)
        CM.check_same_side(self._on_gpu, self._device, q, "q")
        scale = CM.kv_scales(k_scale, v_scale, k, plan["num_kv_heads"])
        out, lse = CM.outputs(q, q.shape[:2], plan["head_dim"], plan["o_dtype"], out, lse,
                             return_lse)
        if self._on_gpu:
            A.call(self._slot.op.run, q, k, v, out, lse, A.cuda_stream(q), **scale.kwargs())
        else:
            A.call(_C.reference_block_sparse_attention, q, k, v, plan["indptr"],
                   plan["indices"], plan["M"], plan["N"], plan["R"], plan["C"], plan["mask"],
                   out, lse, plan["causal"], plan["sm_scale"], plan["logits_soft_cap"],
                   plan["sinks"], *plan["pos"], **scale.kwargs())
        return CM.finish(out, lse, return_lse)

    begin_forward = plan
    forward = run

# FlashInfer has both wrappers in flashinfer.sparse.
from .variable_sparse import VariableBlockSparseAttentionWrapper  # noqa: E402,F401
