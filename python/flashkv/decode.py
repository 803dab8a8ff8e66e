"""Decode attention: one query token per request, FlashInfer's ``flashinfer.decode`` API."""

import functools

import numpy as np

from . import _C
from . import _arrays as A
from . import _common as C
from . import _kv_formats as KQ
from . import _multi_token
from . import _single_plans
from . import _workspace
from . import variants as V
from ._workspace import OpSlot


def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE",
                                use_tensor_cores=False, q_scale=None, k_scale=None, v_scale=None,
                                window_left=-1, logits_soft_cap=None, sm_scale=None,
                                rope_scale=None, rope_theta=None, return_lse=False, *, out=None,
                                lse=None, stream=None, sinks=None, alibi_slopes=None,
                                sigmoid=False, sigmoid_bias=0.0, low_freq_factor=1.0,
                                high_freq_factor=4.0, old_context_len=8192, variant=None,
                                variant_args=None):
    """Decode attention of one request over contiguous KV.

    Parameters follow ``flashinfer.single_decode_with_kv_cache``:
    q ``[num_qo_heads, head_dim]``; k, v ``[kv_len, num_kv_heads, head_dim]`` (NHD) or
    ``[num_kv_heads, kv_len, head_dim]`` (HND); ``num_qo_heads`` a multiple of ``num_kv_heads``
    (GQA). ``sm_scale`` defaults to ``1/sqrt(head_dim)``. ``use_tensor_cores`` is accepted and
    ignored (flashkv picks its kernel itself).

    FP8 KV: k and v may be ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` (q float16 or
    bfloat16; out has q's dtype; on the host also NumPy arrays of ml_dtypes' float8 types), with
    FlashInfer's ``k_scale`` / ``v_scale``: the real key is the stored one times k_scale (None:
    1; a float > 0; flashkv extension: a float32 tensor of 1 or num_kv_heads elements on k's
    device, per KV head). A 16-bit cache takes k_scale / v_scale of None or 1.0 only (fold a key
    scale into ``sm_scale``); ``q_scale`` other than None or 1.0 raises NotImplementedError.

    Variants (as :meth:`BatchDecodeWithPagedKVCacheWrapper.plan`): ``pos_encoding_mode``
    (``"NONE"``, ``"ROPE_LLAMA"``, ``"ALIBI"``; flashkv also takes ``"ROPE_LLAMA31"``) with
    ``rope_scale`` / ``rope_theta``, ``window_left``, ``logits_soft_cap``, and the keyword-only
    flashkv extras ``sinks``, ``alibi_slopes``, ``sigmoid``, ``sigmoid_bias``, the Llama 3.1
    factors, and ``variant`` / ``variant_args`` (a :class:`flashkv.Variant`, GPU only).

    flashkv extensions (keyword-only): ``out`` ``[num_qo_heads, head_dim]`` and ``lse``
    ``float32 [num_qo_heads]`` to write into; ``stream``: a CUDA stream handle for callers without
    torch/CuPy streams.

    Returns out, or (out, lse) with ``return_lse``: lse is the **base-2** log-sum-exp of the
    scaled logits, as FlashInfer's (flashkv's C++ API uses natural logs). With kv_len 0 the
    output is zero and lse -inf. Host arrays run on the CPU reference; CUDA arrays on the GPU, on
    the caller's current stream. Without a variant the GPU plan is made once per (shape,
    dtypes, sm_scale, device) and reused (flashkv._single_plans), so after one eager call with
    the same shapes a call may be captured in a CUDA graph or torch.compile(mode=
    "reduce-overhead"); a variant plans on every call (not capturable).
    """
    C.check_run_extras((), q_scale)
    C.check_layout(kv_layout)
    kvs = C.kv_scales(k_scale, v_scale, k, C.kv_heads(k, kv_layout, paged=False))
    on_gpu = A.is_cuda(q)
    scale = C.sm_scale_arg(sm_scale)
    cvar = V.plan_variant(
        on_gpu=on_gpu, like=q, num_qo_heads=int(q.shape[0]), sm_scale=scale,
        pos_encoding_mode=pos_encoding_mode, window_left=window_left,
        logits_soft_cap=logits_soft_cap, rope_scale=rope_scale, rope_theta=rope_theta,
        low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor,
        old_context_len=old_context_len, sinks=sinks, alibi_slopes=alibi_slopes,
        sigmoid=sigmoid, sigmoid_bias=sigmoid_bias, variant=variant, variant_args=variant_args)
    V.check_lse_wanted(cvar, return_lse or lse is not None)
    out, lse = C.outputs(q, q.shape[:-1], q.shape[-1], None, out, lse, return_lse)
    if cvar is None and on_gpu:  # a cached plan: capturable in a CUDA graph (_single_plans)
        _single_plans.single_decode(q, k, v, out, lse, kv_layout, scale, A.cuda_stream(q, stream),
                                    kvs)
    elif cvar is None:
        A.call(_C.single_decode, q, k, v, out, lse, kv_layout, scale, 0, **kvs.kwargs())
    elif not on_gpu and kvs.is_identity:
        A.call(_C.reference_single_decode_variant, q, k, v, out, lse, kv_layout, cvar)
    elif not on_gpu:  # the contiguous-KV variant reference takes no scales: one-token pages
        kp, vp, kv_len = C.token_pages(k, v, kv_layout)
        A.call(_C.reference_batch_decode_variant, q[None], kp, vp, kv_layout,
               np.array([0, kv_len], np.int32), np.arange(kv_len, dtype=np.int32),
               np.ones(1, np.int32), out[None], None if lse is None else lse[None], cvar,
               **kvs.kwargs())
    else:
        _single_decode_variant_gpu(q, k, v, out, lse, kv_layout, scale, cvar,
                                   A.cuda_stream(q, stream), kvs)
    return C.finish(out, lse, return_lse)


# single_decode_with_kv_cache with a variant on the GPU: flashkv's C++ single_decode takes no
# variant, so this runs a BatchDecode (one per device, in a workspace of its own) over the
# contiguous KV viewed as pages of one token, as the C++ single_decode does internally.


def _single_decode_variant_gpu(q, k, v, out, lse, kv_layout, sm_scale, cvar, stream, kvs):
    hq, d = int(q.shape[0]), int(q.shape[1])
    nhd = kv_layout == "NHD"
    if len(k.shape) != 3 or tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"k, v: expected two 3-D arrays of one shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    A.call(_C.check_single_kv, k, kv_layout, hq)  # heads that do not divide: names the layout
    kv_len, hk = (int(k.shape[0]), int(k.shape[1])) if nhd else (int(k.shape[1]), int(k.shape[0]))
    slot = _workspace.own_slot(_C.BatchDecode, q, dict(max_batch=1, num_qo_heads=hq, head_dim=d),
                               f"num_qo_heads {hq}, head_dim {d}")
    op = slot.op
    indptr = np.array([0, kv_len], np.int32)
    last = np.array([1], np.int32)
    # Kept until the next call: the kernel reads them asynchronously (maybe on another stream).
    slot.indices = A.to_device_like(np.arange(max(kv_len, 1), dtype=np.int32), q)
    kp, vp, _ = C.token_pages(k, v, kv_layout)
    shape = C.make(_C.AttentionShape, num_qo_heads=hq, num_kv_heads=hk, head_dim=d,
                   q_dtype=A.array_dtype(q), kv_dtype=A.array_dtype(k), o_dtype=A.array_dtype(out))
    A.call(op.plan, indptr, last, 1, shape, C.make(_C.DecodePlanOptions, sm_scale=sm_scale),
           variant=cvar, stream=stream)
    A.call(op.run, q[None], kp, vp, kv_layout, indptr, slot.indices, last, out[None],
           None if lse is None else lse[None], stream, **kvs.kwargs())


def _DECODE_NAMES():
    """The decode wrapper's names of its page-table arrays (plan()'s arguments)."""
    return C.page_table_names(kv_indptr="indptr", kv_indices="indices",
                              kv_last_page_len="last_page_len")


class BatchDecodeWithPagedKVCacheWrapper(C.PagedRun):
    """Batch decode over a paged KV cache: ``plan()`` once per generation step, ``run()`` per
    layer. FlashInfer's ``flashinfer.BatchDecodeWithPagedKVCacheWrapper`` API.

    ``float_workspace_buffer``: any contiguous buffer (FlashInfer's 128 MB uint8 tensor is the
    usual choice). On a CUDA device the wrapper runs flashkv's GPU kernels and keeps its plan in
    this buffer; a host buffer (e.g. ``numpy.empty(1, numpy.uint8)``; not empty: plan() raises
    ValueError naming the bytes it needs) makes the wrapper run the CPU reference on host arrays
    instead, with the GPU plan's argument checks. The flashkv plan object is created at ``plan()``
    time, sized for the plan (batch, heads, head_dim), over the whole buffer: what its plan arrays
    leave holds the split-KV partial states, and each plan fits its splits into them
    (``plan_info()["split_limited"]``). Only a buffer smaller than the plan arrays (under 1 MB
    for typical batches) raises ValueError naming the bytes it needs; so does a
    ``fixed_split_size`` plan whose chunks do not fit.

    ``use_cuda_graph``: as FlashInfer, pass ``paged_kv_indptr_buffer`` ``[max_batch + 1]``,
    ``paged_kv_indices_buffer`` and ``paged_kv_last_page_len_buffer`` ``[max_batch]`` (CUDA int32);
    ``plan()`` copies each step's page table into them and ``run()`` reads them, so a graph that
    captured ``run()`` replays correctly after any later ``plan()``. flashkv also accepts plans
    with fewer requests than the buffers hold (capture q/out with ``max_batch`` rows then). The
    plan object is sized once, at the first plan(): later plans may not exceed its heads or
    head_dim. ``use_tensor_cores`` is accepted and ignored: flashkv chooses tensor cores wherever
    its kernel supports the head_dim and GQA group.
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 use_tensor_cores=False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None):
        C.check_backend(backend, jit_args)
        _workspace.check_alignment(float_workspace_buffer, "float_workspace_buffer")
        self._kv_layout = C.check_layout(kv_layout)
        self._use_cuda_graph = bool(use_cuda_graph)
        self._float_workspace_buffer = float_workspace_buffer
        self._on_gpu = A.is_cuda(float_workspace_buffer)
        self._device = A.device_index(float_workspace_buffer)
        if self._use_cuda_graph:
            for name, buf in (("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                              ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                              ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer)):
                if buf is None:
                    raise ValueError(f"{name} is required in CUDA graph mode (use_cuda_graph=True)")
            self._fixed_batch_size = int(paged_kv_last_page_len_buffer.shape[0])
            if int(paged_kv_indptr_buffer.shape[0]) != self._fixed_batch_size + 1:
                raise ValueError(
                    f"paged_kv_indptr_buffer: expected {self._fixed_batch_size + 1} entries "
                    f"(paged_kv_last_page_len_buffer's + 1), got {paged_kv_indptr_buffer.shape[0]}")
        else:
            self._fixed_batch_size = 0
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        self._slot = (OpSlot(_C.BatchDecode, float_workspace_buffer, self._device,
                             frozen=self._use_cuda_graph) if self._on_gpu else None)
        self._plan = None
        self._graph_keep = {}  # CUDA graph mode: the variant arrays of every plan (see plan())
        self._multi = None  # q_len_per_req > 1: the paged prefill wrapper it runs on
        self._q_len_per_req = None  # CUDA graph mode: fixed by the first plan
        self._handle = C.new_handle(self)  # names this wrapper to the torch custom ops
        A.torch_ops(float_workspace_buffer)  # registers them before a torch.compile trace

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        """Use another workspace buffer (``int_workspace_buffer`` is accepted for FlashInfer
        compatibility and unused). Call plan() again before run()."""
        _workspace.reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer)
        if self._multi is not None:  # the multi-token plans' prefill wrapper shares the buffer
            self._multi.reset_workspace_buffer(float_workspace_buffer)

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, *, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, data_type=None,
             sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True,
             block_tables=None, seq_lens=None, fixed_split_size=None, disable_split_kv=False,
             q_len_per_req=1, sinks=None, alibi_slopes=None, sigmoid=False, sigmoid_bias=0.0,
             low_freq_factor=1.0, high_freq_factor=4.0, old_context_len=8192, variant=None,
             variant_args=None):
        """Plan decode for one step's page table (FlashInfer's arguments).

        Parameters
        ----------
        indptr : array
            int32 ``[batch + 1]``: request i has pages ``indices[indptr[i]:indptr[i + 1]]``.
        indices : array
            int32 ``[indptr[-1]]``: the page ids, on the host or the device.
        last_page_len : array
            int32 ``[batch]``: the tokens of each request's last page, in ``[1, page_size]``.
        num_qo_heads, num_kv_heads : int
            Query and KV heads (GQA: num_qo_heads a multiple of num_kv_heads).
        head_dim : int
            64, 128 or 256.
        page_size : int
            Tokens per page (>= 1).
        q_data_type, kv_data_type, o_data_type : dtype or str
            q's dtype (default float16), the cache's (default q's; or fp8) and the output's
            (default q's).
        sm_scale : float, optional
            The logits' scale (default ``1/sqrt(head_dim)``).
        fixed_split_size : int, optional
            KV chunks of this many pages (batch-invariant output).
        disable_split_kv : bool
            Never split a request's KV across CTAs.
        pos_encoding_mode, window_left, logits_soft_cap, rope_scale, rope_theta
            FlashInfer's attention variants (below).
        sinks, alibi_slopes, sigmoid, sigmoid_bias, variant, variant_args
            flashkv's variant extensions (below).
        low_freq_factor, high_freq_factor, old_context_len
            The Llama 3.1 RoPE factors (``"ROPE_LLAMA31"``).

        indptr ``[batch + 1]``, indices ``[indptr[-1]]``, last_page_len ``[batch]``: int32, on the
        host or the device (host copies of indptr and last_page_len are taken here, as FlashInfer
        does). ``fixed_split_size`` is in pages, as FlashInfer's (batch-invariant output);
        ``disable_split_kv`` as FlashInfer's. ``block_tables`` and ``seq_lens`` raise
        NotImplementedError. Must not be called while a CUDA graph is being captured.

        Multi-token decode (speculative verification; FlashInfer 0.6's ``q_len_per_req``): with
        ``q_len_per_req = n > 1`` each request has n new query tokens, q
        ``[batch * n, num_qo_heads, head_dim]`` request-major, causal among themselves and
        aligned to the end of the KV (token i of a request with kv_len keys sees keys
        ``j <= kv_len - n + i``; every kv_len must be >= n, ValueError otherwise). It runs on the
        paged prefill path (flashkv._multi_token: its few-query-rows tiles read the KV at ~95 % of
        the read ceiling, the fastest flashkv kernel for a few queries per request); every
        variant above applies, RoPE at each token's causal position. In CUDA graph mode n is
        fixed by the first plan (ValueError for another n: use a wrapper per n); run_step
        takes one token per request only.

        Attention variants (compiled into the kernel here; run() takes no variant arguments):
        FlashInfer's ``pos_encoding_mode`` (``"NONE"``; ``"ROPE_LLAMA"``: q rotated at position
        ``kv_len - 1`` and key j at j inside the kernel, rotate-half layout, ``rope_scale``
        default 1, ``rope_theta`` 1e4; ``"ALIBI"``: FlashInfer's slopes; flashkv extension
        ``"ROPE_LLAMA31"``: Llama 3.1 scaling, defaults 8 and 5e5 with ``low_freq_factor``,
        ``high_freq_factor``, ``old_context_len``), ``window_left`` (keys
        ``kv_len - 1 - window_left ..`` only; -1: all), ``logits_soft_cap``
        (``cap * tanh(s / cap)``). flashkv extensions: ``sinks`` float32 ``[num_qo_heads]``
        (gpt-oss attention sinks: a per-head logit in the softmax denominator), ``alibi_slopes``
        float32 ``[num_qo_heads]``, ``sigmoid`` / ``sigmoid_bias`` (sigmoid attention: no lse),
        and ``variant`` (a :class:`flashkv.Variant`: your own device C++ hooks) with
        ``variant_args`` (``{param: value}``; arrays on the wrapper's device, or host arrays,
        copied there except in CUDA graph mode). The kernel reads these arrays when run() runs;
        a CUDA graph replays with the arrays of the plan its capture ran, so in graph mode the
        wrapper keeps every variant array it was given. The math is in
        include/flashkv/variants.h. Host wrappers run the built-ins on the CPU reference; a user
        variant there raises NotImplementedError.

        Checks (the same C++ checks on the host and the GPU path, so a plan the GPU refuses is
        refused by a host wrapper too): page_size >= 1, num_qo_heads a multiple of num_kv_heads
        (a GQA group of at most 64), head_dim 64, 128 or 256, one dtype for q, kv and out
        (float16 or bfloat16; a host wrapper also takes float32) or an fp8 KV cache
        (``kv_data_type`` ``torch.float8_e4m3fn`` / ``torch.float8_e5m2``, or the strings
        ``"float8_e4m3fn"`` / ``"float8_e5m2"``, ``"e4m3"`` / ``"e5m2"``; q and out float16 or
        bfloat16: run() takes its ``k_scale`` / ``v_scale``), indptr from 0 and
        non-decreasing, last_page_len in [1, page_size] for each request with pages; a host
        wrapper's workspace must not be empty. Page ids: with ``indices`` on the host, plan()
        checks each is >= 0 and keeps the largest, and run() raises ValueError naming the entry
        (``indices[j] = id is out of range [0, num_pages)``) when it is not below the cache's
        page count, before anything is launched or written (no GPU work, no sync; in CUDA graph
        mode at capture, not at replay). Device-resident ``indices`` are not read on the host:
        set ``FLASHKV_CHECK_DEVICE_ERRORS=1`` to have the kernel check them (an out-of-range id
        then raises from :func:`flashkv.check_device_errors`; otherwise it reads as zeros).
        """
        C.check_variant(block_tables=block_tables, seq_lens=seq_lens)
        q_len = _multi_token.check_q_len(q_len_per_req, self)
        if q_len > 1:
            _multi_token.plan(
                self, q_len, indptr, indices, last_page_len, num_qo_heads, num_kv_heads,
                head_dim, page_size, pos_encoding_mode=pos_encoding_mode,
                window_left=window_left, logits_soft_cap=logits_soft_cap,
                q_data_type=q_data_type, kv_data_type=kv_data_type, o_data_type=o_data_type,
                data_type=data_type, sm_scale=sm_scale, rope_scale=rope_scale,
                rope_theta=rope_theta, fixed_split_size=fixed_split_size,
                disable_split_kv=disable_split_kv, sinks=sinks, alibi_slopes=alibi_slopes,
                sigmoid=sigmoid, sigmoid_bias=sigmoid_bias, low_freq_factor=low_freq_factor,
                high_freq_factor=high_freq_factor, old_context_len=old_context_len,
                variant=variant, variant_args=variant_args)
            return
        _multi_token.leave(self)
        q_dt, kv_dt, o_dt = C.plan_dtypes(q_data_type, kv_data_type, o_data_type, data_type)
        indptr_h = A.host_i32(indptr, "indptr")
        last_h = A.host_i32(last_page_len, "last_page_len")
        batch = indptr_h.shape[0] - 1
        self._plan = None  # a plan() that raises leaves the wrapper unplanned
        # One C++ check per path (flashkv/plan_checks.h, _common.py): the host path's here, the
        # GPU path's in the op's plan() below; with a host page table also its ids (>= 0; the
        # largest is compared with the cache at run()).
        indices_h = (None if self._on_gpu and A.is_cuda(indices)
                     else A.host_i32(indices, "indices"))
        split = 0 if fixed_split_size is None or fixed_split_size <= 0 else (
            int(fixed_split_size) * int(page_size))
        plan = dict(q_dtype=q_dt, kv_dtype=kv_dt, o_dtype=o_dt, num_qo_heads=int(num_qo_heads),
                    num_kv_heads=int(num_kv_heads), head_dim=int(head_dim),
                    page_size=int(page_size), sm_scale=C.sm_scale_arg(sm_scale), batch=batch,
                    indptr=indptr_h, last_page_len=last_h,
                    window_left=-1 if window_left is None else int(window_left),
                    rope=pos_encoding_mode in ("ROPE_LLAMA", "ROPE_LLAMA31"), page_id_max=None,
                    forward_args=C.forward_args(
                        pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                        logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                        rope_scale=rope_scale, rope_theta=rope_theta))
        shape = C.attention_shape(plan)
        if not self._on_gpu:
            plan["page_id_max"] = A.call(_C.check_host_decode_plan, indptr_h, last_h, indices_h,
                                         int(page_size), shape, _DECODE_NAMES())
        keep = []
        plan["variant"] = V.plan_variant(
            on_gpu=self._on_gpu, like=self._float_workspace_buffer,
            num_qo_heads=int(num_qo_heads), sm_scale=plan["sm_scale"],
            pos_encoding_mode=pos_encoding_mode, window_left=window_left,
            logits_soft_cap=logits_soft_cap, rope_scale=rope_scale, rope_theta=rope_theta,
            low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor,
            old_context_len=old_context_len, sinks=sinks, alibi_slopes=alibi_slopes,
            sigmoid=sigmoid, sigmoid_bias=sigmoid_bias, variant=variant,
            variant_args=variant_args, device_only=self._use_cuda_graph, keep=keep)
        if plan["variant"] is not None and KQ.is_format(kv_dt):
            raise NotImplementedError(
                f"kv_data_type={kv_dt!r}: attention variants over a quantized format's cache are "
                f"not implemented yet (issue 42): plan plain attention")
        if self._use_cuda_graph:
            # A captured run() replays with the variant arrays of its capture's plan: keep every
            # array a plan pointed at while this wrapper lives (device arrays of the caller, so
            # this grows only with the distinct arrays given).
            self._graph_keep.update((id(x), x) for x in keep)
        if not self._on_gpu:
            need = dict(max_batch=max(batch, 1), num_qo_heads=int(num_qo_heads),
                        head_dim=int(head_dim))
            C.check_host_workspace(
                self._float_workspace_buffer, C.host_workspace_need_bytes(_C.BatchDecode, need),
                f"batch {batch}, num_qo_heads {num_qo_heads}, head_dim {head_dim}")
            plan["indices"] = indices_h
            self._plan = plan
            return
        if self._use_cuda_graph and batch > self._fixed_batch_size:
            raise ValueError(
                f"indptr: batch {batch} exceeds the {self._fixed_batch_size} requests of the "
                f"buffers given to the constructor (CUDA graph mode)")
        need = self._gpu_need(indptr_h, last_h, num_qo_heads, head_dim, page_size, split)
        op = self._slot.acquire(
            need, f"batch {batch}, num_qo_heads {num_qo_heads}, head_dim {head_dim}")
        stream = A.cuda_stream(self._float_workspace_buffer)
        nnz = int(indptr_h[-1]) if batch > 0 else 0
        if self._use_cuda_graph:
            A.copy_into(self._paged_kv_indptr_buf, indptr_h, batch + 1, "indptr")
            A.copy_into(self._paged_kv_last_page_len_buf, last_h, batch, "last_page_len")
            A.copy_into(self._paged_kv_indices_buf, indices[:nnz], nnz, "indices")
            plan["indices"] = self._paged_kv_indices_buf
            plan["run_indptr"] = self._paged_kv_indptr_buf
            plan["run_last_page_len"] = self._paged_kv_last_page_len_buf
        else:
            plan["indices"] = (A.device_i32(indices) if indices_h is None
                               else A.to_device_like(indices_h, self._float_workspace_buffer))
            plan["run_indptr"], plan["run_last_page_len"] = indptr_h, last_h
        options = C.make(_C.DecodePlanOptions, sm_scale=plan["sm_scale"],
                         enable_cuda_graph=self._use_cuda_graph, fixed_split_size=split,
                         disable_split_kv=bool(disable_split_kv))
        A.call(op.plan, indptr_h, last_h, int(page_size), shape, options,
               variant=plan["variant"], kv_indices=indices_h, names=_DECODE_NAMES(),
               stream=stream)
        self._plan = plan

    def _gpu_need(self, indptr_h, last_h, num_qo_heads, head_dim, page_size, split) -> dict:
        """The configuration (OpSlot.acquire's need) a GPU plan of this page table asks for."""
        batch = indptr_h.shape[0] - 1
        # fixed_split_size cuts requests into chunks whatever the grid, so the workspace must hold
        # every chunk's partial state: C++ counts them (BatchDecode.fixed_split_chunks), and the
        # config holds them as max_kv_tokens with min_fixed_split_size 1, fields that only grow
        # (OpSlot.acquire). Eagerly: this plan's chunks. CUDA graph mode sizes once, for the most
        # the indices buffer can describe (one request over all its pages, full), so later plans
        # with longer requests fit the captured workspace.
        chunks = 0
        if split > 0 and self._use_cuda_graph:
            pages = int(self._paged_kv_indices_buf.shape[0])
            chunks = _C.BatchDecode.fixed_split_chunks(
                np.array([0, pages], np.int32), np.array([page_size], np.int32), int(page_size),
                split)
        elif split > 0:
            chunks = _C.BatchDecode.fixed_split_chunks(indptr_h, last_h, int(page_size), split)
        need = dict(max_batch=max(self._fixed_batch_size, batch, 1),
                    num_qo_heads=int(num_qo_heads), head_dim=int(head_dim))
        if chunks > 0:
            need.update(max_kv_tokens=chunks, min_fixed_split_size=1)
        return need

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None,
            q_len_per_req=None, k_group_scale=None, v_group_scale=None, k_zero=None,
            v_zero=None):
        """Decode attention for the planned batch.

        Parameters
        ----------
        q : array
            ``[batch, num_qo_heads, head_dim]``, the plan's q dtype.
        paged_kv_cache : tuple or array
            ``(k_cache, v_cache)`` or one interleaved ``[num_pages, 2, ...]`` array (below).
        k_scale, v_scale : float or array, optional
            An fp8 cache's dequantization scales (below).
        out : array, optional
            ``[batch, num_qo_heads, head_dim]`` to write into.
        lse : array, optional
            ``float32 [batch, num_qo_heads]`` to write into (base 2).
        return_lse : bool
            Also return lse.
        q_scale, enable_pdl, window_left
            Accepted for FlashInfer compatibility (below).
        sinks, q_len_per_req
            FlashInfer 0.6 takes them at run() too: flashkv takes sinks at plan() only
            (NotImplementedError here); q_len_per_req, if given, must be the plan's.
        k_group_scale, v_group_scale, k_zero, v_zero : array, optional
            A quantized ``kv_data_type``'s group scales and INT4's zero points
            (:mod:`flashkv.kv_quant`; host wrappers only: no GPU kernel reads these yet).

        q ``[batch, num_qo_heads, head_dim]``; paged_kv_cache a ``(k_cache, v_cache)`` tuple of
        ``[num_pages, page_size, num_kv_heads, head_dim]`` (NHD) or
        ``[num_pages, num_kv_heads, page_size, head_dim]`` (HND) arrays, or one
        ``[num_pages, 2, ...]`` array. ``out`` / ``lse`` (float32 ``[batch, num_qo_heads]``) are
        written when given, else allocated in q's framework (torch.empty for torch tensors).
        Returns out, or (out, lse) with ``return_lse``; lse is **base 2** (FlashInfer's
        convention; flashkv's C++ API is natural-log).

        FP8 caches (a plan with an fp8 ``kv_data_type``): ``k_scale`` / ``v_scale`` are the
        dequantization scales, FlashInfer's (the real key is the stored one times k_scale): None
        (1), a float > 0, or (flashkv extension) a float32 tensor of 1 or num_kv_heads elements
        on the cache's device, one scale per KV head. The kernel reads a tensor scale when it
        runs, so a captured CUDA graph replays with the tensor's current value: scales may
        change between replays without a new capture (a float is baked into the capture). A
        16-bit cache takes only None or 1.0 (ValueError otherwise: fold a key scale into
        ``sm_scale`` at plan()). ``q_scale`` other than None or 1.0 raises NotImplementedError.

        GPU work goes on torch's current stream
        (or CuPy's); allocates nothing else and never synchronizes, so it can be captured in a
        CUDA graph in CUDA graph mode. ``enable_pdl`` is accepted and ignored. On torch CUDA
        tensors this is the torch custom op ``flashkv::batch_decode_run`` (``..._out`` with
        ``out``/``lse``), which torch.compile captures; plan() stays outside the graph. A page id
        of a host page table given to plan() that is not below the cache's page count raises
        ValueError naming the entry, before anything is written (see :meth:`plan`).
        """
        C.require_plan(self._plan, window_left)
        if sinks is not None:
            C.not_implemented("sinks", "<array>", "None at run(); pass sinks to plan()")
        if self._plan.get("q_len_per_req", 1) > 1 or (q_len_per_req or 1) > 1:
            return _multi_token.run(self, q, paged_kv_cache, args, q_len_per_req, q_scale=q_scale,
                                    k_scale=k_scale, v_scale=v_scale, out=out, lse=lse,
                                    return_lse=return_lse, window_left=window_left)
        C.check_run_extras(args, q_scale)
        V.check_lse_wanted(self._plan["variant"], return_lse or lse is not None)
        k, v = C.unpack_paged_kv_cache(paged_kv_cache)
        group = KQ.group_scales(self._plan["kv_dtype"], k_group_scale, v_group_scale, k_zero,
                                v_zero)
        scale = C.kv_scales(k_scale, v_scale, k, self._plan["num_kv_heads"], group=group)
        return A.dispatch_run(self, "batch_decode_run", q, k, v, out, lse, return_lse, scale)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q, paged_kv_cache, pos_encoding_mode=C.UNSET, q_scale=None, k_scale=None,
                v_scale=None, window_left=C.UNSET, logits_soft_cap=C.UNSET, sm_scale=C.UNSET,
                rope_scale=C.UNSET, rope_theta=C.UNSET, *, return_lse=False):
        """FlashInfer's deprecated forward(): run() with the plan's variant (an argument given
        must be the plan's: ValueError otherwise, naming it)."""
        C.check_forward_args(self._plan, dict(
            pos_encoding_mode=pos_encoding_mode, window_left=window_left,
            logits_soft_cap=logits_soft_cap, sm_scale=sm_scale, rope_scale=rope_scale,
            rope_theta=rope_theta))
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                        return_lse=return_lse)

    forward_return_lse = functools.partialmethod(forward, return_lse=True)

    def workspace_size(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads,
                       head_dim, page_size, pos_encoding_mode="NONE", window_left=-1,
                       logits_soft_cap=None, q_data_type="float16", kv_data_type=None,
                       o_data_type=None, data_type=None, sm_scale=None, rope_scale=None,
                       rope_theta=None, block_tables=None, seq_lens=None, fixed_split_size=None,
                       disable_split_kv=False, q_len_per_req=1, **variant_extras):
        """FlashInfer 0.6's workspace query: (float_workspace_size, int_workspace_size), the
        bytes a buffer needs for plan() with these arguments (a buffer of exactly that size plans
        without limiting split-KV; see flashkv._workspace). flashkv keeps everything in the float
        workspace: the int size is a nominal 16 bytes (FlashInfer's callers allocate one). Allocates
        nothing and leaves the plan as it is."""
        del indices, num_kv_heads, pos_encoding_mode, window_left, logits_soft_cap, q_data_type
        del kv_data_type, o_data_type, data_type, sm_scale, rope_scale, rope_theta, block_tables
        del seq_lens, disable_split_kv, variant_extras
        indptr_h = A.host_i32(indptr, "indptr")
        last_h = A.host_i32(last_page_len, "last_page_len")
        batch = indptr_h.shape[0] - 1
        if int(q_len_per_req) > 1:
            cls = _C.BatchPrefillPaged
            need = dict(max_batch=max(self._fixed_batch_size, batch, 1),
                        max_qo_tokens=max(batch * int(q_len_per_req), 1),
                        num_qo_heads=int(num_qo_heads), head_dim=int(head_dim))
        else:
            cls = _C.BatchDecode
            split = 0 if fixed_split_size is None or fixed_split_size <= 0 else (
                int(fixed_split_size) * int(page_size))
            need = self._gpu_need(indptr_h, last_h, num_qo_heads, head_dim, page_size, split)
        return _workspace.bytes_for(self, cls, need), _workspace.INT_WORKSPACE_BYTES

    def _reference_run(self, q, k, v, out, lse, scale):
        plan = self._plan
        self._reference_decode(q, k, v, plan["indptr"], plan["indices"], plan["last_page_len"],
                               out, lse, scale)

    def _reference_decode(self, q, k, v, indptr, indices, last_page_len, out, lse, scale):
        """The CPU reference of the plan (its built-in variant, if any); `scale` the cache's
        KVScale."""
        plan = self._plan
        if plan["variant"] is None:
            A.call(_C.reference_batch_decode, q, k, v, self._kv_layout, indptr, indices,
                   last_page_len, out, lse, plan["sm_scale"], **scale.kwargs())
        else:
            A.call(_C.reference_batch_decode_variant, q, k, v, self._kv_layout, indptr, indices,
                   last_page_len, out, lse, plan["variant"], **scale.kwargs())

    def run_step(self, q, k_new, v_new, paged_kv_cache, *, rope="none", pos_ids=None,
                 rotary_dim=None, interleave=False, rope_scale=None, rope_theta=None,
                 low_freq_factor=1.0, high_freq_factor=4.0, old_context_len=8192,
                 cos_sin_cache=None, is_neox=True, out=None, lse=None, return_lse=False,
                 k_scale=None, v_scale=None):
        """The fused decode step (flashkv extension; FlashInfer has no counterpart): RoPE on q and
        the new keys, the append of every request's new token into the cache, and decode
        attention over the updated cache, in one launch per layer on the GPU.

        Equal (bitwise, cache and outputs) to what an engine otherwise runs per layer::

            q, k_new = flashkv.apply_llama31_rope_pos_ids(q, k_new, pos_ids, ...)  # per `rope`
            flashkv.append_paged_kv_cache(k_new, v_new, arange(batch), kv_len - 1,
                                          paged_kv_cache, indices, indptr, last_page_len)
            out = wrapper.run(q, paged_kv_cache)

        The plan() must describe the page table AFTER the append: every request has
        ``kv_len >= 1`` and its new token goes to position ``kv_len - 1`` (its last page
        allocated). q ``[batch, num_qo_heads, head_dim]`` is read, not modified; k_new, v_new
        ``[batch, num_kv_heads, head_dim]`` (the cache's dtype, last dimension contiguous,
        16-byte aligned rows); paged_kv_cache as in :meth:`run` (written: the new tokens).

        FP8 caches: k_new / v_new are in q's dtype (float16 / bfloat16) and are quantized into
        the cache with ``k_scale`` / ``v_scale`` (keyword-only; as :meth:`run`'s: None, a float
        or a float32 tensor of 1 or num_kv_heads elements on the device), exactly as
        :func:`flashkv.append_paged_kv_cache` quantizes, and attention reads the cache with the
        same scales: equal to append_paged_kv_cache(..., k_scale=, v_scale=) followed by
        run(..., k_scale=, v_scale=).

        ``rope``: ``"none"`` (or None; q and k_new already rotated), ``"llama"``
        (:func:`flashkv.apply_rope_pos_ids`: ``rope_scale`` default 1, ``rope_theta`` 1e4),
        ``"llama31"`` (:func:`flashkv.apply_llama31_rope_pos_ids`: defaults 8 and 5e5, and
        ``low_freq_factor``, ``high_freq_factor``, ``old_context_len``) or ``"cos_sin_cache"``
        (:func:`flashkv.apply_rope_with_cos_sin_cache` with ``cos_sin_cache`` float32
        ``[max_position, rotary_dim]`` on the device and ``is_neox``). ``rotary_dim`` (None: all
        of head_dim) and ``interleave`` as in :mod:`flashkv.rope`. ``pos_ids`` ``[batch]`` int32:
        each request's RoPE position (default ``kv_len - 1``, the append position); on the GPU a
        bad one leaves that request's q and key unrotated and is raised by
        :func:`flashkv.check_device_errors`.

        Returns out, or (out, lse) with ``return_lse`` (lse base 2, as :meth:`run`). GPU work goes
        on torch's (or CuPy's) current stream; allocates nothing else and never synchronizes, so
        it can be captured in a CUDA graph in CUDA graph mode (a replay after a new plan()
        appends where the new plan says). A host wrapper runs the three CPU reference ops.
        """
        plan = self._plan
        if plan is None:
            raise ValueError("run_step: called before a successful plan()")
        if plan.get("q_len_per_req", 1) > 1:
            C.not_implemented("q_len_per_req", plan["q_len_per_req"],
                              "1 in the plan of run_step (the fused step appends one token per "
                              "request); use append_paged_kv_cache, then run()")
        if plan["rope"]:
            raise ValueError("run_step: the plan's pos_encoding_mode rotates q and k inside "
                             "attention; the fused step rotates them too. Use run_step's rope= "
                             "with pos_encoding_mode='NONE', or run()")
        V.check_lse_wanted(plan["variant"], return_lse or lse is not None)
        rope = "none" if rope is None else rope
        if rope not in ("none", "llama", "llama31", "cos_sin_cache"):
            raise ValueError(f"rope: expected 'none', 'llama', 'llama31' or 'cos_sin_cache', got "
                             f"{rope!r}")
        if (cos_sin_cache is not None) != (rope == "cos_sin_cache"):
            raise ValueError("cos_sin_cache: required with rope='cos_sin_cache' and only then")
        llama31 = rope == "llama31"
        scale = float((8.0 if llama31 else 1.0) if rope_scale is None else rope_scale)
        theta = float((5e5 if llama31 else 1e4) if rope_theta is None else rope_theta)
        rd = 0 if rotary_dim is None else int(rotary_dim)
        k, v = C.unpack_paged_kv_cache(paged_kv_cache)
        kvs = C.kv_scales(k_scale, v_scale, k, plan["num_kv_heads"])
        out, lse = C.run_outputs(self, q, k, out, lse, return_lse, "indices")
        if self._on_gpu:
            pos = None if pos_ids is None else (
                A.device_i32(pos_ids) if A.is_cuda(pos_ids)
                else A.to_device_like(A.host_i32(pos_ids, "pos_ids"), q))
            A.call(self._slot.op.run_step, q, k_new, v_new, k, v, self._kv_layout,
                   plan["run_indptr"], plan["indices"], plan["run_last_page_len"], out, lse, rope,
                   rd, bool(interleave), scale, theta, float(low_freq_factor),
                   float(high_freq_factor), float(old_context_len), cos_sin_cache,
                   bool(is_neox), pos, A.cuda_stream(q), **kvs.kwargs())
            return C.finish(out, lse, return_lse)
        # Host: the unfused ops on the CPU reference.
        C.check_planned_host(q, k, plan, self._kv_layout)
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            if len(x.shape) != 3 or x.shape[0] != plan["batch"]:
                raise ValueError(f"{name}: expected {plan['batch']} rows (one new token per "
                                 f"request of the plan), got shape {tuple(x.shape)}")
        indptr, last = plan["indptr"], plan["last_page_len"]
        kv_len = C.host_kv_lens(indptr, last, plan["page_size"]).astype(np.int32)
        if plan["batch"] and kv_len.min() < 1:
            raise ValueError(
                f"run_step: every request must have kv_len >= 1 in the plan (the page table after "
                f"the append counts the new token); request {int(np.argmin(kv_len))} has 0")
        positions = kv_len - 1
        pos = positions if pos_ids is None else A.host_i32(pos_ids, "pos_ids")
        q_rot, k_rot = q, k_new
        if rope != "none":
            q_rot, k_rot = A.empty(q, q.shape), A.empty(k_new, k_new.shape)
            if rope == "cos_sin_cache":
                A.call(_C.apply_rope_with_cos_sin_cache, q, k_new, q_rot, k_rot, pos,
                       cos_sin_cache, bool(is_neox), 0)
            elif llama31:
                A.call(_C.apply_llama31_rope_pos_ids, q, k_new, q_rot, k_rot, pos, rd,
                       bool(interleave), scale, theta, float(low_freq_factor),
                       float(high_freq_factor), float(old_context_len), 0)
            else:
                A.call(_C.apply_rope_pos_ids, q, k_new, q_rot, k_rot, pos, rd, bool(interleave),
                       scale, theta, 0)
        A.call(_C.append_paged_kv_cache, k_rot, v_new, np.arange(plan["batch"], dtype=np.int32),
               positions, k, v, self._kv_layout, indptr, plan["indices"], last, 0,
               **kvs.kwargs())
        self._reference_decode(q_rot, k, v, indptr, plan["indices"], last, out, lse, kvs)
        return C.finish(out, lse, return_lse)

    def plan_info(self) -> dict:
        """flashkv's statistics of the last GPU plan (CTAs, work items, splits, plan time; a
        multi-token plan's are the paged prefill op's)."""
        if self._plan is not None and self._plan.get("q_len_per_req", 1) > 1:
            return self._multi.plan_info()
        return C.plan_info(self._slot)


def fast_decode_plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                     page_size, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
                     q_data_type=None, kv_data_type=None, data_type=None, sm_scale=None,
                     rope_scale=None, rope_theta=None, non_blocking=True, fixed_split_size=None,
                     disable_split_kv=False, q_len_per_req=1, global_override_indptr_cpu=None,
                     **kwargs):
    """FlashInfer's ``fast_decode_plan(wrapper, ...)``, used as ``wrapper.plan =
    functools.partial(fast_decode_plan, wrapper)`` by multi-step draft backends: FlashInfer's
    variant skips copies its plan() makes; flashkv's plan() makes no copies to skip, so this is
    the class's plan() (called through the class: the instance's ``plan`` may be this partial),
    with ``global_override_indptr_cpu`` (a host copy of indptr) as the indptr it reads. A
    multi-token plan (q_len_per_req > 1) needs a prior plan() of the wrapper, as FlashInfer's."""
    del non_blocking
    if int(q_len_per_req) > 1 and self._plan is None:
        raise ValueError("fast_decode_plan with q_len_per_req > 1 requires a prior plan() of "
                         "the wrapper")
    if global_override_indptr_cpu is not None:
        indptr = global_override_indptr_cpu
    q_data_type = "float16" if q_data_type is None and data_type is None else q_data_type
    BatchDecodeWithPagedKVCacheWrapper.plan(
        self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
        pos_encoding_mode=pos_encoding_mode, window_left=window_left,
        logits_soft_cap=logits_soft_cap, q_data_type=q_data_type, kv_data_type=kv_data_type,
        data_type=data_type, sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
        fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv,
        q_len_per_req=q_len_per_req, **kwargs)
