"""GPU tests of FlashInfer 0.6's workspace API (issue 43): workspace_size() gives the bytes a
plan needs, a buffer of exactly that size plans and runs right (eager and CUDA graph mode,
fixed split-KV), unaligned buffers are refused naming the buffer; forward_return_lse on the
GPU. Skipped unless torch with CUDA and a GPU are present."""

import pytest

import flashkv

from conftest import requires_gpu
from gpu_helpers import Paged, check_out, gen, rand, sdpa_ref

try:
    import torch
except ImportError:  # the module is skipped (requires_gpu) without torch
    torch = None

pytestmark = requires_gpu
HQ, HK, D, PS = 16, 4, 128, 16


def _bytes(n):
    return torch.empty(n, dtype=torch.uint8, device="cuda")


def _unaligned(n):
    return torch.empty(n + 1, dtype=torch.uint8, device="cuda")[1:]


def _graph_bufs(cache, batch, prefill):
    names = (("paged_kv_indptr_buf", "paged_kv_indices_buf", "paged_kv_last_page_len_buf")
             if prefill else ("paged_kv_indptr_buffer", "paged_kv_indices_buffer",
                              "paged_kv_last_page_len_buffer"))
    sizes = (batch + 1, int(cache.indices.shape[0]), batch)
    bufs = {n: torch.empty(s, dtype=torch.int32, device="cuda") for n, s in zip(names, sizes)}
    if prefill:
        bufs["qo_indptr_buf"] = torch.empty(batch + 1, dtype=torch.int32, device="cuda")
    return dict(use_cuda_graph=True, **bufs)


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("fixed_split_size", [None, 8])
def test_decode_plans_with_the_exact_workspace(graph, fixed_split_size):
    g = gen(1)
    lens = [4096, 100, 3000, 17]
    cache = Paged(lens, PS, HK, D, "float16", "NHD", g)
    q = rand((len(lens), HQ, D), "float16", g)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(
        _bytes(32 << 20), **(_graph_bufs(cache, len(lens), False) if graph else {}))
    args = (cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS)
    f, i = w.workspace_size(*args, q_data_type=torch.float16, fixed_split_size=fixed_split_size)
    assert f > 0 and i > 0
    w.reset_workspace_buffer(_bytes(f), _bytes(i))
    w.plan(*args, q_data_type=torch.float16, fixed_split_size=fixed_split_size)
    assert not w.plan_info()["split_limited"]
    out = w.run(q, cache.cache(False))
    torch.cuda.synchronize()
    for r in range(len(lens)):
        k, v = cache.gather(r)
        ref, _ = sdpa_ref(q[r:r + 1], k, v)
        check_out(out[r], ref[0], "float16")


@pytest.mark.parametrize("mode", ["eager", "graph", "fixed_split"])
def test_prefill_plans_with_the_exact_workspace(mode):
    g = gen(2)
    lens, qo = [1024, 700, 64], 64
    cache = Paged(lens, PS, HK, D, "bfloat16", "NHD", g)
    qo_indptr = torch.arange(len(lens) + 1, dtype=torch.int32) * qo
    q = rand((qo * len(lens), HQ, D), "bfloat16", g)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(
        _bytes(32 << 20), backend="fa2",
        **(_graph_bufs(cache, len(lens), True) if mode == "graph" else {}))
    extra = dict(fixed_split_size=16, disable_split_kv=False) if mode == "fixed_split" else {}
    args = (qo_indptr, cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS)
    f, i = w.workspace_size(*args, **extra)
    w.reset_workspace_buffer(_bytes(f), _bytes(i))
    w.plan(*args, causal=True, q_data_type=torch.bfloat16, **extra)
    out, lse = w.forward_return_lse(q, cache.cache(False))
    torch.cuda.synchronize()
    for r in range(len(lens)):
        k, v = cache.gather(r)
        ref, _ = sdpa_ref(q[r * qo:(r + 1) * qo], k, v, causal=True)
        check_out(out[r * qo:(r + 1) * qo], ref, "bfloat16")


def test_ragged_plans_with_the_exact_workspace():
    g = gen(3)
    qo_indptr = torch.tensor([0, 5, 133], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 300, 1324], dtype=torch.int32)
    q = rand((133, HQ, D), "float16", g)
    k, v = rand((1324, HK, D), "float16", g), rand((1324, HK, D), "float16", g)
    w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(_bytes(16 << 20))
    f, i = w.workspace_size(qo_indptr, kv_indptr, HQ, HK, D)
    w.reset_workspace_buffer(_bytes(f), _bytes(i))
    w.plan(qo_indptr, kv_indptr, HQ, HK, D, causal=True)
    out = w.run(q, k, v)
    torch.cuda.synchronize()
    for a, b, c, e in ((0, 5, 0, 300), (5, 133, 300, 1324)):
        ref, _ = sdpa_ref(q[a:b], k[c:e], v[c:e], causal=True)
        check_out(out[a:b], ref, "float16")


def test_unaligned_workspaces_are_refused():
    with pytest.raises(ValueError, match="float_workspace_buffer must be 16-byte aligned"):
        flashkv.BatchPrefillWithPagedKVCacheWrapper(_unaligned(32 << 20), backend="fa2")
    with pytest.raises(ValueError, match="float_workspace_buffer must be 16-byte aligned"):
        flashkv.BatchDecodeWithPagedKVCacheWrapper(_unaligned(32 << 20))
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(_bytes(32 << 20))
    with pytest.raises(ValueError, match="float_workspace_buffer must be 16-byte aligned"):
        w.reset_workspace_buffer(_unaligned(1024), _bytes(1024))
    with pytest.raises(ValueError, match="int_workspace_buffer must be 16-byte aligned"):
        w.reset_workspace_buffer(_bytes(1024), _unaligned(1024))
