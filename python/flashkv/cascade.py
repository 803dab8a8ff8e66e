"""FlashInfer's ``flashinfer.cascade``: ⊕, the merge of attention states (merge_state,
merge_state_in_place, merge_states), and cascade attention over shared prefixes
(:class:`MultiLevelCascadeAttentionWrapper`, FlashInfer's, with explicit per-level page tables;
:class:`MultiLevelCascadeWrapper`, flashkv's, which finds the shared prefixes itself).

A state is (v, s): v the attention output over some keys ``[seq_len, num_heads, head_dim]``, s its
log-sum-exp ``float32 [seq_len, num_heads]``. Merging the states of two disjoint key sets gives
the state of their union, so attention split over KV chunks (or a shared prefix and per-request
suffixes) merges back into the full result. s is **base 2** here, as FlashInfer's (the LSE that
flashkv's wrappers return); flashkv's C++ API uses natural logs, and these functions convert
(which rounds s by about one float32 ulp). A state with s = -inf (no keys) is the identity.
Host arrays run on the CPU reference, CUDA arrays on the GPU on the caller's current stream.
"""

from . import _C
from . import _arrays as A
from . import _common as C
from . import _workspace
from ._eager import _merge_state, _merge_state_in_place, _merge_states
from ._workspace import OpSlot
from .prefill import BatchPrefillWithPagedKVCacheWrapper


def merge_state(v_a, s_a, v_b, s_b, *, stream=None):
    """(v, s) = (v_a, s_a) ⊕ (v_b, s_b). Returns new (V, S). On torch CUDA tensors (without
    ``stream``) this is the torch custom op ``flashkv::merge_state``.

    Parameters
    ----------
    v_a, v_b : array
        ``[seq_len, num_heads, head_dim]``, float16, bfloat16 or float32: the two attention
        outputs.
    s_a, s_b : array
        ``float32 [seq_len, num_heads]``: their log-sum-exps, base 2.
    stream : int, optional
        A CUDA stream handle (flashkv extension; default: the framework's current stream).
    """
    ops = A.torch_ops(v_a) if stream is None else None
    if ops is not None:
        return ops.merge_state(v_a, s_a, v_b, s_b)
    return _merge_state(v_a, s_a, v_b, s_b, stream)


def merge_state_in_place(v, s, v_other, s_other, mask=None, *, stream=None):
    """(v, s) = (v, s) ⊕ (v_other, s_other), written into v and s. On torch CUDA tensors
    (without ``stream``) this is the torch custom op ``flashkv::merge_state_in_place``.

    Parameters
    ----------
    v, v_other : array
        ``[seq_len, num_heads, head_dim]``, float16, bfloat16 or float32; v is written.
    s, s_other : array
        ``float32 [seq_len, num_heads]``, base 2; s is written.
    mask : array, optional
        bool ``[seq_len]``: merge only the rows where it is True (the others keep v and s):
        the merge of every row into a temporary, then a masked copy (not the fused op).
    stream : int, optional
        A CUDA stream handle (flashkv extension; default: the framework's current stream).
    """
    if mask is not None:
        if tuple(mask.shape) != (int(v.shape[0]),):
            raise ValueError(f"mask: expected a bool array of shape [seq_len = {v.shape[0]}], "
                             f"got {tuple(mask.shape)}")
        merged_v, merged_s = merge_state(v, s, v_other, s_other, stream=stream)
        v[mask] = merged_v[mask]
        s[mask] = merged_s[mask]
        return
    ops = A.torch_ops(v) if stream is None else None
    if ops is not None:
        return ops.merge_state_in_place(v, s, v_other, s_other)
    _merge_state_in_place(v, s, v_other, s_other, stream)


def merge_states(v, s, *, stream=None):
    """⊕ over the states of each row. Returns (V ``[seq_len, num_heads, head_dim]``, S
    ``[seq_len, num_heads]``). On torch CUDA tensors (without ``stream``) this is the torch custom
    op ``flashkv::merge_states``.

    Parameters
    ----------
    v : array
        ``[seq_len, num_states, num_heads, head_dim]``, float16, bfloat16 or float32.
    s : array
        ``float32 [seq_len, num_states, num_heads]``, base 2.
    stream : int, optional
        A CUDA stream handle (flashkv extension; default: the framework's current stream).
    """
    ops = A.torch_ops(v) if stream is None else None
    if ops is not None:
        return ops.merge_states(v, s)
    return _merge_states(v, s, stream)


def _split_workspace(buf, parts: int):
    """`parts` disjoint, 256-byte aligned slices of a CUDA workspace (each flashkv op keeps its
    plan in its workspace, so the levels cannot share one); a host buffer is shared as it is."""
    if parts == 1 or not A.is_cuda(buf):
        return [buf] * parts
    flat = buf.reshape(-1)
    n = int(flat.shape[0])
    nbytes = int(flat.nbytes) if hasattr(flat, "nbytes") else flat.numel() * flat.element_size()
    align = max(1, 256 // max(1, nbytes // max(n, 1)))
    step = (n // parts) // align * align
    return [flat[i * step:(i + 1) * step] for i in range(parts)]


class MultiLevelCascadeAttentionWrapper:
    """Multi-level cascade attention with explicit per-level page tables, FlashInfer's
    ``flashinfer.MultiLevelCascadeAttentionWrapper`` (same constructor, plan() and run()).

    Every level is a page table over the same paged cache: level l splits q's rows into groups by
    ``qo_indptr_arr[l]`` and group g attends the pages ``paged_kv_indices_arr[l][
    paged_kv_indptr_arr[l][g]:paged_kv_indptr_arr[l][g+1]]``; levels 0 .. L-2 are shared
    prefixes (attended without a mask), the last level is each request's own suffix (``causal``
    applies there, aligned to the end of the KV). As in FlashInfer, each level runs a
    :class:`flashkv.BatchPrefillWithPagedKVCacheWrapper` and the states merge with
    :func:`merge_state_in_place`; the CUDA workspace is split evenly between the levels (flashkv
    keeps each level's plan in it). The caller builds the levels.

    For flashkv's own cascade, which finds the shared prefixes in the ordinary page table of the
    batch and decides by a cost model whether to use them (a shared-prefix prefill pass, a
    decode pass over the suffixes and one fused merge), see :class:`MultiLevelCascadeWrapper`.

    ``use_cuda_graph``: the four ``*_buf_arr`` lists (one buffer per level, as the paged prefill
    wrapper's buffers) are required. Host workspaces run the CPU reference. flashkv extensions to
    run(): keyword-only ``out``, ``lse`` and ``return_lse`` (lse base 2); FlashInfer's run()
    returns out only, as this one does by default. FP8 caches: plan with an fp8
    ``kv_data_type`` (as the paged prefill wrapper) and give run() the cache's ``k_scale`` /
    ``v_scale`` (keyword-only, flashkv extension; every level reads the cache with them).
    """

    def __init__(self, num_levels, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf_arr=None, paged_kv_indptr_buf_arr=None,
                 paged_kv_indices_buf_arr=None, paged_kv_last_page_len_buf_arr=None):
        num_levels = int(num_levels)
        if num_levels < 1:
            raise ValueError(f"num_levels: expected >= 1, got {num_levels}")
        bufs = {"qo_indptr_buf": qo_indptr_buf_arr, "paged_kv_indptr_buf": paged_kv_indptr_buf_arr,
                "paged_kv_indices_buf": paged_kv_indices_buf_arr,
                "paged_kv_last_page_len_buf": paged_kv_last_page_len_buf_arr}
        if use_cuda_graph:
            for name, arr in bufs.items():
                if arr is None or len(arr) != num_levels:
                    raise ValueError(f"{name}_arr: expected a list of {num_levels} buffers (one "
                                     f"per level) in CUDA graph mode (use_cuda_graph=True)")
        per_level = [{name: (arr[l] if use_cuda_graph else None) for name, arr in bufs.items()}
                     for l in range(num_levels)]
        self._num_levels = num_levels
        self._kv_layout = kv_layout
        self._use_cuda_graph = bool(use_cuda_graph)
        self._batch_prefill_wrappers = [
            BatchPrefillWithPagedKVCacheWrapper(ws, kv_layout, use_cuda_graph=use_cuda_graph,
                                                **per_level[l])
            for l, ws in enumerate(_split_workspace(float_workspace_buffer, num_levels))]

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffers=None):
        """Use another workspace buffer (split between the levels; ``int_workspace_buffers`` is
        accepted for FlashInfer compatibility and unused). Call plan() again before run()."""
        for wrapper, ws in zip(self._batch_prefill_wrappers,
                               _split_workspace(float_workspace_buffer, self._num_levels)):
            wrapper.reset_workspace_buffer(ws)

    def plan(self, qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr,
             paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None,
             window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None):
        """Plan every level (FlashInfer's arguments): lists of ``num_levels`` qo_indptr,
        paged_kv_indptr, paged_kv_indices and paged_kv_last_page_len arrays, level 0 first.
        ``causal`` applies to the last level only. Unsupported variants raise
        NotImplementedError, as the prefill wrapper's plan(). Each level's plan() runs the
        paged prefill wrapper's checks (page ids included: host ids >= 0 at plan(), the largest
        below the cache's page count at run(), before anything is written)."""
        # Each level's prefill would place queries and keys by that level's KV alone: RoPE,
        # windows and ALiBi need the request's positions, so variants stay unsupported here.
        C.check_variant(pos_encoding_mode, window_left, logits_soft_cap)
        arrays = {"qo_indptr_arr": qo_indptr_arr, "paged_kv_indptr_arr": paged_kv_indptr_arr,
                  "paged_kv_indices_arr": paged_kv_indices_arr,
                  "paged_kv_last_page_len": paged_kv_last_page_len}
        for name, arr in arrays.items():
            if len(arr) != self._num_levels:
                raise ValueError(f"{name}: expected {self._num_levels} arrays (num_levels), got "
                                 f"{len(arr)}")
        for level, wrapper in enumerate(self._batch_prefill_wrappers):
            wrapper.plan(qo_indptr_arr[level], paged_kv_indptr_arr[level],
                         paged_kv_indices_arr[level], paged_kv_last_page_len[level],
                         num_qo_heads, num_kv_heads, head_dim, page_size,
                         causal=causal if level == self._num_levels - 1 else False,
                         pos_encoding_mode=pos_encoding_mode,
                         use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale,
                         window_left=window_left, logits_soft_cap=logits_soft_cap,
                         rope_scale=rope_scale, rope_theta=rope_theta, q_data_type=q_data_type,
                         kv_data_type=kv_data_type)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *, out=None, lse=None, return_lse=False, k_scale=None,
            v_scale=None):
        """Cascade attention: q ``[nnz_qo, num_qo_heads, head_dim]`` (the levels' row order),
        paged_kv_cache a ``(k_cache, v_cache)`` tuple or one ``[num_pages, 2, ...]`` array.
        Returns out, or (out, lse) with ``return_lse`` (base 2). ``k_scale`` / ``v_scale``: an
        fp8 cache's dequantization scales, as the paged prefill wrapper's run() takes them."""
        # Every level's page ids (and the scales) against the cache before the first level
        # writes out.
        k, _ = C.unpack_paged_kv_cache(paged_kv_cache)
        for level, wrapper in enumerate(self._batch_prefill_wrappers):
            C.require_plan(wrapper._plan)
            C.check_page_ids_fit(wrapper._plan, k, f"paged_kv_indices_arr[{level}]")
        C.kv_scales(k_scale, v_scale, k, self._batch_prefill_wrappers[0]._plan["num_kv_heads"])
        scales = dict(k_scale=k_scale, v_scale=v_scale)
        out, lse = self._batch_prefill_wrappers[-1].run(q, paged_kv_cache, out=out, lse=lse,
                                                        return_lse=True, **scales)
        for wrapper in self._batch_prefill_wrappers[:-1]:
            out_i, lse_i = wrapper.run(q, paged_kv_cache, return_lse=True, **scales)
            merge_state_in_place(out, lse, out_i, lse_i)
        return (out, lse) if return_lse else out

    forward = run


class MultiLevelCascadeWrapper:
    """flashkv's automatic multi-level cascade (C++ ``flashkv::MultiLevelCascade``): plan() takes
    the ordinary page table of the whole batch, as the decode and paged prefill wrappers do,
    finds the requests whose page lists start with the same whole pages (system prompts,
    parallel sampling, tree search), and, when its cost model says it is faster, reads each
    shared prefix once per group instead of once per request: the prefixes on the tensor-core
    prefill kernel (no mask), each request's suffix on the decode (or causal prefill) kernel, the
    levels merged by one kernel. Otherwise it runs plain attention. Either way the result is
    plain attention over each request's pages, up to one rounding per level (``plan_info()``
    says which path the plan took).

    How it differs from FlashInfer's :class:`MultiLevelCascadeAttentionWrapper` (also provided,
    with FlashInfer's API): no per-level arrays to build; the caller's q, out and lse stay in
    the batch's own row order; ``use_cascade="always"`` / ``"never"`` override the cost model.

    ``float_workspace_buffer``: a CUDA buffer (128 MB is plenty for typical models; ValueError
    naming the needed size if not) or a host one, which runs the CPU reference of plain paged
    attention (what the cascade computes). ``max_levels`` (1 to 4): shared-prefix levels + the
    suffix level. ``use_cuda_graph``: run() may be captured and replayed after later plans; the
    wrapper is sized by its first plan() (requests, query rows, pages, heads, head_dim), so plan
    the largest step first. The plan holds device copies of the page ids: run() reads only the
    cache tensors.
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 max_levels=3):
        self._kv_layout = C.check_layout(kv_layout)
        self._use_cuda_graph = bool(use_cuda_graph)
        self._max_levels = int(max_levels)
        if not 1 <= self._max_levels <= 4:
            raise ValueError(f"max_levels: expected 1..4, got {max_levels}")
        self._float_workspace_buffer = float_workspace_buffer
        self._on_gpu = A.is_cuda(float_workspace_buffer)
        self._device = A.device_index(float_workspace_buffer)
        self._slot = (OpSlot(_C.MultiLevelCascade, float_workspace_buffer, self._device,
                             frozen=self._use_cuda_graph) if self._on_gpu else None)
        self._plan = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        """Use another workspace buffer (same side, host or CUDA). Call plan() again."""
        _workspace.reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim, page_size, causal=False,
             pos_encoding_mode="NONE", sm_scale=None, window_left=-1, logits_soft_cap=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, *,
             use_cascade="auto", min_group_size=2):
        """Plan one step from the batch's page table (the paged prefill wrapper's arguments).

        qo_indptr ``[batch + 1]`` query rows per request, or None for decode (one row per
        request; the suffix level then runs the decode kernel); paged_kv_indptr ``[batch + 1]``,
        paged_kv_indices, paged_kv_last_page_len ``[batch]``: int32, host or device (host copies
        are taken: detection compares page ids). ``causal`` (rows of prefill / append requests)
        aligns to the end of each request's KV; a request's rows use a shared prefix only if
        they all see it whole. q and the output share one dtype (float16 or bfloat16 on the
        GPU); the cache is in it too, or in fp8 (``kv_data_type`` float8_e4m3fn / float8_e5m2:
        give run() the cache's ``k_scale`` / ``v_scale``).
        ``use_cascade``: "auto" (cost model), "always" (whenever a prefix is shared) or
        "never"; ``min_group_size``: requests that must share a prefix to form a group.
        RoPE, windows and soft-capping raise NotImplementedError. Not during graph capture.
        The same C++ checks run on the host and the GPU path (page table, heads, head_dim 64,
        128 or 256, dtype, a non-empty host workspace); every page id must be >= 0 here, and
        run() raises ValueError naming the entry (``paged_kv_indices[j] = id is out of range
        [0, num_pages)``) when the largest is not below the cache's page count, before
        anything is written.
        """
        C.check_variant(pos_encoding_mode, window_left, logits_soft_cap)
        if use_cascade not in ("auto", "always", "never"):
            raise ValueError(f"use_cascade: expected 'auto', 'always' or 'never', got "
                             f"{use_cascade!r}")
        q_dt, kv_dt, o_dt = C.plan_dtypes(q_data_type, kv_data_type, o_data_type)
        if (kv_dt != q_dt and kv_dt not in A.FP8_DTYPES) or o_dt != q_dt:
            raise ValueError(f"kv_data_type / o_data_type: expected the q dtype {q_dt} (the "
                             f"cache may be fp8), got {kv_dt} / {o_dt}")
        if kv_dt in A.FP8_DTYPES and q_dt not in ("f16", "bf16"):
            raise ValueError(f"kv_data_type: an fp8 cache ({kv_dt}) takes float16 or bfloat16 "
                             f"queries, got q_data_type {q_dt}")
        kv_h = A.host_i32(paged_kv_indptr, "paged_kv_indptr")
        batch = kv_h.shape[0] - 1
        qo_h = None if qo_indptr is None else A.host_i32(qo_indptr, "qo_indptr")
        rows = batch if qo_h is None else (int(qo_h[-1]) if qo_h.shape[0] > 0 else 0)
        plan = dict(q_dtype=q_dt, kv_dtype=kv_dt, o_dtype=o_dt, num_qo_heads=int(num_qo_heads),
                    num_kv_heads=int(num_kv_heads), head_dim=int(head_dim),
                    page_size=int(page_size), causal=bool(causal),
                    sm_scale=C.sm_scale_arg(sm_scale), batch=batch, rows=rows, qo_indptr=qo_h,
                    indptr=kv_h, indices=A.host_i32(paged_kv_indices, "paged_kv_indices"),
                    last_page_len=A.host_i32(paged_kv_last_page_len, "paged_kv_last_page_len"))
        self._plan = None  # a plan() that raises leaves the wrapper unplanned
        # One C++ check per path (flashkv/plan_checks.h, _common.py): the host path's here, the
        # GPU path's in the op's plan() below: the page table, its ids (>= 0; the largest is
        # compared with the cache at run()), the shape.
        shape = C.make(_C.CascadeShape, num_qo_heads=plan["num_qo_heads"],
                       num_kv_heads=plan["num_kv_heads"], head_dim=plan["head_dim"], dtype=q_dt,
                       kv_dtype=kv_dt)
        names = C.page_table_names()
        plan["page_id_max"] = None
        if not self._on_gpu:
            plan["page_id_max"] = A.call(
                _C.check_host_cascade_plan, qo_h, kv_h, plan["indices"], plan["last_page_len"],
                plan["page_size"], shape, names)
        pages = int(kv_h[-1]) if batch > 0 else 0
        need = dict(max_batch=max(batch, 1), max_qo_tokens=0 if qo_h is None else max(rows, 1),
                    max_pages=max(pages, 1), num_qo_heads=plan["num_qo_heads"],
                    head_dim=plan["head_dim"], max_levels=self._max_levels)
        what = (f"batch {batch}, {'decode' if qo_h is None else f'{rows} query rows'}, {pages} "
                f"pages, num_qo_heads {num_qo_heads}, head_dim {head_dim}")
        if not self._on_gpu:
            C.check_host_workspace(self._float_workspace_buffer,
                                   C.host_workspace_need_bytes(_C.MultiLevelCascade, need), what)
            self._plan = plan
            return
        cfg = self._slot.cfg
        if self._use_cuda_graph and cfg is not None and (cfg["max_qo_tokens"] == 0) != (
                qo_h is None):
            sized = "decode (qo_indptr None)" if cfg["max_qo_tokens"] == 0 else "prefill rows"
            raise ValueError(f"qo_indptr: in CUDA graph mode the wrapper keeps the mode of its "
                             f"first plan(), {sized}; create another wrapper for the other")
        op = self._slot.acquire(need, what,
                                exact_fields=("max_qo_tokens",) if qo_h is None else ())
        options = C.make(_C.CascadePlanOptions, causal=plan["causal"], sm_scale=plan["sm_scale"],
                         use=use_cascade, min_group_size=int(min_group_size),
                         enable_cuda_graph=self._use_cuda_graph)
        A.call(op.plan, qo_h, kv_h, plan["indices"], plan["last_page_len"], plan["page_size"],
               shape, options, names=names, stream=A.cuda_stream(self._float_workspace_buffer))
        self._plan = plan

    begin_forward = plan

    def run(self, q, paged_kv_cache, *, out=None, lse=None, return_lse=False, k_scale=None,
            v_scale=None):
        """Attention for the planned batch: q ``[rows, num_qo_heads, head_dim]`` in the batch's
        order (one row per request for decode), paged_kv_cache a ``(k_cache, v_cache)`` tuple or
        one ``[num_pages, 2, ...]`` array. Returns out, or (out, lse) with ``return_lse``
        (lse float32 ``[rows, num_qo_heads]``, base 2). ``k_scale`` / ``v_scale``: an fp8 cache's
        dequantization scales, as the decode wrapper's run() takes them. Allocates nothing else
        on the GPU and never synchronizes (capturable in CUDA graph mode)."""
        plan = self._plan
        C.require_plan(plan)
        k, v = C.unpack_paged_kv_cache(paged_kv_cache)
        scale = C.kv_scales(k_scale, v_scale, k, plan["num_kv_heads"])
        out, lse = C.run_outputs(self, q, k, out, lse, return_lse, "paged_kv_indices")
        if self._on_gpu:
            A.call(self._slot.op.run, q, k, v, self._kv_layout, out, lse, A.cuda_stream(q),
                   **scale.kwargs())
        else:
            C.check_planned_host(q, k, plan, self._kv_layout)
            if plan["qo_indptr"] is None:
                A.call(_C.reference_batch_decode, q, k, v, self._kv_layout, plan["indptr"],
                       plan["indices"], plan["last_page_len"], out, lse, plan["sm_scale"],
                       **scale.kwargs())
            else:
                A.call(_C.reference_batch_prefill_paged, q, plan["qo_indptr"], k, v,
                       self._kv_layout, plan["indptr"], plan["indices"], plan["last_page_len"],
                       out, lse, plan["causal"], plan["sm_scale"], **scale.kwargs())
        return C.finish(out, lse, return_lse)

    def plan_info(self) -> dict:
        """The last GPU plan: num_levels (1: plain attention), cascade (whether a shared-prefix
        level is used), the KV bytes plain attention and this plan read, the cost model's
        estimates (us) and plan time. Empty for a host wrapper."""
        return C.plan_info(self._slot)
