"""Multi-token decode: BatchDecodeWithPagedKVCacheWrapper.plan(q_len_per_req = n > 1), FlashInfer
0.6's speculative-verification decode, where each request brings n new query tokens, causal among
themselves and aligned to the end of the KV.

flashkv has no decode kernel for several queries per request; its paged prefill path is the
fastest kernel it has for them (a few query rows per request: the S1 workload, 4 queries per
request over 4096 keys, reads the KV at ~95 % of the read ceiling, NOTES.md "Current numbers").
So the decode wrapper plans a BatchPrefillWithPagedKVCacheWrapper over the same page table with
qo_indptr = n * arange(batch + 1) and causal=True, in the same workspace (only one of the two C++
ops lives in it at a time: switching releases the other), and run() delegates to it. In CUDA graph
mode the prefill wrapper reads the decode wrapper's page-table buffers and a qo_indptr buffer of
its own, and n is fixed by the first plan, as FlashInfer fixes it.
"""

import numpy as np

from . import _arrays as A
from . import _common as C
from .prefill import BatchPrefillWithPagedKVCacheWrapper


def check_q_len(q_len_per_req, wrapper) -> int:
    """q_len_per_req as an int >= 1; in CUDA graph mode the first plan's (ValueError else)."""
    n = int(q_len_per_req)
    if n < 1:
        raise ValueError(f"q_len_per_req: expected >= 1, got {q_len_per_req}")
    if wrapper._use_cuda_graph:
        if wrapper._q_len_per_req is not None and wrapper._q_len_per_req != n:
            raise ValueError(
                f"q_len_per_req: this CUDA-graph wrapper was planned with {wrapper._q_len_per_req}, "
                f"got {n}; it is part of the frozen CUDA-graph shape: use a wrapper per "
                f"q_len_per_req")
        wrapper._q_len_per_req = n
    return n


def _inner(wrapper):
    """The wrapper's paged prefill wrapper, made at its first multi-token plan."""
    if wrapper._multi is None:
        bufs = {}
        if wrapper._use_cuda_graph:
            batch = wrapper._fixed_batch_size
            bufs = dict(qo_indptr_buf=A.empty(wrapper._paged_kv_indptr_buf, (batch + 1,), "i32"),
                        paged_kv_indptr_buf=wrapper._paged_kv_indptr_buf,
                        paged_kv_indices_buf=wrapper._paged_kv_indices_buf,
                        paged_kv_last_page_len_buf=wrapper._paged_kv_last_page_len_buf)
        wrapper._multi = BatchPrefillWithPagedKVCacheWrapper(
            wrapper._float_workspace_buffer, wrapper._kv_layout,
            use_cuda_graph=wrapper._use_cuda_graph, **bufs)
    return wrapper._multi


def leave(wrapper):
    """A one-token plan follows: the prefill op gives the workspace back to the decode op."""
    if wrapper._multi is not None and wrapper._multi._slot is not None:
        wrapper._multi._slot.release()
        wrapper._multi._plan = None


def plan(wrapper, n, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
         page_size, *, pos_encoding_mode, window_left, logits_soft_cap, q_data_type, kv_data_type,
         o_data_type, data_type, sm_scale, rope_scale, rope_theta, fixed_split_size,
         disable_split_kv, **extras):
    """The decode wrapper's plan() for q_len_per_req = n > 1 (the decode plan's arguments)."""
    wrapper._plan = None  # a plan() that raises leaves the wrapper unplanned
    indptr_h = A.host_i32(indptr, "indptr")
    last_h = A.host_i32(last_page_len, "last_page_len")
    batch = indptr_h.shape[0] - 1
    if batch >= 0 and last_h.shape[0] == batch:
        kv_lens = C.host_kv_lens(indptr_h, last_h, page_size)
        short = np.flatnonzero(kv_lens < n)
        if short.size:
            raise ValueError(
                f"q_len_per_req={n} requires kv_len >= q_len_per_req for every request (the new "
                f"tokens are in the cache); request {int(short[0])} has kv_len "
                f"{int(kv_lens[short[0]])}: its first tokens would attend to an empty KV range")
    if data_type is not None:  # FlashInfer's deprecated spelling for q and kv at once
        q_data_type = data_type if q_data_type is None else q_data_type
        kv_data_type = data_type if kv_data_type is None else kv_data_type
    if wrapper._slot is not None:
        wrapper._slot.release()  # the prefill op takes the workspace
    inner = _inner(wrapper)
    qo_indptr = np.arange(batch + 1, dtype=np.int32) * n
    inner.plan(qo_indptr, indptr_h, indices, last_h, num_qo_heads, num_kv_heads, head_dim,
               page_size, causal=True, pos_encoding_mode=pos_encoding_mode,
               window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
               rope_scale=rope_scale, rope_theta=rope_theta, q_data_type=q_data_type,
               kv_data_type=kv_data_type, o_data_type=o_data_type,
               fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv, **extras)
    p = inner._plan
    wrapper._plan = dict(q_len_per_req=n, batch=batch, num_qo_heads=p["num_qo_heads"],
                         num_kv_heads=p["num_kv_heads"], head_dim=p["head_dim"],
                         window_left=p["window_left"], variant=p["variant"], rope=False,
                         page_size=int(page_size))


def run(wrapper, q, paged_kv_cache, args, q_len_per_req, **kw):
    """The decode wrapper's run() for a multi-token plan: q [batch * n, num_qo_heads, head_dim]."""
    plan = wrapper._plan
    n = plan.get("q_len_per_req", 1)
    if q_len_per_req is not None and int(q_len_per_req) != n:
        raise ValueError(f"q_len_per_req: {q_len_per_req} differs from the plan's {n}; pass it "
                         f"to plan()")
    rows = plan["batch"] * n
    if len(q.shape) != 3 or int(q.shape[0]) != rows:
        raise ValueError(f"q: expected [batch * q_len_per_req = {plan['batch']} * {n}, "
                         f"num_qo_heads, head_dim], got shape {tuple(q.shape)}")
    return wrapper._multi.run(q, paged_kv_cache, *args, **kw)
