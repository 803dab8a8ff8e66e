"""The self-sizing workspace on the GPU, through the FlashInfer-shaped wrappers: the buffer sizes
FlashInfer users pass (32 MB for decode, 16 MB for prefill and cascade in FlashInfer's own tests,
128 MB in engines) run every plan, fitting split-KV into what the buffer holds; only a buffer below
the plan arrays' size is refused, naming it. Outputs against a float32 SDPA reference (the
tolerance rule of gpu_helpers.check_out), CUDA-graph replays included."""

import math

import numpy as np
import pytest

import flashkv

from conftest import requires_gpu

try:
    import torch
except ImportError:  # the module is skipped (requires_gpu) without torch
    torch = None

if torch is not None:
    from gpu_helpers import Paged, check_lse, check_out, gen, rand, sdpa_ref, tdtype, workspace

pytestmark = requires_gpu


def _check_decode(w, cache, q, dtype, kv_lens):
    out, lse = w.run(q, cache.cache(False), return_lse=True)
    for i in range(len(kv_lens)):
        ref, ref_lse = sdpa_ref(q[i:i + 1], *cache.gather(i))
        check_out(out[i], ref[0], dtype)
        check_lse(lse[i], ref_lse[0])
    return w.plan_info()


@pytest.mark.parametrize("mb", [32, 16])
@pytest.mark.parametrize("hk", [32, 8])
def test_decode_issue_case_in_flashinfer_buffers(mb, hk):
    """Batch 17, 32 query heads, head_dim 256: flashkv asked for 36312160 bytes and refused 32 MB
    before; now it runs in 32 and 16 MB."""
    g = gen(101)
    hq, d, ps, dtype = 32, 256, 16, "float16"
    rng = np.random.default_rng(5)
    kv_lens = [int(x) for x in rng.integers(1, 3000, 16)] + [20000]
    cache = Paged(kv_lens, ps, hk, d, dtype, "NHD", g)
    q = rand((len(kv_lens), hq, d), dtype, g)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace(mb), "NHD")
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           q_data_type=tdtype(dtype))
    info = _check_decode(w, cache, q, dtype, kv_lens)
    assert 0 < info["num_partial_states"] <= info["slot_capacity"]
    assert info["num_split_tiles"] > 0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("heads_dim", [(32, 32, 64), (32, 8, 128), (32, 2, 128), (8, 1, 256)])
@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_in_a_buffer_too_small_to_split_freely(dtype, heads_dim, page_size):
    """A buffer with room for a few partial states: the plan takes fewer, longer chunks, says so,
    and the output is still right."""
    g = gen(102)
    hq, hk, d = heads_dim
    kv_lens = [12000, 1, 0, 700, 5000, 33]
    cache = Paged(kv_lens, page_size, hk, d, dtype, "NHD", g)
    q = rand((len(kv_lens), hq, d), dtype, g)
    need = flashkv._C.BatchDecode.min_workspace_bytes(max_batch=len(kv_lens), num_qo_heads=hq,
                                                      head_dim=d, device=0)
    # Room for ~12 partial-state rows past the plan arrays of the (power-of-two) config the
    # wrapper asks for (8 requests).
    extra = 12 * (d + 1) * 4 + 4096
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace_bytes(need + extra), "NHD")
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, page_size,
           q_data_type=tdtype(dtype))
    info = _check_decode(w, cache, q, dtype, kv_lens)
    assert info["split_limited"]
    assert info["num_partial_states"] <= info["slot_capacity"]
    # The same plan in 128 MB splits as it likes.
    big = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD")
    big.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, page_size,
             q_data_type=tdtype(dtype))
    assert not big.plan_info()["split_limited"]
    assert big.plan_info()["num_partial_states"] > info["num_partial_states"]


def workspace_bytes(n):
    return torch.empty(int(n), dtype=torch.uint8, device="cuda")


def test_decode_below_the_plan_arrays_is_refused_naming_the_size():
    need = flashkv._C.BatchDecode.min_workspace_bytes(max_batch=4, num_qo_heads=32, head_dim=128,
                                                      device=0)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace_bytes(need // 2))
    ip = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"float_workspace_buffer: \d+ bytes is too small .* "
                                         r"needs at least \d+ bytes"):
        w.plan(ip, ip[:4].cuda(), torch.ones(4, dtype=torch.int32), 32, 8, 128, 16)


def _prefill_paged(w, qo_lens, kv_lens, hq, hk, d, ps, dtype, g, causal=True):
    cache = Paged(kv_lens, ps, hk, d, dtype, "NHD", g)
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32)
    q = rand((sum(qo_lens), hq, d), dtype, g)
    w.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           causal=causal, q_data_type=tdtype(dtype))
    out, lse = w.run(q, cache.cache(False), return_lse=True)
    for i in range(len(qo_lens)):
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        ref, ref_lse = sdpa_ref(q[rows], *cache.gather(i), causal=causal)
        check_out(out[rows], ref, dtype)
        check_lse(lse[rows], ref_lse)
    return w.plan_info()


def test_prefill_twelve_tokens_in_sixteen_megabytes():
    """Paged prefill of 12 query tokens (batch 1, 8 query heads, head_dim 128) needed 34899136
    bytes and was refused in FlashInfer's 16 MB; its need follows its own query tiles now."""
    g = gen(103)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(workspace(16), "NHD")
    info = _prefill_paged(w, [12], [3000], 8, 2, 128, 16, "float16", g)
    assert not info["split_limited"]
    # A long prompt over a long cache in the same buffer, then in a buffer with a few slots.
    info = _prefill_paged(w, [300, 7], [40000, 9000], 32, 8, 128, 16, "bfloat16", g)
    assert info["num_partial_states"] <= info["slot_capacity"]


def test_prefill_ragged_in_a_small_buffer():
    g = gen(104)
    hq, hk, d, dtype = 16, 4, 128, "float16"
    qo_lens, kv_lens = [5, 64], [30000, 2000]
    need = flashkv._C.BatchPrefillRagged.min_workspace_bytes(
        max_batch=2, max_qo_tokens=128, num_qo_heads=hq, head_dim=d, device=0)
    w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(workspace_bytes(need + 64 * 1024), "NHD")
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32)
    kv_indptr = torch.tensor(np.concatenate([[0], np.cumsum(kv_lens)]), dtype=torch.int32)
    q = rand((sum(qo_lens), hq, d), dtype, g)
    k, v = rand((sum(kv_lens), hk, d), dtype, g), rand((sum(kv_lens), hk, d), dtype, g)
    w.plan(qo_indptr, kv_indptr, hq, hk, d, causal=True, q_data_type=tdtype(dtype))
    out = w.run(q, k, v)
    info = w.plan_info()
    assert info["split_limited"] and info["num_partial_states"] <= info["slot_capacity"]
    for i in range(2):
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        kv = slice(int(kv_indptr[i]), int(kv_indptr[i + 1]))
        ref, _ = sdpa_ref(q[rows], k[kv], v[kv], causal=True)
        check_out(out[rows], ref, dtype)


def _shared_prefix_cache(kv_lens, shared, ps, hk, d, dtype, g):
    """A Paged cache whose requests' first `shared` tokens (whole pages) are request 0's pages;
    returns it and the shared page count."""
    cache = Paged(kv_lens, ps, hk, d, dtype, "NHD", g)
    npre = shared // ps
    ids = cache.indices.clone()
    for i in range(1, len(kv_lens)):
        ids[int(cache.indptr[i]): int(cache.indptr[i]) + npre] = ids[:npre]
    cache.indices = ids
    return cache, npre


def test_flashinfer_cascade_in_sixteen_megabytes():
    """FlashInfer's MultiLevelCascadeAttentionWrapper with its tests' 16 MB: the levels share
    the buffer (each a half) and each fits its plan."""
    g = gen(105)
    hq, hk, d, ps, dtype = 8, 2, 128, 16, "float16"
    shared, suffix = 4000, [5, 300, 17]
    kv_lens = [shared + s for s in suffix]
    cache, npre = _shared_prefix_cache(kv_lens, shared, ps, hk, d, dtype, g)
    ids = cache.indices
    b = len(kv_lens)
    qo_lens = [4] * b
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    pages = [(n + ps - 1) // ps for n in kv_lens]
    suf_indptr = [0]
    suf_ids = []
    for i in range(b):
        own = ids[int(cache.indptr[i]) + npre: int(cache.indptr[i + 1])]
        suf_ids.append(own)
        suf_indptr.append(suf_indptr[-1] + own.numel())
    levels = (
        [i32([0, sum(qo_lens)]), i32(np.concatenate([[0], np.cumsum(qo_lens)]))],
        [i32([0, npre]), i32(suf_indptr)],
        [ids[:npre].contiguous(), torch.cat(suf_ids)],
        [i32([ps]), i32([n - (p - 1) * ps for n, p in zip(kv_lens, pages)])])
    w = flashkv.MultiLevelCascadeAttentionWrapper(2, workspace(16), "NHD")
    w.plan(*levels, hq, hk, d, ps, causal=True, q_data_type=tdtype(dtype))
    q = rand((sum(qo_lens), hq, d), dtype, g)
    out = w.run(q, cache.cache(False))
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)])
    for i in range(b):
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        ref, _ = sdpa_ref(q[rows], *cache.gather(i), causal=True)
        check_out(out[rows], ref, dtype)


def test_auto_cascade_in_sixteen_megabytes():
    g = gen(106)
    hq, hk, d, ps, dtype = 32, 8, 128, 16, "float16"
    shared, suffix = 8192, [3, 100, 1000, 7, 55, 2, 64, 9]
    kv_lens = [shared + s for s in suffix]
    cache, _ = _shared_prefix_cache(kv_lens, shared, ps, hk, d, dtype, g)
    q = rand((len(kv_lens), hq, d), dtype, g)
    w = flashkv.MultiLevelCascadeWrapper(workspace(16), "NHD")
    w.plan(None, cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           q_data_type=tdtype(dtype), use_cascade="always")
    out = w.run(q, cache.cache(False))
    assert w.plan_info()["cascade"]
    for i in range(len(kv_lens)):
        ref, _ = sdpa_ref(q[i:i + 1], *cache.gather(i))
        check_out(out[i], ref[0], dtype)


def test_cuda_graph_decode_in_a_small_buffer():
    """Graph mode: the object is sized once, at the first plan, in a buffer with room for a few
    partial states; re-plans (a 30000-token request among short ones) fit their splits into it
    and every replay matches the reference."""
    g = gen(107)
    dtype = "float16"
    hq, hk, d, ps, max_batch, num_pages = 32, 8, 128, 16, 8, 2600
    kv = rand((num_pages, 2, ps, hk, d), dtype, g)
    indptr_buf = torch.zeros(max_batch + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.zeros(num_pages, dtype=torch.int32, device="cuda")
    last_buf = torch.zeros(max_batch, dtype=torch.int32, device="cuda")
    need = flashkv._C.BatchDecode.min_workspace_bytes(max_batch=max_batch, num_qo_heads=hq,
                                                      head_dim=d, device=0)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(
        workspace_bytes(need + 40 * (d + 1) * 4 + 4096), "NHD", use_cuda_graph=True,
        paged_kv_indptr_buffer=indptr_buf, paged_kv_indices_buffer=indices_buf,
        paged_kv_last_page_len_buffer=last_buf)
    q_static = torch.zeros(max_batch, hq, d, dtype=tdtype(dtype), device="cuda")
    out_static = torch.zeros_like(q_static)
    lse_static = torch.zeros(max_batch, hq, device="cuda")
    rng = np.random.default_rng(3)

    def step(kv_lens):
        pages = [(n + ps - 1) // ps for n in kv_lens]
        indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32)
        indices = torch.tensor(rng.permutation(num_pages)[: sum(pages)], dtype=torch.int32)
        last = torch.tensor([n - (p - 1) * ps if p else 0 for n, p in zip(kv_lens, pages)],
                            dtype=torch.int32)
        w.plan(indptr, indices.cuda(), last, hq, hk, d, ps, q_data_type=tdtype(dtype))
        q_static.copy_(rand((max_batch, hq, d), dtype, g))
        out_static.fill_(math.nan)
        return indptr, indices

    def check(kv_lens, indptr, indices):
        for i in range(len(kv_lens)):
            ids = indices[indptr[i]: indptr[i + 1]].long().cuda()
            k = kv[ids, 0].reshape(-1, hk, d)[: kv_lens[i]]
            v = kv[ids, 1].reshape(-1, hk, d)[: kv_lens[i]]
            ref, ref_lse = sdpa_ref(q_static[i:i + 1], k, v)
            check_out(out_static[i], ref[0], dtype)
            check_lse(lse_static[i], ref_lse[0])

    lens = [100, 1, 2000, 17, 0, 640, 33, 5]
    state = step(lens)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.run(q_static, kv, out=out_static, lse=lse_static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_static, kv, out=out_static, lse=lse_static)
    limited = False
    for lens in ([100, 1, 2000, 17, 0, 640, 33, 5], [30000, 2, 1, 64, 900, 7, 4000, 1],
                 [1, 2, 3], [3000] * 8):
        state = step(lens)
        limited = limited or w.plan_info()["split_limited"]
        graph.replay()
        torch.cuda.synchronize()
        check(lens, *state)
    assert limited, "the small buffer never limited a plan"
