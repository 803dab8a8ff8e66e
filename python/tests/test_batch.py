"""The batch wrappers with a host workspace (CPU reference) against the float64 NumPy reference:
paged NHD/HND, (k, v) tuples and interleaved caches, GQA, causal and not, page sizes 1, 5, 16,
empty requests, re-planning."""

import numpy as np
import pytest

import flashkv
from conftest import PagedCache, assert_close, assert_lse2, attention_ref, rand, to_fw

WORKSPACE = np.empty(16, np.uint8)  # a host buffer: the wrappers run the CPU reference


def ragged(rng, lens, heads, d, dtype):
    return rand(rng, (sum(lens), heads, d), dtype), np.concatenate([[0], np.cumsum(lens)]).astype(
        np.int32)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("page_size", [1, 5, 16])
def test_batch_decode(fw, dtype, layout, interleaved, page_size):
    rng = np.random.default_rng(10)
    hq, hk, d = 8, 2, 64
    kv_lens = [1, 0, 37, page_size, 16, 3]  # 0: an empty request
    cache = PagedCache(rng, kv_lens, page_size, hk, d, dtype, layout)
    q = rand(rng, (len(kv_lens), hq, d), dtype)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, layout)
    w.plan(to_fw(cache.indptr, fw), to_fw(cache.indices, fw), to_fw(cache.last_page_len, fw), hq,
           hk, d, page_size, q_data_type=q.dtype)
    out, lse = w.run(to_fw(q, fw), cache.cache(interleaved, fw), return_lse=True)
    assert tuple(out.shape) == (len(kv_lens), hq, d) and tuple(lse.shape) == (len(kv_lens), hq)
    for i in range(len(kv_lens)):
        k, v = cache.gather(i)
        ref, ref_lse = attention_ref(q[i:i + 1], k, v)
        assert_close(out[i], ref[0], dtype)
        assert_lse2(lse[i], ref_lse[0])


def test_batch_decode_replan_and_out():
    """One wrapper, several plans (growing and shrinking batches), outputs written into out=."""
    rng = np.random.default_rng(11)
    hq, hk, d, ps = 4, 4, 64, 16
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    for kv_lens in ([5, 70], [1, 2, 3, 4, 100], [33]):
        cache = PagedCache(rng, kv_lens, ps, hk, d, np.float16, "NHD")
        q = rand(rng, (len(kv_lens), hq, d), np.float16)
        w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps, sm_scale=0.2)
        out = np.empty_like(q)
        assert w.run(q, (cache.k, cache.v), out=out) is out
        for i in range(len(kv_lens)):
            ref, _ = attention_ref(q[i:i + 1], *cache.gather(i), sm_scale=0.2)
            assert_close(out[i], ref[0], np.float16)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_batch_prefill_paged(fw, dtype, layout, interleaved, causal):
    rng = np.random.default_rng(12)
    hq, hk, d, ps = 8, 2, 64, 5
    qo_lens = [3, 0, 17, 1, 6]  # 0: a request with no queries
    kv_lens = [3, 12, 40, 0, 2]  # kv 0: queries that see nothing; kv < qo: causal rows see none
    cache = PagedCache(rng, kv_lens, ps, hk, d, dtype, layout)
    q, qo_indptr = ragged(rng, qo_lens, hq, d, dtype)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, layout)
    w.plan(to_fw(qo_indptr, fw), cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           causal=causal, q_data_type=q.dtype)
    out, lse = w.run(to_fw(q, fw), cache.cache(interleaved, fw), return_lse=True)
    for i in range(len(qo_lens)):
        rows = slice(qo_indptr[i], qo_indptr[i + 1])
        ref, ref_lse = attention_ref(q[rows], *cache.gather(i), causal=causal)
        assert_close(out[rows], ref, dtype)
        assert_lse2(lse[rows], ref_lse)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [False, True])
def test_batch_prefill_ragged(fw, dtype, layout, causal):
    rng = np.random.default_rng(13)
    hq, hk, d = 6, 3, 64
    qo_lens, kv_lens = [4, 1, 0, 9], [4, 30, 5, 2]
    q, qo_indptr = ragged(rng, qo_lens, hq, d, dtype)
    k, kv_indptr = ragged(rng, kv_lens, hk, d, dtype)
    v = rand(rng, k.shape, dtype)
    w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE, layout)
    w.plan(qo_indptr, to_fw(kv_indptr, fw), hq, hk, d, causal=causal, q_data_type=q.dtype)
    as_layout = (lambda x: x) if layout == "NHD" else (lambda x: np.ascontiguousarray(
        x.transpose(1, 0, 2)))
    out, lse = w.run(to_fw(q, fw), to_fw(as_layout(k), fw), to_fw(as_layout(v), fw),
                     return_lse=True)
    for i in range(len(qo_lens)):
        rows, kv = slice(qo_indptr[i], qo_indptr[i + 1]), slice(kv_indptr[i], kv_indptr[i + 1])
        ref, ref_lse = attention_ref(q[rows], k[kv], v[kv], causal=causal)
        assert_close(out[rows], ref, dtype)
        assert_lse2(lse[rows], ref_lse)


def test_decode_equals_prefill_with_one_query():
    """Decode is prefill with one query per request: the two wrappers agree bit for bit (both run
    the same double-precision reference)."""
    rng = np.random.default_rng(14)
    hq, hk, d, ps = 8, 8, 128, 16
    kv_lens = [50, 7, 16]
    cache = PagedCache(rng, kv_lens, ps, hk, d, np.float16, "NHD")
    q = rand(rng, (3, hq, d), np.float16)
    dec = flashkv.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    dec.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps)
    pre = flashkv.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE)
    pre.plan(np.arange(4, dtype=np.int32), cache.indptr, cache.indices, cache.last_page_len, hq,
             hk, d, ps, causal=True)
    a, la = dec.run_return_lse(q, cache.kv)
    b, lb = pre.run_return_lse(q, cache.kv)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)
