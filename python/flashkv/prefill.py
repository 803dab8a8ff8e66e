"""Prefill and append attention (ragged queries), FlashInfer's ``flashinfer.prefill`` API.

Causal masks align to the END of the KV, as FlashInfer's: query i of a request with qo_len
queries and kv_len keys sees keys j <= kv_len - qo_len + i (a query that sees no key gets zeros
and lse -inf).

Attention variants (the plans and single_prefill_with_kv_cache; the math is in
include/flashkv/variants.h): FlashInfer's ``pos_encoding_mode`` (``"NONE"``; ``"ROPE_LLAMA"``:
query i rotated at its causal position ``kv_len - qo_len + i``, key j at j, inside the kernel,
rotate-half layout, ``rope_scale`` default 1, ``rope_theta`` 1e4; ``"ALIBI"``: FlashInfer's
slopes; flashkv extension ``"ROPE_LLAMA31"``: Llama 3.1 scaling, defaults 8 and 5e5 with
``low_freq_factor``, ``high_freq_factor``, ``old_context_len``), ``window_left`` (query i sees
keys ``kv_len - qo_len + i - window_left ..``; -1: all; combine with ``causal`` for Mistral/Gemma
windows), ``logits_soft_cap`` (``cap * tanh(s / cap)``), ``custom_mask`` (bool: request b's
``[qo_len_b, kv_len_b]`` mask flattened row-major, requests back to back; True = attend; packed
here per request with bitorder "little", as FlashInfer's segment_packbits) or
``packed_custom_mask`` (uint8, those bytes; flashkv extension ``mask_indptr``: int32
``[batch + 1]`` byte offset of each request, by default each request's
``ceil(qo_len * kv_len / 8)`` bytes back to back). As FlashInfer's MaskMode.CUSTOM, a custom
mask replaces ``causal`` (put the causal part into the mask). flashkv extensions: ``sinks``
float32 ``[num_qo_heads]`` (gpt-oss sinks), ``alibi_slopes`` float32 ``[num_qo_heads]``,
``sigmoid`` / ``sigmoid_bias`` (sigmoid attention: no lse) and ``variant`` (a
:class:`flashkv.Variant`, GPU only) with ``variant_args``, named as the decode wrapper's.
Variant arrays may be host arrays on a GPU wrapper (copied at plan(), except in CUDA graph mode,
where they must be on the device; custom masks then go through ``custom_mask_buf`` /
``mask_indptr_buf``). Host arrays run the built-ins on the CPU reference; a user variant there
raises NotImplementedError.

FP8 KV caches: every entry point here takes ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` KV
(q float16 or bfloat16, out in q's dtype; on the host also NumPy arrays of ml_dtypes' float8
types; the plans' ``kv_data_type`` says so: a torch dtype or its name, or ``"e4m3"`` /
``"e5m2"``), and run() FlashInfer's ``k_scale`` / ``v_scale`` (single_prefill_with_kv_cache:
``scale_k`` / ``scale_v``), the dequantization scales: the real key is the stored one times
k_scale. Each is None (1), a float > 0 or (flashkv extension) a float32 tensor of 1 or
num_kv_heads elements on the cache's device (per KV head), read by the kernel when it runs (a
CUDA graph replays with the tensor's current value). A 16-bit cache takes only None or 1.0
(ValueError otherwise: fold a key scale into ``sm_scale``); a query scale (``q_scale`` /
``scale_q``) other than None or 1.0 raises NotImplementedError. ``backend`` as with 16-bit KV
(plan() raises, naming it, where the kernel asked for cannot run the plan).
"""

import functools

import numpy as np

from . import _C
from . import _arrays as A
from . import _common as C
from . import _kv_formats as KQ
from . import _single_plans
from . import _workspace
from . import variants as V
from ._workspace import OpSlot

# flashkv's variant extras of the prefill entry points (keyword-only), with their defaults; the
# decode wrapper names them the same.
_EXTRAS = dict(sinks=None, alibi_slopes=None, sigmoid=False, sigmoid_bias=0.0,
               low_freq_factor=1.0, high_freq_factor=4.0, old_context_len=8192, variant=None,
               variant_args=None, mask_indptr=None)


def _extras(kw):
    bad = sorted(set(kw) - set(_EXTRAS))
    if bad:
        raise TypeError(f"unexpected keyword argument {bad[0]!r}")
    return {**_EXTRAS, **kw}


def _variant(*, on_gpu, like, num_qo_heads, sm_scale, causal, qo_lens, kv_lens, custom_mask,
             packed_custom_mask, pos_encoding_mode, window_left, logits_soft_cap, rope_scale,
             rope_theta, extras, device_only=False, mask_bufs=None, keep=None):
    """(the plan's flashkv._C.Variant or None, the op's causal flag): FlashInfer's prefill
    variant arguments mapped by flashkv.variants (shared with decode)."""
    ex = dict(extras)
    mask = V.packed_mask(custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
                         mask_indptr=ex.pop("mask_indptr"), qo_lens=qo_lens, kv_lens=kv_lens,
                         on_gpu=on_gpu, like=like, device_only=device_only, bufs=mask_bufs)
    causal = bool(causal) and mask is None  # FlashInfer: a custom mask replaces causal
    cvar = V.plan_variant(on_gpu=on_gpu, like=like, num_qo_heads=num_qo_heads, sm_scale=sm_scale,
                          causal=causal, pos_encoding_mode=pos_encoding_mode,
                          window_left=window_left, logits_soft_cap=logits_soft_cap,
                          rope_scale=rope_scale, rope_theta=rope_theta, mask=mask,
                          device_only=device_only, keep=keep, **ex)
    return cvar, causal


def single_prefill_with_kv_cache(q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None,
                                 custom_mask=None, packed_custom_mask=None, causal=False,
                                 kv_layout="NHD", pos_encoding_mode="NONE",
                                 use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
                                 logits_soft_cap=None, rope_scale=None, rope_theta=None,
                                 backend="auto", return_lse=False, *, out=None, lse=None,
                                 stream=None, **variant_extras):
    """Prefill/append attention of one request over contiguous KV.

    Parameters follow ``flashinfer.single_prefill_with_kv_cache``: q
    ``[qo_len, num_qo_heads, head_dim]``; k, v ``[kv_len, num_kv_heads, head_dim]`` (NHD) or
    ``[num_kv_heads, kv_len, head_dim]`` (HND). ``causal`` aligns to the end of the KV.
    ``use_fp16_qk_reduction`` is accepted and ignored (flashkv accumulates in float32). FP8 KV
    (k, v float8): ``scale_k`` / ``scale_v`` dequantize it (None, a float, or a float32 tensor
    of 1 or num_kv_heads elements on k's device: see the module docstring); ``scale_q`` other
    than None or 1.0 raises NotImplementedError. Variants (``pos_encoding_mode``, ``window_left``,
    ``logits_soft_cap``, ``rope_scale``, ``rope_theta``, ``custom_mask`` ``[qo_len, kv_len]``,
    ``packed_custom_mask``, and the keyword-only ``sinks``, ``alibi_slopes``, ``sigmoid``,
    ``sigmoid_bias``, ``low_freq_factor``, ``high_freq_factor``, ``old_context_len``,
    ``variant``, ``variant_args``, ``mask_indptr``): see the module docstring. ``backend``:
    ``"auto"``, ``"fa2"`` (the mma.sync kernel) or ``"fa3"`` (the Hopper wgmma kernel: sm_90a,
    128-row query tiles, no variant; an error where it cannot run).

    flashkv extensions (keyword-only): ``out``, ``lse`` (float32 ``[qo_len, num_qo_heads]``) to
    write into, and ``stream``. Returns out, or (out, lse) with ``return_lse``; lse is **base 2**
    (FlashInfer's convention; flashkv's C++ API uses natural logs). Host arrays run on the CPU
    reference; CUDA arrays on the GPU on the caller's current stream. Without a variant the GPU
    plan is made once per (shapes, dtypes, causal, sm_scale, backend, device) and reused
    (flashkv._single_plans): after one eager call with the same shapes a call may be captured in
    a CUDA graph or torch.compile(mode="reduce-overhead"); a variant plans on every call.
    """
    C.check_run_extras((), scale_q, q_scale_name="scale_q")
    C.check_backend(backend, allowed=C.PREFILL_BACKENDS)
    C.check_layout(kv_layout)
    ex = _extras(variant_extras)
    if len(q.shape) != 3 or len(k.shape) != 3 or tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"q, k, v: expected 3-D arrays with k and v of one shape, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    kvs = C.kv_scales(scale_k, scale_v, k, C.kv_heads(k, kv_layout, paged=False),
                      names=("scale_k", "scale_v"))
    on_gpu = A.is_cuda(q)
    scale = C.sm_scale_arg(sm_scale)
    kv_len = int(k.shape[0] if kv_layout == "NHD" else k.shape[1])
    cvar, causal = _variant(
        on_gpu=on_gpu, like=q, num_qo_heads=int(q.shape[1]), sm_scale=scale, causal=causal,
        qo_lens=[int(q.shape[0])], kv_lens=[kv_len], custom_mask=custom_mask,
        packed_custom_mask=packed_custom_mask, pos_encoding_mode=pos_encoding_mode,
        window_left=window_left, logits_soft_cap=logits_soft_cap, rope_scale=rope_scale,
        rope_theta=rope_theta, extras=ex)
    V.check_lse_wanted(cvar, return_lse or lse is not None)
    o_dt = None if o_dtype is None else A.dtype_name(o_dtype)
    out, lse = C.outputs(q, q.shape[:-1], q.shape[-1], o_dt, out, lse, return_lse)
    if cvar is None and on_gpu:  # a cached plan: capturable in a CUDA graph (_single_plans)
        _single_plans.single_prefill(q, k, v, out, lse, kv_layout, causal, scale, backend,
                                     A.cuda_stream(q, stream), kvs)
    elif cvar is None:
        A.call(_C.single_prefill, q, k, v, out, lse, kv_layout, causal, scale, 0,
               **kvs.kwargs())
    elif not on_gpu and kvs.is_identity:
        A.call(_C.reference_single_prefill_variant, q, k, v, out, lse, kv_layout, cvar)
    elif not on_gpu:  # the contiguous-KV variant reference takes no scales: one-token pages
        kp, vp, kv_len = C.token_pages(k, v, kv_layout)
        A.call(_C.reference_batch_prefill_paged_variant, q,
               np.array([0, int(q.shape[0])], np.int32), kp, vp, kv_layout,
               np.array([0, kv_len], np.int32), np.arange(kv_len, dtype=np.int32),
               np.ones(1, np.int32), out, lse, cvar, **kvs.kwargs())
    else:  # a variant: through a BatchPrefillRagged planned on every call
        _single_prefill_gpu(q, k, v, out, lse, kv_layout, causal, scale, cvar, backend,
                            A.cuda_stream(q, stream), kvs)
    return C.finish(out, lse, return_lse)


# single_prefill_with_kv_cache with a variant on the GPU: flashkv's C++ single_prefill takes no
# variant, so this runs a BatchPrefillRagged of one request (one per device, in a workspace of its
# own), as single_decode_with_kv_cache does with a BatchDecode.


def _single_prefill_gpu(q, k, v, out, lse, kv_layout, causal, sm_scale, cvar, backend, stream,
                        kvs):
    qo_len, hq, d = (int(x) for x in q.shape)
    A.call(_C.check_single_kv, k, kv_layout, hq)  # heads that do not divide: names the layout
    hk = int(k.shape[1] if kv_layout == "NHD" else k.shape[0])
    kv_len = int(k.shape[0] if kv_layout == "NHD" else k.shape[1])
    need = dict(max_batch=1, max_qo_tokens=max(qo_len, 1), num_qo_heads=hq, head_dim=d)
    op = _workspace.own_slot(_C.BatchPrefillRagged, q, need,
                             f"{qo_len} query tokens, num_qo_heads {hq}, head_dim {d}").op
    qo_indptr = np.array([0, qo_len], np.int32)
    kv_indptr = np.array([0, kv_len], np.int32)
    shape = C.make(_C.AttentionShape, num_qo_heads=hq, num_kv_heads=hk, head_dim=d,
                   q_dtype=A.array_dtype(q), kv_dtype=A.array_dtype(k), o_dtype=A.array_dtype(out))
    options = C.make(_C.PrefillPlanOptions, causal=causal, sm_scale=sm_scale, backend=backend)
    A.call(op.plan, qo_indptr, kv_indptr, shape, options, variant=cvar, stream=stream)
    if kv_layout == "HND":
        k, v = A.swap01(k), A.swap01(v)
    A.call(op.run, q, k, v, out, lse, stream, **kvs.kwargs())


class _BatchPrefillBase:
    """Workspace, CUDA-graph buffers and the lazily created C++ op of both prefill wrappers."""

    _op_class = None  # _C.BatchPrefillPaged / _C.BatchPrefillRagged

    def _init(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args,
              jit_kwargs, buffers, custom_mask_buf, mask_indptr_buf):
        C.check_backend(backend, jit_args, jit_kwargs, allowed=C.PREFILL_BACKENDS)
        _workspace.check_alignment(float_workspace_buffer, "float_workspace_buffer")
        self._backend = backend  # "auto", "fa2" (mma.sync) or "fa3" (Hopper wgmma)
        self._kv_layout = C.check_layout(kv_layout)
        self._use_cuda_graph = bool(use_cuda_graph)
        self._float_workspace_buffer = float_workspace_buffer
        self._on_gpu = A.is_cuda(float_workspace_buffer)
        self._device = A.device_index(float_workspace_buffer)
        self._buffers = buffers  # name -> array or None
        if self._use_cuda_graph:
            for name, buf in buffers.items():
                if buf is None:
                    raise ValueError(f"{name} is required in CUDA graph mode (use_cuda_graph=True)")
            self._fixed_batch_size = int(buffers["qo_indptr_buf"].shape[0]) - 1
        else:
            self._fixed_batch_size = 0
        self._slot = (OpSlot(self._op_class, float_workspace_buffer, self._device,
                             frozen=self._use_cuda_graph) if self._on_gpu else None)
        self._plan = None
        # CUDA graph mode: a custom mask is copied into these (FlashInfer's buffers), and the
        # other variant arrays of every plan are kept (a captured run() replays their pointers).
        self._mask_bufs = (custom_mask_buf, mask_indptr_buf) if self._use_cuda_graph else None
        self._graph_keep = {}
        self._handle = C.new_handle(self)  # names this wrapper to the torch custom ops
        A.torch_ops(float_workspace_buffer)  # registers them before a torch.compile trace
        # A captured graph pins the kernel, whose query tile the heuristic picks from the average
        # query length: under CUDA graphs the first plan's tile is kept for every later plan.
        self._tile_rows = 0

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        """Use another workspace buffer (``int_workspace_buffer`` is accepted for FlashInfer
        compatibility and unused). Call plan() again before run()."""
        _workspace.reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer)
        self._tile_rows = 0

    def plan_info(self) -> dict:
        """flashkv's statistics of the last GPU plan (CTAs, work items, tile rows, plan time)."""
        return C.plan_info(self._slot)

    def _common_plan(self, qo_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo,
                     causal, sm_scale, q_data_type, kv_data_type, o_data_type, fixed_split_size,
                     page_size):
        if head_dim_vo is not None and head_dim_vo != head_dim_qk:
            C.not_implemented("head_dim_vo", head_dim_vo, f"None or head_dim_qk ({head_dim_qk})")
        q_dt, kv_dt, o_dt = C.plan_dtypes(q_data_type, kv_data_type, o_data_type)
        qo_h = A.host_i32(qo_indptr, "qo_indptr")
        batch = qo_h.shape[0] - 1
        nnz_qo = int(qo_h[-1]) if batch > 0 else 0
        split = 0 if fixed_split_size is None or fixed_split_size <= 0 else (
            int(fixed_split_size) * int(page_size))
        self._plan = None  # a plan() that raises leaves the wrapper unplanned
        if self._use_cuda_graph and batch > self._fixed_batch_size:
            raise ValueError(
                f"qo_indptr: batch {batch} exceeds the {self._fixed_batch_size} requests of the "
                f"buffers given to the constructor (CUDA graph mode)")
        return dict(q_dtype=q_dt, kv_dtype=kv_dt, o_dtype=o_dt, num_qo_heads=int(num_qo_heads),
                    num_kv_heads=int(num_kv_heads), head_dim=int(head_dim_qk),
                    causal=bool(causal), sm_scale=C.sm_scale_arg(sm_scale), batch=batch,
                    nnz_qo=nnz_qo, qo_indptr=qo_h, split=split)

    def _plan_variant(self, plan, qo_lens, kv_lens, custom_mask, packed_custom_mask,
                      pos_encoding_mode, window_left, logits_soft_cap, rope_scale, rope_theta,
                      extras):
        """Sets plan["variant"] and plan["causal"] (a custom mask replaces causal)."""
        plan["forward_args"] = C.forward_args(
            causal=plan["causal"], pos_encoding_mode=pos_encoding_mode, window_left=window_left,
            logits_soft_cap=logits_soft_cap, sm_scale=plan["sm_scale"], rope_scale=rope_scale,
            rope_theta=rope_theta)
        keep = []
        plan["variant"], plan["causal"] = _variant(
            on_gpu=self._on_gpu, like=self._float_workspace_buffer,
            num_qo_heads=plan["num_qo_heads"], sm_scale=plan["sm_scale"], causal=plan["causal"],
            qo_lens=qo_lens, kv_lens=kv_lens, custom_mask=custom_mask,
            packed_custom_mask=packed_custom_mask, pos_encoding_mode=pos_encoding_mode,
            window_left=window_left, logits_soft_cap=logits_soft_cap, rope_scale=rope_scale,
            rope_theta=rope_theta, extras=_extras(extras), device_only=self._use_cuda_graph,
            mask_bufs=self._mask_bufs, keep=keep)
        plan["window_left"] = -1 if window_left is None else int(window_left)
        if plan["variant"] is not None and KQ.is_format(plan["kv_dtype"]):
            raise NotImplementedError(
                f"kv_data_type={plan['kv_dtype']!r}: attention variants over a quantized format's "
                f"cache are not implemented yet (issue 42): plan plain attention")
        if self._use_cuda_graph:
            self._graph_keep.update((id(x), x) for x in keep)

    def _check_run(self, return_lse, lse, window_left=None):
        C.require_plan(self._plan, window_left)
        V.check_lse_wanted(self._plan["variant"], return_lse or lse is not None)

    def _need(self, batch, nnz_qo, num_qo_heads, head_dim) -> dict:
        """The configuration (OpSlot.acquire's need) of a GPU plan."""
        return dict(max_batch=max(self._fixed_batch_size, batch, 1),
                    max_qo_tokens=max(nnz_qo, 1), num_qo_heads=int(num_qo_heads),
                    head_dim=int(head_dim))

    def _acquire(self, plan):
        return self._slot.acquire(
            self._need(plan["batch"], plan["nnz_qo"], plan["num_qo_heads"], plan["head_dim"]),
            f"batch {plan['batch']}, {plan['nnz_qo']} query tokens, num_qo_heads "
            f"{plan['num_qo_heads']}, head_dim {plan['head_dim']}")

    def _workspace_size(self, qo_indptr, num_qo_heads, head_dim_qk):
        qo = A.host_i32(qo_indptr, "qo_indptr")
        batch = qo.shape[0] - 1
        need = self._need(batch, int(qo[-1]) if batch > 0 else 0, num_qo_heads, head_dim_qk)
        return _workspace.bytes_for(self, self._op_class, need), _workspace.INT_WORKSPACE_BYTES

    def _forward(self, run, return_lse, causal, pos_encoding_mode, window_left,
                 logits_soft_cap, sm_scale, rope_scale, rope_theta):
        """FlashInfer's deprecated forward(): run() with the plan's variant (an argument given
        must be the plan's: ValueError otherwise, naming it)."""
        C.check_forward_args(self._plan, dict(
            causal=causal, pos_encoding_mode=pos_encoding_mode, window_left=window_left,
            logits_soft_cap=logits_soft_cap, sm_scale=sm_scale, rope_scale=rope_scale,
            rope_theta=rope_theta))
        return run(return_lse=return_lse)

    def _check_host_workspace(self, plan):
        """The host path's workspace rule (_common.check_host_workspace), for the configuration
        the GPU path would ask for."""
        need = dict(max_batch=max(plan["batch"], 1), max_qo_tokens=max(plan["nnz_qo"], 1),
                    num_qo_heads=plan["num_qo_heads"], head_dim=plan["head_dim"])
        C.check_host_workspace(
            self._float_workspace_buffer, C.host_workspace_need_bytes(self._op_class, need),
            f"batch {plan['batch']}, {plan['nnz_qo']} query tokens, num_qo_heads "
            f"{plan['num_qo_heads']}, head_dim {plan['head_dim']}")

    def _plan_options(self, plan, disable_split_kv):
        """The _C.PrefillPlanOptions of a GPU plan."""
        return C.make(_C.PrefillPlanOptions, causal=plan["causal"], sm_scale=plan["sm_scale"],
                      enable_cuda_graph=self._use_cuda_graph, fixed_split_size=plan["split"],
                      disable_split_kv=bool(disable_split_kv), tile_rows=self._tile_rows,
                      backend=self._backend)

    def _planned(self, op):
        if self._use_cuda_graph and not self._tile_rows:
            self._tile_rows = op.plan_info().tile_rows

    def _outputs(self, q, out, lse, return_lse):
        return C.run_outputs(self, q, None, out, lse, return_lse)


class BatchPrefillWithPagedKVCacheWrapper(_BatchPrefillBase, C.PagedRun):
    """Batch prefill/append over a paged KV cache with ragged queries (FlashInfer's
    ``flashinfer.BatchPrefillWithPagedKVCacheWrapper``): ``plan()`` per step, ``run()`` per layer.

    The workspace and CUDA-graph rules are those of
    :class:`flashkv.BatchDecodeWithPagedKVCacheWrapper`: a CUDA ``float_workspace_buffer`` runs
    the GPU kernels (the flashkv object is created at plan() inside it, ValueError with the
    needed size if it is too small), a host one the CPU reference. In CUDA graph mode
    (``qo_indptr_buf``, ``paged_kv_indptr_buf``, ``paged_kv_indices_buf``,
    ``paged_kv_last_page_len_buf`` required) the first plan() fixes the query-token capacity (as
    FlashInfer's), heads and head_dim; later plans may have fewer requests or tokens, not more.
    A custom mask in CUDA graph mode needs ``custom_mask_buf`` (uint8) and ``mask_indptr_buf``
    (int32 ``[batch + 1]``): plan() copies the packed mask and its offsets there. ``backend``:
    ``"auto"`` (the Hopper wgmma kernel where it applies: an sm_90a GPU, 128-row query tiles, no
    variant; else mma.sync), ``"fa2"`` (mma.sync) or ``"fa3"`` (wgmma, with 128-row tiles; plan()
    raises where it cannot run, e.g. with a variant). ``plan_info()["wgmma"]`` says which ran,
    ``plan_info()["kv_tma"]`` whether the last run() loaded by TMA (pages of >= 16 tokens).
    """

    _indices_name = "paged_kv_indices"

    _op_class = _C.BatchPrefillPaged

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend="auto", jit_args=None, jit_kwargs=None):
        self._init(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args,
                   jit_kwargs,
                   {"qo_indptr_buf": qo_indptr_buf, "paged_kv_indptr_buf": paged_kv_indptr_buf,
                    "paged_kv_indices_buf": paged_kv_indices_buf,
                    "paged_kv_last_page_len_buf": paged_kv_last_page_len_buf},
                   custom_mask_buf, mask_indptr_buf)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, non_blocking=True, prefix_len_ptr=None,
             token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None,
             seq_lens=None, seq_lens_q=None, block_tables=None, max_token_per_sequence=None,
             max_sequence_kv=None, fixed_split_size=None, disable_split_kv=False,
             **variant_extras):
        """Plan prefill for one step (FlashInfer's arguments).

        Parameters
        ----------
        qo_indptr : array
            int32 ``[batch + 1]``: request i has query rows ``qo_indptr[i]:qo_indptr[i + 1]``.
        paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len : array
            The page table (int32 ``[batch + 1]``, ``[paged_kv_indptr[-1]]``, ``[batch]``).
        num_qo_heads, num_kv_heads : int
            Query and KV heads (GQA: num_qo_heads a multiple of num_kv_heads).
        head_dim_qk : int
            64, 128 or 256 (``head_dim_vo``, if given, must equal it).
        page_size : int
            Tokens per page (>= 1).
        causal : bool
            Causal mask aligned to the end of each request's KV.
        custom_mask, packed_custom_mask : array, optional
            FlashInfer's custom masks (below).
        sm_scale : float, optional
            The logits' scale (default ``1/sqrt(head_dim)``).
        pos_encoding_mode, window_left, logits_soft_cap, rope_scale, rope_theta
            FlashInfer's attention variants (below).
        q_data_type, kv_data_type, o_data_type : dtype or str
            q's dtype (default float16), the cache's (default q's; or fp8), the output's.
        fixed_split_size : int, optional
            KV chunks of this many pages (batch-invariant output).
        disable_split_kv : bool
            Never split a query tile's KV across CTAs.
        **variant_extras
            flashkv's variant extensions (below).

        qo_indptr, paged_kv_indptr ``[batch + 1]``, paged_kv_indices ``[paged_kv_indptr[-1]]``,
        paged_kv_last_page_len ``[batch]``: int32 on the host or the device. ``causal`` aligns to
        the end of each request's KV. ``fixed_split_size`` is in pages (FlashInfer's unit).
        ``use_fp16_qk_reduction``, ``max_token_per_sequence`` and ``max_sequence_kv`` are
        accepted and ignored; ``head_dim_vo != head_dim_qk`` and the multi-item / block-table
        arguments raise NotImplementedError. Variants (compiled into the kernel here; run() takes
        none): FlashInfer's ``pos_encoding_mode``, ``window_left``, ``logits_soft_cap``,
        ``rope_scale``, ``rope_theta``, ``custom_mask``, ``packed_custom_mask``, and the
        keyword-only flashkv extras ``sinks``, ``alibi_slopes``, ``sigmoid``, ``sigmoid_bias``,
        ``low_freq_factor``, ``high_freq_factor``, ``old_context_len``, ``variant``,
        ``variant_args``, ``mask_indptr`` (flashkv.prefill's docstring). Must not be called while
        a CUDA graph is being captured.

        Checks: the same C++ checks on the host and the GPU path (a host wrapper refuses what the
        GPU plan refuses): page_size >= 1, num_qo_heads a multiple of num_kv_heads (a GQA group
        of at most 128), head_dim 64, 128 or 256, one dtype for q, kv and out (float16 or
        bfloat16; a host wrapper also takes float32) or an fp8 ``kv_data_type`` with q and out
        float16 or bfloat16 (module docstring), indptrs from 0 and non-decreasing,
        last_page_len in [1, page_size] for each request with pages, a non-empty host
        workspace. Page ids as :meth:`BatchDecodeWithPagedKVCacheWrapper.plan`: host
        ``paged_kv_indices`` are checked here (>= 0) and their largest against the cache's page
        count at run(), before anything is written (``paged_kv_indices[j] = id is out of range
        [0, num_pages)``); device-resident ones only by the kernel with
        ``FLASHKV_CHECK_DEVICE_ERRORS=1`` (otherwise an out-of-range id reads as zeros).
        """
        C.check_multi_item_scoring(prefix_len_ptr, token_pos_in_items_ptr, max_item_len_ptr)
        C.check_variant(seq_lens=seq_lens,
                        seq_lens_q=seq_lens_q, block_tables=block_tables)
        plan = self._common_plan(qo_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo,
                                 causal, sm_scale, q_data_type, kv_data_type, o_data_type,
                                 fixed_split_size, page_size)
        batch = plan["batch"]
        kv_h = A.host_i32(paged_kv_indptr, "paged_kv_indptr")
        last_h = A.host_i32(paged_kv_last_page_len, "paged_kv_last_page_len")
        plan.update(page_size=int(page_size), indptr=kv_h, last_page_len=last_h)
        if kv_h.shape[0] != batch + 1 or last_h.shape[0] != batch:
            raise ValueError(f"paged_kv_indptr, paged_kv_last_page_len: expected {batch + 1} and "
                             f"{batch} entries (qo_indptr's batch {batch}), got {kv_h.shape[0]} "
                             f"and {last_h.shape[0]}")
        # One C++ check per path (flashkv/plan_checks.h, _common.py): the host path's here, the
        # GPU path's in the op's plan() below; with a host page table also its ids (>= 0; the
        # largest is compared with the cache at run()).
        indices_h = (None if self._on_gpu and A.is_cuda(paged_kv_indices)
                     else A.host_i32(paged_kv_indices, "paged_kv_indices"))
        names = C.page_table_names()
        plan["page_id_max"] = None
        if not self._on_gpu:
            plan["page_id_max"] = A.call(
                _C.check_host_prefill_plan, plan["qo_indptr"], kv_h, last_h, indices_h,
                plan["page_size"], C.attention_shape(plan), names)
        kv_lens = C.host_kv_lens(kv_h, last_h, page_size)
        self._plan_variant(plan, np.diff(plan["qo_indptr"]), kv_lens, custom_mask,
                           packed_custom_mask, pos_encoding_mode, window_left, logits_soft_cap,
                           rope_scale, rope_theta, variant_extras)
        if not self._on_gpu:
            self._check_host_workspace(plan)
            plan["indices"] = indices_h
            self._plan = plan
            return
        op = self._acquire(plan)
        nnz_kv = int(kv_h[-1]) if kv_h.shape[0] > 1 else 0
        if self._use_cuda_graph:
            b = self._buffers
            A.copy_into(b["qo_indptr_buf"], plan["qo_indptr"], batch + 1, "qo_indptr")
            A.copy_into(b["paged_kv_indptr_buf"], kv_h, kv_h.shape[0], "paged_kv_indptr")
            A.copy_into(b["paged_kv_last_page_len_buf"], last_h, last_h.shape[0],
                        "paged_kv_last_page_len")
            A.copy_into(b["paged_kv_indices_buf"], paged_kv_indices[:nnz_kv], nnz_kv,
                        "paged_kv_indices")
            plan.update(indices=b["paged_kv_indices_buf"], run_indptr=b["paged_kv_indptr_buf"],
                        run_last_page_len=b["paged_kv_last_page_len_buf"])
        else:
            plan["indices"] = (A.device_i32(paged_kv_indices) if indices_h is None
                               else A.to_device_like(indices_h, self._float_workspace_buffer))
            plan.update(run_indptr=kv_h, run_last_page_len=last_h)
        A.call(op.plan, plan["qo_indptr"], kv_h, last_h, plan["page_size"],
               C.attention_shape(plan), self._plan_options(plan, disable_split_kv),
               variant=plan["variant"], kv_indices=indices_h, names=names,
               stream=A.cuda_stream(self._float_workspace_buffer))
        self._planned(op)
        self._plan = plan

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, k_group_scale=None,
            v_group_scale=None, k_zero=None, v_zero=None):
        """Prefill attention for the planned batch: q ``[nnz_qo, num_qo_heads, head_dim]``,
        paged_kv_cache a ``(k_cache, v_cache)`` tuple or one ``[num_pages, 2, ...]`` array
        (layouts as the decode wrapper's). Returns out ``[nnz_qo, num_qo_heads, head_dim]``, or
        (out, lse) with ``return_lse``; lse float32 ``[nnz_qo, num_qo_heads]``, **base 2**
        (FlashInfer's convention). Outputs are allocated in q's framework unless given. GPU work
        goes on torch's (or CuPy's) current stream and can be captured in CUDA graph mode. On
        torch CUDA tensors this is the torch custom op ``flashkv::batch_prefill_paged_run``
        (``..._out`` with ``out``/``lse``), which torch.compile captures. A host page id not below
        the cache's page count raises ValueError naming the entry, before anything is written.
        ``k_scale`` / ``v_scale``: an fp8 cache's dequantization scales, as
        :meth:`BatchDecodeWithPagedKVCacheWrapper.run`'s (module docstring), and so are a
        quantized ``kv_data_type``'s ``k_group_scale`` / ``v_group_scale`` / ``k_zero`` /
        ``v_zero`` (:mod:`flashkv.kv_quant`; host wrappers only).
        """
        self._check_run(return_lse, lse, window_left)
        C.check_run_extras(args, q_scale)
        k, v = C.unpack_paged_kv_cache(paged_kv_cache)
        group = KQ.group_scales(self._plan["kv_dtype"], k_group_scale, v_group_scale, k_zero,
                                v_zero)
        scale = C.kv_scales(k_scale, v_scale, k, self._plan["num_kv_heads"], group=group)
        return A.dispatch_run(self, "batch_prefill_paged_run", q, k, v, out, lse, return_lse,
                              scale)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q, paged_kv_cache, causal=C.UNSET, pos_encoding_mode=C.UNSET,
                use_fp16_qk_reduction=False, k_scale=None, v_scale=None, window_left=C.UNSET,
                logits_soft_cap=C.UNSET, sm_scale=C.UNSET, rope_scale=C.UNSET, rope_theta=C.UNSET,
                *, return_lse=False):
        """FlashInfer's deprecated forward(): run() with the plan's variant (a variant argument
        given must be the plan's: ValueError otherwise, naming it)."""
        del use_fp16_qk_reduction
        return self._forward(
            functools.partial(self.run, q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale),
            return_lse, causal, pos_encoding_mode, window_left, logits_soft_cap, sm_scale,
            rope_scale, rope_theta)

    forward_return_lse = functools.partialmethod(forward, return_lse=True)

    def workspace_size(self, qo_indptr, paged_kv_indptr, paged_kv_indices,
                       paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim_qk, page_size,
                       *args, **kwargs):
        """FlashInfer 0.6's workspace query (plan()'s arguments): (float_workspace_size,
        int_workspace_size) in bytes; a float buffer of that size plans without limiting
        split-KV. flashkv needs no int workspace (a nominal 16 bytes). Allocates nothing and
        leaves the plan as it is."""
        del paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_kv_heads, page_size
        del args, kwargs
        return self._workspace_size(qo_indptr, num_qo_heads, head_dim_qk)

    def _reference_run(self, q, k, v, out, lse, scale):
        plan = self._plan
        if plan["variant"] is None:
            A.call(_C.reference_batch_prefill_paged, q, plan["qo_indptr"], k, v, self._kv_layout,
                   plan["indptr"], plan["indices"], plan["last_page_len"], out, lse,
                   plan["causal"], plan["sm_scale"], **scale.kwargs())
        else:
            A.call(_C.reference_batch_prefill_paged_variant, q, plan["qo_indptr"], k, v,
                   self._kv_layout, plan["indptr"], plan["indices"], plan["last_page_len"], out,
                   lse, plan["variant"], **scale.kwargs())


class BatchPrefillWithRaggedKVCacheWrapper(_BatchPrefillBase):
    """Batch prefill with ragged queries over ragged contiguous KV (FlashInfer's
    ``flashinfer.BatchPrefillWithRaggedKVCacheWrapper``): request i owns query rows
    ``qo_indptr[i]:qo_indptr[i+1]`` and KV rows ``kv_indptr[i]:kv_indptr[i+1]``.

    Workspace and CUDA-graph rules as :class:`BatchPrefillWithPagedKVCacheWrapper`
    (``qo_indptr_buf`` and ``kv_indptr_buf`` are required in CUDA graph mode).
    """

    _op_class = _C.BatchPrefillRagged

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None,
                 mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None):
        self._init(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args,
                   jit_kwargs, {"qo_indptr_buf": qo_indptr_buf, "kv_indptr_buf": kv_indptr_buf},
                   custom_mask_buf, mask_indptr_buf)

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk,
             head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
             pos_encoding_mode="NONE", use_fp16_qk_reduction=False, window_left=-1,
             logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True,
             prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0,
             max_item_len_ptr=None, fixed_split_size=None, disable_split_kv=False,
             **variant_extras):
        """Plan ragged prefill (FlashInfer's arguments): qo_indptr and kv_indptr ``[batch + 1]``
        (tokens), int32 on the host or the device. ``fixed_split_size`` is in KV tokens here
        (ragged KV has no pages). Variants as
        :meth:`BatchPrefillWithPagedKVCacheWrapper.plan`'s (flashkv.prefill's docstring), and
        its checks (the same on the host and the GPU path)."""
        C.check_multi_item_scoring(prefix_len_ptr, token_pos_in_items_ptr, max_item_len_ptr)
        plan = self._common_plan(qo_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo,
                                 causal, sm_scale, q_data_type, kv_data_type, o_data_type,
                                 fixed_split_size, 1)
        kv_h = A.host_i32(kv_indptr, "kv_indptr")
        plan["kv_indptr"] = kv_h
        if kv_h.shape[0] != plan["batch"] + 1:
            raise ValueError(f"kv_indptr: expected {plan['batch'] + 1} entries (qo_indptr's "
                             f"batch + 1), got {kv_h.shape[0]}")
        # One C++ check per path (flashkv/plan_checks.h, _common.py): the host path's here, the
        # GPU path's in the op's plan() below.
        names = C.page_table_names(kv_indptr="kv_indptr")
        if not self._on_gpu:
            A.call(_C.check_host_prefill_plan, plan["qo_indptr"], kv_h, None, None, 0,
                   C.attention_shape(plan), names)
        self._plan_variant(plan, np.diff(plan["qo_indptr"]), np.diff(kv_h), custom_mask,
                           packed_custom_mask, pos_encoding_mode, window_left, logits_soft_cap,
                           rope_scale, rope_theta, variant_extras)
        if not self._on_gpu:
            self._check_host_workspace(plan)
            self._plan = plan
            return
        op = self._acquire(plan)
        if self._use_cuda_graph:
            A.copy_into(self._buffers["qo_indptr_buf"], plan["qo_indptr"], plan["batch"] + 1,
                        "qo_indptr")
            A.copy_into(self._buffers["kv_indptr_buf"], kv_h, kv_h.shape[0], "kv_indptr")
        A.call(op.plan, plan["qo_indptr"], kv_h, C.attention_shape(plan),
               self._plan_options(plan, disable_split_kv), variant=plan["variant"], names=names,
               stream=A.cuda_stream(self._float_workspace_buffer))
        self._planned(op)
        self._plan = plan

    begin_forward = plan

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None):
        """Ragged prefill for the planned batch: q ``[nnz_qo, num_qo_heads, head_dim]``; k, v
        ``[nnz_kv, num_kv_heads, head_dim]`` (NHD) or ``[num_kv_heads, nnz_kv, head_dim]`` (HND).
        Returns out, or (out, lse) with ``return_lse``; lse **base 2** (FlashInfer's). On torch
        CUDA tensors: the torch custom op ``flashkv::batch_prefill_ragged_run`` (``..._out``).
        fp8 k, v (a plan with an fp8 ``kv_data_type``): ``k_scale`` / ``v_scale`` dequantize them
        (module docstring)."""
        self._check_run(return_lse, lse)
        C.check_run_extras(args, q_scale)
        scale = C.kv_scales(k_scale, v_scale, k, self._plan["num_kv_heads"])
        return A.dispatch_run(self, "batch_prefill_ragged_run", q, k, v, out, lse, return_lse,
                              scale)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q, k, v, causal=C.UNSET, pos_encoding_mode=C.UNSET,
                use_fp16_qk_reduction=False, window_left=C.UNSET, logits_soft_cap=C.UNSET,
                sm_scale=C.UNSET, rope_scale=C.UNSET, rope_theta=C.UNSET, *, return_lse=False):
        """FlashInfer's deprecated forward(): run() with the plan's variant (a variant argument
        given must be the plan's: ValueError otherwise, naming it)."""
        del use_fp16_qk_reduction
        return self._forward(functools.partial(self.run, q, k, v), return_lse, causal,
                             pos_encoding_mode, window_left, logits_soft_cap, sm_scale,
                             rope_scale, rope_theta)

    forward_return_lse = functools.partialmethod(forward, return_lse=True)

    def workspace_size(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk,
                       *args, **kwargs):
        """FlashInfer 0.6's workspace query (plan()'s arguments): (float_workspace_size,
        int_workspace_size) in bytes, as the paged wrapper's."""
        del kv_indptr, num_kv_heads, args, kwargs
        return self._workspace_size(qo_indptr, num_qo_heads, head_dim_qk)

    def _run(self, q, k, v, out, lse, return_lse, scale=C.NO_SCALE):
        """run() on the planned batch, eager (also the body of the torch custom op); `scale`: the
        KV's _common.KVScale."""
        plan = self._plan
        C.require_plan(plan)
        if self._kv_layout == "HND":
            k, v = A.swap01(k), A.swap01(v)
        out, lse = self._outputs(q, out, lse, return_lse)
        if self._on_gpu:
            A.call(self._slot.op.run, q, k, v, out, lse, A.cuda_stream(q), **scale.kwargs())
        else:
            C.check_planned(q, k, plan, "k")
            if len(k.shape) != 3 or k.shape[1] != plan["num_kv_heads"]:
                raise ValueError(f"k: expected {plan['num_kv_heads']} kv heads (the plan's), got "
                                 f"shape {tuple(k.shape)} ({self._kv_layout})")
            # The GPU kernel takes k/v with more rows than kv_indptr[-1]; the reference wants
            # exactly that many.
            nnz_kv = int(plan["kv_indptr"][-1])
            k, v = k[:nnz_kv], v[:nnz_kv]
            if plan["variant"] is None:
                A.call(_C.reference_batch_prefill_ragged, q, plan["qo_indptr"], k, v,
                       plan["kv_indptr"], out, lse, plan["causal"], plan["sm_scale"],
                       **scale.kwargs())
            elif scale.is_identity:
                A.call(_C.reference_batch_prefill_ragged_variant, q, plan["qo_indptr"], k, v,
                       plan["kv_indptr"], out, lse, plan["variant"])
            else:  # the ragged variant reference takes no scales: the KV as one-token pages
                A.call(_C.reference_batch_prefill_paged_variant, q, plan["qo_indptr"],
                       k[:, None], v[:, None], "NHD", plan["kv_indptr"],
                       np.arange(nnz_kv, dtype=np.int32),
                       np.ones(plan["batch"], np.int32), out, lse, plan["variant"],
                       **scale.kwargs())
        return C.finish(out, lse, return_lse)
