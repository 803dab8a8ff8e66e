"""GPU tests of CUDA-graph capture and replay across re-plans: decode, paged prefill and the fused
decode step (run_step) captured once with torch.cuda.CUDAGraph, then re-planned (other lengths,
pages and batch sizes) and replayed; every replay matches the reference (run_step's cache equals
the unfused ops' bitwise). Skipped unless torch with CUDA and a GPU are present.
"""

import math

import numpy as np
import pytest

import flashkv

from conftest import requires_gpu
from gpu_helpers import (DTYPES, check_lse, check_out, gen, i32, rand, sdpa_ref, tdtype,
                         unfused_step, workspace)

try:
    import torch
except ImportError:  # the module is skipped (requires_gpu) without torch
    torch = None

pytestmark = requires_gpu


@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_graph_decode_across_replans(dtype):
    """Capture run() once with torch.cuda.CUDAGraph, then re-plan (new lengths, pages and a
    smaller batch) and replay: every replay matches the reference."""
    g = gen(9)
    hq, hk, d, ps, max_batch, num_pages = 32, 8, 128, 16, 8, 600
    kv = rand((num_pages, 2, ps, hk, d), dtype, g)
    indptr_buf = torch.zeros(max_batch + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.zeros(num_pages, dtype=torch.int32, device="cuda")
    last_buf = torch.zeros(max_batch, dtype=torch.int32, device="cuda")
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(
        workspace(), "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr_buf,
        paged_kv_indices_buffer=indices_buf, paged_kv_last_page_len_buffer=last_buf)
    q_static = torch.zeros(max_batch, hq, d, dtype=tdtype(dtype), device="cuda")
    out_static = torch.zeros_like(q_static)
    lse_static = torch.zeros(max_batch, hq, device="cuda")
    rng = np.random.default_rng(0)

    def step(kv_lens):
        pages = [(n + ps - 1) // ps for n in kv_lens]
        indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32)
        indices = torch.tensor(rng.permutation(num_pages)[: sum(pages)], dtype=torch.int32)
        last = torch.tensor([n - (p - 1) * ps if p else 0 for n, p in zip(kv_lens, pages)],
                            dtype=torch.int32)
        w.plan(indptr, indices.cuda(), last, hq, hk, d, ps, q_data_type=tdtype(dtype))
        return indptr, indices, last

    def check(kv_lens, indptr, indices):
        b = len(kv_lens)
        for i in range(b):
            ids = indices[indptr[i]: indptr[i + 1]].long().cuda()
            k = kv[ids, 0].reshape(-1, hk, d)[: kv_lens[i]]
            v = kv[ids, 1].reshape(-1, hk, d)[: kv_lens[i]]
            ref, ref_lse = sdpa_ref(q_static[i:i + 1], k, v)
            check_out(out_static[i], ref[0], dtype)
            check_lse(lse_static[i], ref_lse[0])

    lens = [100, 1, 2000, 17, 0, 640, 33, 5]
    indptr, indices, _ = step(lens)
    q_static.copy_(rand((max_batch, hq, d), dtype, g))
    side = torch.cuda.Stream()  # warm-up off the default stream, as torch recommends
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.run(q_static, kv, out=out_static, lse=lse_static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_static, kv, out=out_static, lse=lse_static)
    graph.replay()
    torch.cuda.synchronize()
    check(lens, indptr, indices)
    for lens in ([3000, 2, 1, 64, 64, 900, 7, 4000], [1, 2, 3], [512] * 8):
        indptr, indices, _ = step(lens)
        q_static.copy_(rand((max_batch, hq, d), dtype, g))
        out_static.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        check(lens, indptr, indices)


def test_cuda_graph_prefill_across_replans():
    """Paged prefill captured once (the first plan fixes the token capacity and the query tile),
    replayed after re-plans with other query splits and KV lengths."""
    g = gen(10)
    hq, hk, d, ps, batch, num_pages, tokens = 32, 8, 128, 16, 4, 400, 64
    kv = rand((num_pages, 2, ps, hk, d), "float16", g)
    bufs = dict(qo_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device="cuda"),
                paged_kv_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device="cuda"),
                paged_kv_indices_buf=torch.zeros(num_pages, dtype=torch.int32, device="cuda"),
                paged_kv_last_page_len_buf=torch.zeros(batch, dtype=torch.int32, device="cuda"))
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", use_cuda_graph=True,
                                                    **bufs)
    q_static = torch.zeros(tokens, hq, d, dtype=torch.float16, device="cuda")
    out_static = torch.zeros_like(q_static)
    rng = np.random.default_rng(1)

    def step(qo_lens, kv_lens):
        pages = [(n + ps - 1) // ps for n in kv_lens]
        qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32)
        indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32)
        indices = torch.tensor(rng.permutation(num_pages)[: sum(pages)], dtype=torch.int32)
        last = torch.tensor([n - (p - 1) * ps if p else 0 for n, p in zip(kv_lens, pages)],
                            dtype=torch.int32)
        w.plan(qo_indptr, indptr, indices.cuda(), last, hq, hk, d, ps, causal=True)
        q_static.copy_(rand((tokens, hq, d), "float16", g))
        return qo_indptr, indptr, indices

    def check(qo_lens, kv_lens, qo_indptr, indptr, indices):
        for i in range(len(qo_lens)):
            rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
            ids = indices[indptr[i]: indptr[i + 1]].long().cuda()
            k = kv[ids, 0].reshape(-1, hk, d)[: kv_lens[i]]
            v = kv[ids, 1].reshape(-1, hk, d)[: kv_lens[i]]
            ref, _ = sdpa_ref(q_static[rows], k, v, causal=True)
            check_out(out_static[rows], ref, "float16")

    qo, kvl = [16, 16, 16, 16], [100, 16, 700, 40]
    state = step(qo, kvl)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.run(q_static, kv, out=out_static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_static, kv, out=out_static)
    graph.replay()
    torch.cuda.synchronize()
    check(qo, kvl, *state)
    for qo, kvl in (([1, 40, 3, 20], [1, 2000, 3, 64]), ([64, 0, 0, 0], [64, 5, 0, 9])):
        state = step(qo, kvl)
        graph.replay()
        torch.cuda.synchronize()
        check(qo, kvl, *state)


def test_run_step_cuda_graph_across_replans():
    """run_step captured once (at max_batch rows), replayed after re-plans: each replay appends
    where its plan says (the cache equals the unfused ops' bitwise) and attends the result."""
    g = gen(17)
    hq, hk, d, ps, max_batch, num_pages = 32, 8, 128, 16, 4, 300
    kv = rand((num_pages, 2, ps, hk, d), "float16", g)
    bufs = dict(paged_kv_indptr_buffer=torch.zeros(max_batch + 1, dtype=torch.int32,
                                                   device="cuda"),
                paged_kv_indices_buffer=torch.zeros(num_pages, dtype=torch.int32, device="cuda"),
                paged_kv_last_page_len_buffer=torch.zeros(max_batch, dtype=torch.int32,
                                                          device="cuda"))
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", use_cuda_graph=True,
                                                   **bufs)
    plain = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace())
    q_s = torch.zeros(max_batch, hq, d, dtype=torch.float16, device="cuda")
    k_s, v_s = (torch.zeros(max_batch, hk, d, dtype=torch.float16, device="cuda")
                for _ in range(2))
    out_s = torch.zeros_like(q_s)
    rng = np.random.default_rng(3)

    def plan(kv_lens):
        pages = [(n + ps - 1) // ps for n in kv_lens]
        indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32)
        indices = torch.tensor(rng.permutation(num_pages)[: sum(pages)], dtype=torch.int32).cuda()
        last = torch.tensor([n - (p - 1) * ps for n, p in zip(kv_lens, pages)], dtype=torch.int32)
        w.plan(indptr, indices, last, hq, hk, d, ps)
        plain.plan(indptr, indices, last, hq, hk, d, ps)
        for x in (q_s, k_s, v_s):
            x.copy_(rand(x.shape, "float16", g))
        return indptr.cuda(), indices, last.cuda()

    plan([5, 17, 300, 1])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.run_step(q_s, k_s, v_s, kv, rope="llama31", out=out_s)  # warm-up (compiles, appends)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run_step(q_s, k_s, v_s, kv, rope="llama31", out=out_s)
    for lens in ([5, 17, 300, 1], [1000, 2, 64], [33, 16, 1, 700]):
        indptr, indices, last = plan(lens)
        b = len(lens)
        expected = kv.clone()
        q_rot, _, _ = unfused_step("llama31", q_s[:b], k_s[:b], v_s[:b], expected,
                                   i32(lens) - 1, i32(lens) - 1, plain, indices, indptr, last,
                                   "NHD", None)
        graph.replay()
        torch.cuda.synchronize()
        flashkv.check_device_errors()
        assert torch.equal(kv, expected)
        for i in range(b):
            ids = indices[indptr[i]: indptr[i + 1]].long()
            k = kv[ids, 0].reshape(-1, hk, d)[: lens[i]]
            v = kv[ids, 1].reshape(-1, hk, d)[: lens[i]]
            ref, _ = sdpa_ref(q_rot[i:i + 1], k, v)
            check_out(out_s[i], ref[0], "float16")
