"""Multi-token decode through BatchDecodeWithPagedKVCacheWrapper (FlashInfer 0.6's
``q_len_per_req``), host path: q ``[batch * n, H, D]``, causal among each request's n tokens and
aligned to the end of its KV, against the float64 NumPy reference; the argument errors; plans
switching between one and several tokens. The GPU path: test_gpu_multi_token_decode.py."""

import numpy as np
import pytest

import flashkv
from conftest import PagedCache, assert_close, assert_lse2, attention_ref, rand, to_fw

WS = np.empty(16, np.uint8)  # a host workspace: the wrappers run the CPU reference
HQ, HK, D, PS = 8, 2, 64, 4


def _reference(cache, q, n):
    outs, lses = [], []
    for i in range(len(cache.kv_lens)):
        k, v = cache.gather(i)
        o, l = attention_ref(q[i * n:(i + 1) * n], k, v, causal=True)
        outs.append(o)
        lses.append(l)
    return np.concatenate(outs), np.concatenate(lses)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_multi_token_decode_matches_reference(fw, n, layout):
    rng = np.random.default_rng(100 + n)
    kv_lens = [n, 9, 30, 17]  # the shortest holds only its n new tokens
    cache = PagedCache(rng, kv_lens, PS, HK, D, np.float16, layout)
    q = rand(rng, (len(kv_lens) * n, HQ, D), np.float16)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(to_fw(WS, fw), layout)
    w.plan(to_fw(cache.indptr, fw), to_fw(cache.indices, fw), to_fw(cache.last_page_len, fw),
           HQ, HK, D, PS, q_len_per_req=n)
    out = to_fw(np.full(q.shape, np.nan, np.float16), fw)
    got, lse = w.run(to_fw(q, fw), cache.cache(False, fw), out=out, return_lse=True)
    ref, ref_lse = _reference(cache, q, n)
    assert_close(got, ref, np.float16)
    assert_lse2(lse, ref_lse)


def test_multi_token_decode_equals_paged_prefill_with_variants():
    """The variants of a decode plan apply per token (window, soft-cap, RoPE at each token's
    causal position): the same as the paged prefill wrapper's causal plan."""
    rng = np.random.default_rng(7)
    n, kv_lens = 3, [12, 25]
    cache = PagedCache(rng, kv_lens, PS, HK, D, np.float16, "NHD")
    q = rand(rng, (len(kv_lens) * n, HQ, D), np.float16)
    variants = dict(pos_encoding_mode="ROPE_LLAMA", window_left=7, logits_soft_cap=20.0)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS, q_len_per_req=n,
           **variants)
    got = w.run(q, (cache.k, cache.v))
    p = flashkv.BatchPrefillWithPagedKVCacheWrapper(WS)
    p.plan(np.arange(3, dtype=np.int32) * n, cache.indptr, cache.indices, cache.last_page_len,
           HQ, HK, D, PS, causal=True, **variants)
    np.testing.assert_array_equal(got, p.run(q, (cache.k, cache.v)))


def test_switching_between_one_and_several_tokens():
    rng = np.random.default_rng(8)
    cache = PagedCache(rng, [10, 6], PS, HK, D, np.float16, "NHD")
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    for n in (1, 4, 1, 2):
        q = rand(rng, (2 * n, HQ, D), np.float16)
        w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS, q_len_per_req=n)
        ref, _ = _reference(cache, q, n)
        assert_close(w.run(q, (cache.k, cache.v)), ref, np.float16)


def test_multi_token_decode_errors():
    rng = np.random.default_rng(9)
    cache = PagedCache(rng, [10, 3], PS, HK, D, np.float16, "NHD")
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    plan = (cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS)
    with pytest.raises(ValueError, match="q_len_per_req: expected >= 1"):
        w.plan(*plan, q_len_per_req=0)
    with pytest.raises(ValueError, match="request 1 has kv_len 3"):
        w.plan(*plan, q_len_per_req=4)
    w.plan(*plan, q_len_per_req=3)
    q = rand(rng, (6, HQ, D), np.float16)
    with pytest.raises(ValueError, match=r"q: expected \[batch \* q_len_per_req = 2 \* 3"):
        w.run(q[:5], (cache.k, cache.v))
    with pytest.raises(ValueError, match="q_len_per_req: 2 differs from the plan's 3"):
        w.run(q, (cache.k, cache.v), q_len_per_req=2)
    with pytest.raises(NotImplementedError, match="q_len_per_req"):
        w.run_step(q, q[:2, :HK], q[:2, :HK], (cache.k, cache.v))
    with pytest.raises(NotImplementedError, match="sinks"):
        w.run(q, (cache.k, cache.v), sinks=np.zeros(HQ, np.float32))
    w.run(q, (cache.k, cache.v), q_len_per_req=3)  # the plan's: accepted
