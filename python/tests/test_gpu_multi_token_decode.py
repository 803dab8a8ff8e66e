"""GPU tests: multi-token decode through BatchDecodeWithPagedKVCacheWrapper (q_len_per_req 2-8,
FlashInfer 0.6's speculative-verification decode), eager and in a CUDA graph replayed across
re-plans, fp8 caches too, against torch's float32 SDPA (causal among each request's tokens,
aligned to the end of its KV). Skipped unless torch with CUDA and a GPU are present."""

import numpy as np
import pytest

import flashkv

from conftest import requires_gpu
from gpu_helpers import DTYPES, Paged, check_lse, check_out, gen, rand, sdpa_ref, tdtype, workspace

try:
    import torch
except ImportError:  # the module is skipped (requires_gpu) without torch
    torch = None

pytestmark = requires_gpu
HQ, HK, D = 32, 8, 128


def _check(out, lse, q, cache, n, dtype, scale=1.0):
    for i in range(len(cache.kv_lens)):
        k, v = cache.gather(i)
        ref, ref_lse = sdpa_ref(q[i * n:(i + 1) * n], k.float() * scale, v.float() * scale,
                                causal=True)
        check_out(out[i * n:(i + 1) * n], ref, dtype)
        if lse is not None:
            check_lse(lse[i * n:(i + 1) * n], ref_lse)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_multi_token_decode(dtype, n, layout):
    g = gen(n)
    kv_lens = [n, 1000, 4096, 77, 2500]
    cache = Paged(kv_lens, 16, HK, D, dtype, layout, g)
    q = rand((len(kv_lens) * n, HQ, D), dtype, g)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace(), layout)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, 16,
           q_data_type=tdtype(dtype), q_len_per_req=n)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:2], float("nan"), device="cuda")
    w.run(q, cache.cache(False), out=out, lse=lse)
    torch.cuda.synchronize()
    _check(out, lse, q, cache, n, dtype)


@pytest.mark.parametrize("kv_dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_multi_token_decode_fp8(kv_dtype):
    g = gen(3)
    n, kv_lens = 4, [300, 2049]
    cache = Paged(kv_lens, 16, HK, D, "float16", "NHD", g)
    cache.k, cache.v = cache.k.to(tdtype(kv_dtype)), cache.v.to(tdtype(kv_dtype))
    q = rand((len(kv_lens) * n, HQ, D), "float16", g)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, 16,
           q_data_type=torch.float16, kv_data_type=tdtype(kv_dtype), q_len_per_req=n)
    out = w.run(q, (cache.k, cache.v), k_scale=0.5, v_scale=0.5)
    torch.cuda.synchronize()
    _check(out, None, q, cache, n, "float16", scale=0.5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_multi_token_decode_cuda_graph_across_replans(dtype):
    g = gen(11)
    n, max_batch, ps, num_pages = 4, 6, 16, 900
    kv = rand((num_pages, 2, ps, HK, D), dtype, g)
    bufs = dict(paged_kv_indptr_buffer=torch.zeros(max_batch + 1, dtype=torch.int32,
                                                   device="cuda"),
                paged_kv_indices_buffer=torch.zeros(num_pages, dtype=torch.int32, device="cuda"),
                paged_kv_last_page_len_buffer=torch.zeros(max_batch, dtype=torch.int32,
                                                          device="cuda"))
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace(), use_cuda_graph=True, **bufs)
    q = torch.zeros(max_batch * n, HQ, D, dtype=tdtype(dtype), device="cuda")
    out = torch.zeros_like(q)
    rng = np.random.default_rng(0)

    def plan(kv_lens):
        pages = [(x + ps - 1) // ps for x in kv_lens]
        indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32)
        ids = torch.tensor(rng.permutation(num_pages)[:sum(pages)], dtype=torch.int32)
        last = torch.tensor([x - (p - 1) * ps for x, p in zip(kv_lens, pages)],
                            dtype=torch.int32)
        w.plan(indptr, ids, last, HQ, HK, D, ps, q_data_type=tdtype(dtype), q_len_per_req=n)
        return indptr, ids

    def check(kv_lens, indptr, ids):
        for i, length in enumerate(kv_lens):
            pid = ids[indptr[i]:indptr[i + 1]].long().cuda()
            k = kv[pid, 0].reshape(-1, HK, D)[:length]
            v = kv[pid, 1].reshape(-1, HK, D)[:length]
            ref, _ = sdpa_ref(q[i * n:(i + 1) * n], k, v, causal=True)
            check_out(out[i * n:(i + 1) * n], ref, dtype)

    lens = [500, 4, 3000, 64, 1200, 9000]
    table = plan(lens)
    q.copy_(rand(tuple(q.shape), dtype, g))
    w.run(q, kv, out=out)  # warm-up (kernel compiled) before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, kv, out=out)
    for lens in ([500, 4, 3000, 64, 1200, 9000], [7000, 100, 4, 4, 333, 20], [16, 2048]):
        table = plan(lens)
        q.copy_(rand(tuple(q.shape), dtype, g))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(lens, *table)
    with pytest.raises(ValueError, match="use a wrapper per q_len_per_req"):
        w.plan(table[0], table[1], torch.tensor([16, 16], dtype=torch.int32), HQ, HK, D, ps,
               q_len_per_req=2)
