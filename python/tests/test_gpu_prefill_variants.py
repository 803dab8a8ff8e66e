"""GPU tests of attention variants in the prefill functions: BatchPrefillWithPagedKVCacheWrapper,
BatchPrefillWithRaggedKVCacheWrapper and single_prefill_with_kv_cache with causal + window_left,
logits_soft_cap, a random non-causal custom_mask (and packed_custom_mask), sinks,
pos_encoding_mode ROPE_LLAMA and a user variant (flashkv.Variant: a T5 relative position bias)
against float32 torch references written here. Skipped unless torch with CUDA and a GPU are
present (FLASHKV_REQUIRE_GPU=1 makes that an error).

Tolerance (tests/common/test_util.h): rel_err(out, ref) <= min(2 * rel_err(ref rounded to the
dtype, ref) + u, 1e-2), u the unit roundoff of the dtype; LSE relative error <= 1e-4.
"""

import math

import numpy as np
import pytest

import flashkv
from conftest import requires_gpu
from test_gpu_variants import PAGE, T5, check_lse, check_out, paged, rope

try:
    import torch
except ImportError:
    torch = None

pytestmark = requires_gpu

QO_LENS = [1, 17, 128, 300]
KV_LENS = [5, 60, 128, 1100]  # 1100: split across CTAs, so partial states merge


def prefill_ref(q, k, v, dtype, causal=False, sm_scale=None, window_left=-1, cap=0.0,
                sinks=None, theta=None, t5_bias=None, mask=None):
    """float32 prefill of one request: q [Lq, Hq, D], k, v [Lk, Hk, D], mask bool [Lq, Lk]; query
    i at position Lk - Lq + i. -> (out [Lq, Hq, D], natural lse [Lq, Hq])."""
    lq, hq, d = q.shape
    lk = k.shape[0]
    dev = q.device
    qpos = lk - lq + torch.arange(lq, device=dev)
    j = torch.arange(lk, device=dev)
    q, k, v = q.float(), k.float(), v.float()
    if theta is not None:
        q = rope(q, qpos, theta, dtype)
        k = rope(k, j, theta, dtype)
    group = hq // k.shape[1]
    kk, vv = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->qhk", q, kk) * (1 / math.sqrt(d) if sm_scale is None else sm_scale)
    if t5_bias is not None:
        rel = (qpos[:, None] - j[None, :]).clamp(0, t5_bias.shape[0] - 1)
        s = s + t5_bias[rel][:, None, :]
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    keep = torch.ones((lq, lk), dtype=torch.bool, device=dev)
    if causal:
        keep &= j[None, :] <= qpos[:, None]
    if window_left >= 0:
        keep &= j[None, :] >= qpos[:, None] - window_left
    if mask is not None:
        keep &= mask
    s = s.masked_fill(~keep[:, None, :], -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.float()[None, :, None].expand(lq, hq, 1)], dim=2)
        vv = torch.cat([vv, torch.zeros_like(vv[:1])], dim=0)
    lse = torch.logsumexp(s, dim=2)
    return torch.einsum("qhk,khd->qhd", torch.exp(s - lse[..., None]), vv), lse


def random_masks(qo_lens, kv_lens, seed):
    """Random non-causal bool masks (column 0 kept, so no row is empty) and their flat form."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    masks = []
    for a, b in zip(qo_lens, kv_lens):
        m = torch.rand((a, b), generator=g, device="cuda") < 0.5
        m[:, 0] = True
        masks.append(m)
    return masks, torch.cat([m.reshape(-1) for m in masks])


def cases(hq, qo_lens, kv_lens):
    g = torch.Generator(device="cuda").manual_seed(3)
    sinks = torch.rand(hq, generator=g, device="cuda") * 4 - 1
    bias = torch.sin(torch.arange(32, device="cuda") * 0.7) * 0.5 - 0.08 * torch.arange(
        32, device="cuda")
    masks, flat = random_masks(qo_lens, kv_lens, 5)
    packed = torch.from_numpy(np.concatenate([
        np.packbits(m.cpu().numpy().reshape(-1), bitorder="little") for m in masks])).cuda()
    return {  # id: (plan kwargs, reference kwargs; "mask": one per request)
        "causal_window_left": (dict(causal=True, window_left=40),
                               dict(causal=True, window_left=40)),
        "logits_soft_cap": (dict(causal=True, logits_soft_cap=1.0, sm_scale=0.5),
                            dict(causal=True, cap=1.0, sm_scale=0.5)),
        "custom_mask": (dict(custom_mask=flat), dict(mask=masks)),
        "packed_custom_mask": (dict(packed_custom_mask=packed), dict(mask=masks)),
        "sinks": (dict(causal=True, sinks=sinks), dict(causal=True, sinks=sinks)),
        "rope_llama": (dict(causal=True, pos_encoding_mode="ROPE_LLAMA"),
                       dict(causal=True, theta=1e4)),
        "user_t5": (dict(causal=True, variant=T5,
                         variant_args={"num_buckets": 32, "bias": bias.float()}),
                    dict(causal=True, t5_bias=bias.float())),
    }


CASE_IDS = ["causal_window_left", "logits_soft_cap", "custom_mask", "packed_custom_mask",
            "sinks", "rope_llama", "user_t5"]


def _ref_kw(ref_kw, i):
    kw = dict(ref_kw)
    if "mask" in kw:
        kw["mask"] = kw["mask"][i]
    return kw


def _check_rows(out, lse, q, qo_indptr, gather, dtype, ref_kw):
    for i in range(len(qo_indptr) - 1):
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        ki, vi = gather(i)
        ref, ref_lse = prefill_ref(q[rows], ki, vi, dtype, **_ref_kw(ref_kw, i))
        check_out(out[rows], ref, dtype)
        check_lse(lse[rows], ref_lse)


def _workspace():
    return torch.empty(128 << 20, dtype=torch.uint8, device="cuda")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("heads_dim", [(32, 8, 128), (8, 8, 64)])
@pytest.mark.parametrize("case", CASE_IDS)
def test_batch_prefill_paged_variant(case, heads_dim, dtype):
    hq, hk, d = heads_dim
    g = torch.Generator(device="cuda").manual_seed(21)
    indptr, indices, last, k, v, gather = paged(KV_LENS, hk, d, dtype, g)
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(QO_LENS)]), dtype=torch.int32,
                             device="cuda")
    q = (torch.rand((sum(QO_LENS), hq, d), generator=g, device="cuda") * 2 - 1).to(
        getattr(torch, dtype))
    plan_kw, ref_kw = cases(hq, QO_LENS, KV_LENS)[case]
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(_workspace())
    w.plan(qo_indptr, indptr, indices, last, hq, hk, d, PAGE, q_data_type=getattr(torch, dtype),
           **plan_kw)
    out, lse = w.run(q, (k, v), return_lse=True)
    _check_rows(out, lse, q, qo_indptr.tolist(), gather, dtype, ref_kw)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("case", CASE_IDS)
def test_batch_prefill_ragged_variant(case, layout, dtype):
    hq, hk, d = 32, 8, 128
    g = torch.Generator(device="cuda").manual_seed(22)
    qo_indptr = np.concatenate([[0], np.cumsum(QO_LENS)]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(KV_LENS)]).astype(np.int32)
    tdt = getattr(torch, dtype)
    q = (torch.rand((int(qo_indptr[-1]), hq, d), generator=g, device="cuda") * 2 - 1).to(tdt)
    k, v = ((torch.rand((int(kv_indptr[-1]), hk, d), generator=g, device="cuda") * 2 - 1).to(tdt)
            for _ in range(2))
    kl, vl = (k, v) if layout == "NHD" else (k.transpose(0, 1).contiguous(),
                                             v.transpose(0, 1).contiguous())
    plan_kw, ref_kw = cases(hq, QO_LENS, KV_LENS)[case]
    w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(_workspace(), layout)
    w.plan(torch.from_numpy(qo_indptr).cuda(), torch.from_numpy(kv_indptr).cuda(), hq, hk, d,
           q_data_type=tdt, **plan_kw)
    out, lse = w.run(q, kl, vl, return_lse=True)

    def gather(i):
        s = slice(int(kv_indptr[i]), int(kv_indptr[i + 1]))
        return k[s], v[s]

    _check_rows(out, lse, q, qo_indptr, gather, dtype, ref_kw)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("case", CASE_IDS)
def test_single_prefill_variant(case, layout):
    dtype, hq, hk, d, qo, kv = "float16", 32, 8, 128, 200, 515
    g = torch.Generator(device="cuda").manual_seed(23)
    q, k, v = ((torch.rand(s, generator=g, device="cuda") * 2 - 1).half()
               for s in ((qo, hq, d), (kv, hk, d), (kv, hk, d)))
    plan_kw, ref_kw = cases(hq, [qo], [kv])[case]
    if "custom_mask" in plan_kw:  # one [qo_len, kv_len] mask
        plan_kw = dict(plan_kw, custom_mask=ref_kw["mask"][0])
    kl, vl = (k, v) if layout == "NHD" else (k.transpose(0, 1).contiguous(),
                                             v.transpose(0, 1).contiguous())
    out, lse = flashkv.single_prefill_with_kv_cache(q, kl, vl, kv_layout=layout,
                                                    return_lse=True, **plan_kw)
    ref, ref_lse = prefill_ref(q, k, v, dtype, **_ref_kw(ref_kw, 0))
    check_out(out, ref, dtype)
    check_lse(lse, ref_lse)


def test_custom_mask_in_cuda_graph_mode_is_refilled_by_plan():
    """In CUDA graph mode the packed mask goes into custom_mask_buf / mask_indptr_buf: a graph
    captured under one plan replays with the next plan's mask."""
    hq, hk, d = 8, 2, 128
    qo_lens, kv_lens = [7, 30], [40, 30]
    g = torch.Generator(device="cuda").manual_seed(24)
    indptr, indices, last, k, v, gather = paged(kv_lens, hk, d, "float16", g)
    qo_indptr = torch.tensor([0, 7, 37], dtype=torch.int32, device="cuda")
    q = (torch.rand((37, hq, d), generator=g, device="cuda") * 2 - 1).half()
    i32 = dict(dtype=torch.int32, device="cuda")
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(
        _workspace(), use_cuda_graph=True, qo_indptr_buf=torch.zeros(3, **i32),
        paged_kv_indptr_buf=torch.zeros(3, **i32), paged_kv_indices_buf=torch.zeros(16, **i32),
        paged_kv_last_page_len_buf=torch.zeros(2, **i32),
        custom_mask_buf=torch.zeros(1024, dtype=torch.uint8, device="cuda"),
        mask_indptr_buf=torch.zeros(3, **i32))
    masks_a, flat_a = random_masks(qo_lens, kv_lens, 6)
    masks_b, flat_b = random_masks(qo_lens, kv_lens, 7)
    w.plan(qo_indptr, indptr, indices, last, hq, hk, d, PAGE, custom_mask=flat_a)
    out = torch.empty_like(q)
    lse = torch.empty((37, hq), device="cuda")
    w.run(q, (k, v), out=out, lse=lse)  # warm-up (JIT) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, (k, v), out=out, lse=lse)
    w.plan(qo_indptr, indptr, indices, last, hq, hk, d, PAGE, custom_mask=flat_b)
    graph.replay()
    torch.cuda.synchronize()
    _check_rows(out, lse, q, qo_indptr.tolist(), gather, "float16", dict(mask=masks_b))
