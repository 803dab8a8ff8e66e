"""Variable block sparsity per KV head, FlashInfer's ``VariableBlockSparseAttentionWrapper`` API (C++
``flashkv::VariableBlockSparseAttention``, include/flashkv/block_sparse.h).

Each KV head h cuts the query rows into blocks of ``block_row_sz[h]`` rows and the keys into blocks
of ``block_col_sz[h]`` tokens (sizes may differ per head, 0 included; each head's sum is M / N);
block (a, b) is attended where ``block_mask_map[h, a, b]``. The query heads of a KV head share its
pattern (GQA). ``causal`` is by position, aligned to the end of the keys as every flashkv op (key
n visible to query row m iff ``n <= m + N - M``). q ``[num_qo_heads, M, head_dim]`` and k, v
``[num_kv_heads, N, head_dim]`` as FlashInfer lays them out (flashkv also takes token-major
``[M, num_qo_heads, head_dim]`` / ``[N, num_kv_heads, head_dim]`` with ``layout="NHD"``); out like
q; lse float32 ``[num_qo_heads, M]`` (``[M, num_qo_heads]`` for "NHD"), base 2.
``pos_encoding_mode`` "ALIBI" and "ROPE_LLAMA" act at the tokens' own positions.

On the GPU each KV head runs as a batch prefill of its own over strided views (no copy of q, k or
out); a host workspace runs the CPU reference (dense masked attention from the layout).
"""

import numpy as np

from . import _C
from . import _arrays as A
from . import _common as CM
from . import _workspace
from ._sparse_positions import positional
from ._workspace import OpSlot


def _host(x, name, dtype):
    fw = A.framework(x)
    if fw == "torch":
        x = x.detach().to("cpu").numpy()
    elif fw == "cupy":
        x = x.get()
    a = np.asarray(x)
    if a.dtype == np.bool_ and dtype == np.uint8:
        return np.ascontiguousarray(a.view(np.uint8))
    if dtype == np.int32 and a.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected an integer array, got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=dtype)


class VariableBlockSparseAttentionWrapper:
    """FlashInfer's ``VariableBlockSparseAttentionWrapper``: plan() the per-head layout, run()
    attention under it. ``float_workspace_buffer``: a CUDA buffer (ValueError naming the needed size
    if too small) or a host one (the CPU reference). ``layout``: "HND" (FlashInfer's q
    ``[H_qo, M, D]``) or "NHD" (flashkv's ``[M, H_qo, D]``)."""

    def __init__(self, float_workspace_buffer, backend="auto", layout="HND"):
        if backend != "auto":
            raise NotImplementedError(f"backend={backend!r}: flashkv picks its kernel ('auto')")
        _workspace.check_alignment(float_workspace_buffer, "float_workspace_buffer")
        if layout not in ("HND", "NHD"):
            raise ValueError(f"layout: expected 'HND' or 'NHD', got {layout!r}")
        self._layout = layout
        self._float_workspace_buffer = float_workspace_buffer
        self._on_gpu = A.is_cuda(float_workspace_buffer)
        self._device = A.device_index(float_workspace_buffer)
        self._slot = (OpSlot(_C.VariableBlockSparseAttention, float_workspace_buffer, self._device,
                             frozen=False) if self._on_gpu else None)
        self._plan = None

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        """Use another workspace buffer (same side, host or CUDA). Call plan() again."""
        _workspace.reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer)

    def plan(self, block_mask_map, block_row_sz, block_col_sz, num_qo_heads, num_kv_heads,
             head_dim, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
             logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             non_blocking=True, q_data_type="float16", kv_data_type=None, *, sinks=None):
        """block_mask_map bool ``[num_kv_heads, MB, NB]``, block_row_sz int32
        ``[num_kv_heads, MB]``, block_col_sz int32 ``[num_kv_heads, NB]`` (host or device; host
        copies are taken). Bad layouts raise ValueError naming the argument (a shape that is not
        [num_kv_heads, ...], a negative size, a head whose sizes do not sum to the others')."""
        del use_fp16_qk_reduction, non_blocking
        pos = positional(pos_encoding_mode, num_qo_heads, rope_scale, rope_theta, self._on_gpu,
                          self._float_workspace_buffer)
        q_dt, kv_dt, o_dt = CM.plan_dtypes(q_data_type, kv_data_type, None)
        if kv_dt != q_dt and kv_dt not in A.FP8_DTYPES:
            raise ValueError(f"kv_data_type: expected the q dtype {q_dt} (or fp8), got {kv_dt}")
        hk = int(num_kv_heads)
        m = _host(block_mask_map, "block_mask_map", np.uint8)
        rows = _host(block_row_sz, "block_row_sz", np.int32)
        cols = _host(block_col_sz, "block_col_sz", np.int32)
        if m.ndim != 3 or m.shape[0] != hk:
            raise ValueError(f"block_mask_map: expected [num_kv_heads = {hk}, MB, NB], got shape "
                             f"{m.shape}")
        MB, NB = int(m.shape[1]), int(m.shape[2])
        if rows.shape != (hk, MB):
            raise ValueError(f"block_row_sz: expected [num_kv_heads, MB] = {(hk, MB)}, got shape "
                             f"{rows.shape}")
        if cols.shape != (hk, NB):
            raise ValueError(f"block_col_sz: expected [num_kv_heads, NB] = {(hk, NB)}, got shape "
                             f"{cols.shape}")
        M, N = int(rows[0].sum()), int(cols[0].sum())
        rows, cols = rows.reshape(-1), cols.reshape(-1)  # the C++ layout's flat arrays
        if sinks is not None:
            CM.check_same_side(self._on_gpu, self._device, sinks, "sinks")
        # The C++ layout checks (named errors), on both paths; and what the GPU plan needs.
        kv_ids, mask_bytes = _C.variable_block_sparse_needs(m, rows, cols, hk, MB, NB, M, N,
                                                            bool(causal))
        plan = dict(q_dtype=q_dt, kv_dtype=kv_dt, o_dtype=o_dt, num_qo_heads=int(num_qo_heads),
                    num_kv_heads=hk, head_dim=int(head_dim), MB=MB, NB=NB, M=M, N=N, map=m,
                    rows=rows, cols=cols, causal=bool(causal), sm_scale=CM.sm_scale_arg(sm_scale),
                    logits_soft_cap=float(logits_soft_cap or 0.0), sinks=sinks, pos=pos)
        self._plan = None  # a plan() that raises leaves the wrapper unplanned
        what = f"M {M}, N {N}, {hk} KV heads of {MB} x {NB} blocks"
        if not self._on_gpu:
            CM.check_host_workspace(
                self._float_workspace_buffer,
                CM.host_workspace_need_bytes(_C.VariableBlockSparseAttention, {}), what)
            self._plan = plan
            return
        need = dict(max_rows=max(M, 1), max_block_rows=max(MB, 1), max_kv_ids=max(kv_ids, 1),
                    max_mask_bytes=int(mask_bytes), num_qo_heads=plan["num_qo_heads"],
                    num_kv_heads=hk, head_dim=plan["head_dim"])
        op = self._slot.acquire(need, what)
        A.call(op.plan, m, rows, cols, MB, NB, M, N, plan["num_qo_heads"], hk, plan["head_dim"],
               q_dt, kv_dt, plan["causal"], plan["sm_scale"], plan["logits_soft_cap"], sinks, *pos,
               A.cuda_stream(self._float_workspace_buffer))
        self._plan = plan

    def run(self, q, k, v, out=None, lse=None, return_lse=False, enable_pdl=None, *,
            k_scale=None, v_scale=None):
        """q, k, v in the wrapper's layout (see the class). Returns out (like q), or (out, lse)
        with ``return_lse`` (float32, base 2)."""
        del enable_pdl
        plan = self._plan
        CM.require_plan(plan)
        CM.check_same_side(self._on_gpu, self._device, q, "q")
        hm = self._layout == "HND"
        scale = CM.kv_scales(k_scale, v_scale, k, plan["num_kv_heads"])
        M, H = plan["M"], plan["num_qo_heads"]
        if out is None:
            out = A.empty(q, (H, M, plan["head_dim"]) if hm else (M, H, plan["head_dim"]),
                          dtype=plan["o_dtype"])
        want_lse = return_lse or lse is not None
        lse_tok = A.empty(q, (M, H), dtype="f32") if want_lse else None  # [M, H]: the op's
        # The op takes token-major views: FlashInfer's head-major arrays are transposed views.
        tok = A.swap01 if hm else (lambda x: x)
        if self._on_gpu:
            A.call(self._slot.op.run, tok(q), tok(k), tok(v), tok(out), lse_tok, A.cuda_stream(q),
                   **scale.kwargs())
        else:
            # The reference takes contiguous token-major arrays: copies in the caller's framework
            # and dtype (bf16 and fp8 torch tensors included; they reach _C through dl()).
            qt, kt, vt = (A.contiguous(tok(x)) for x in (q, k, v))
            ot = A.empty(qt, qt.shape, dtype=A.array_dtype(out))
            A.call(_C.reference_variable_block_sparse_attention, qt, kt, vt, plan["map"],
                   plan["rows"], plan["cols"], plan["num_kv_heads"], plan["MB"], plan["NB"], M,
                   plan["N"], ot, lse_tok, plan["causal"], plan["sm_scale"],
                   plan["logits_soft_cap"], plan["sinks"], *plan["pos"], **scale.kwargs())
            A.assign(tok(out), ot)
        if lse_tok is None:
            return out
        A.scale_lse_to_base2(lse_tok)
        lse_view = tok(lse_tok)  # [H, M] for HND
        if lse is None:
            lse = lse_view
        else:
            A.assign(lse, lse_view)
        return (out, lse) if return_lse else out

    begin_forward = plan
    forward = run
