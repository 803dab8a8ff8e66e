"""FlashInfer 0.6 API pieces that need no new kernel, host path (issue 43): the deprecated
forward() / forward_return_lse(), workspace_size() and 16-byte workspace alignment,
fast_decode_plan, get_batch_indices_positions' output arguments, o_data_type refusals. The GPU
half (exact-size workspaces plan and run): test_gpu_flashinfer_api.py."""

import functools

import numpy as np
import pytest

import flashkv
from conftest import PagedCache, rand
from flashkv.decode import fast_decode_plan

WS = np.empty(64, np.uint8)
HQ, HK, D, PS = 4, 2, 64, 4


def _unaligned(n):
    buf = np.empty(n + 16, np.uint8)
    off = (-buf.ctypes.data) % 16 + 1  # 1 byte past a 16-byte boundary
    return buf[off:off + n]


def _decode(rng):
    cache = PagedCache(rng, [9, 20], PS, HK, D, np.float16, "NHD")
    q = rand(rng, (2, HQ, D), np.float16)
    return cache, q


def test_decode_forward_return_lse_is_run_with_lse():
    rng = np.random.default_rng(1)
    cache, q = _decode(rng)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.begin_forward(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS,
                    logits_soft_cap=30.0)
    out, lse = w.run(q, (cache.k, cache.v), return_lse=True)
    out2, lse2 = w.forward_return_lse(q, (cache.k, cache.v), logits_soft_cap=30.0)
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(lse, lse2)
    np.testing.assert_array_equal(w.forward(q, (cache.k, cache.v)), out)
    with pytest.raises(ValueError, match="logits_soft_cap=0.0: forward.. runs the plan"):
        w.forward(q, (cache.k, cache.v), logits_soft_cap=None)
    with pytest.raises(ValueError, match="window_left=4"):
        w.forward_return_lse(q, (cache.k, cache.v), window_left=4)


@pytest.mark.parametrize("causal", [False, True])
def test_prefill_forward_return_lse_is_run_with_lse(causal):
    rng = np.random.default_rng(2)
    cache = PagedCache(rng, [9, 20], PS, HK, D, np.float16, "NHD")
    q = rand(rng, (7, HQ, D), np.float16)
    qo = np.array([0, 3, 7], np.int32)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(WS)
    w.plan(qo, cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS, causal=causal)
    out, lse = w.run(q, (cache.k, cache.v), return_lse=True)
    out2, lse2 = w.forward_return_lse(q, (cache.k, cache.v))
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(lse, lse2)
    with pytest.raises(ValueError, match=f"causal={not causal}: forward.. runs the plan"):
        w.forward(q, (cache.k, cache.v), causal=not causal)
    k = rand(rng, (29, HK, D), np.float16)
    r = flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS)
    r.plan(qo, np.array([0, 9, 29], np.int32), HQ, HK, D, causal=causal, sm_scale=0.1)
    out, lse = r.run(q, k, k, return_lse=True)
    out2, lse2 = r.forward_return_lse(q, k, k, causal=causal, sm_scale=0.1)
    np.testing.assert_array_equal(out, out2)
    with pytest.raises(ValueError, match="sm_scale=0.2"):
        r.forward(q, k, k, sm_scale=0.2)


def test_workspace_size_and_alignment_host():
    rng = np.random.default_rng(3)
    cache, _ = _decode(rng)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    f, i = w.workspace_size(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS)
    assert f >= 1 and i > 0
    assert w._plan is None  # a query, not a plan
    w.reset_workspace_buffer(np.empty(f, np.uint8), np.empty(i, np.uint8))
    w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS)
    with pytest.raises(ValueError, match="float_workspace_buffer must be 16-byte aligned"):
        w.reset_workspace_buffer(_unaligned(1024), np.empty(64, np.uint8))
    with pytest.raises(ValueError, match="int_workspace_buffer must be 16-byte aligned"):
        w.reset_workspace_buffer(np.empty(1024, np.uint8), _unaligned(64))
    p = flashkv.BatchPrefillWithPagedKVCacheWrapper(WS)
    f, i = p.workspace_size(np.array([0, 3, 7], np.int32), cache.indptr, cache.indices,
                            cache.last_page_len, HQ, HK, D, PS, fixed_split_size=4)
    assert f >= 1 and i > 0
    r = flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS)
    assert r.workspace_size(np.array([0, 3], np.int32), np.array([0, 8], np.int32), HQ, HK,
                            D)[1] > 0


def test_fast_decode_plan_as_the_wrappers_plan():
    rng = np.random.default_rng(4)
    cache, q = _decode(rng)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS)
    ref = w.run(q, (cache.k, cache.v))
    w.plan = functools.partial(fast_decode_plan, w)  # FlashInfer's multi-step draft idiom
    w.plan(np.zeros(3, np.int32), cache.indices, cache.last_page_len, HQ, HK, D, PS,
           non_blocking=True, global_override_indptr_cpu=cache.indptr)
    np.testing.assert_array_equal(w.run(q, (cache.k, cache.v)), ref)
    fresh = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    with pytest.raises(ValueError, match="prior plan"):
        fast_decode_plan(fresh, cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS,
                         q_len_per_req=2)


def test_get_batch_indices_positions_outputs():
    indptr = np.array([0, 1, 3, 6, 10], np.int32)
    seq_lens = np.array([5, 5, 5, 5], np.int32)
    b, p = np.full(10, -7, np.int32), np.full(10, -7, np.int32)
    rb, rp = flashkv.get_batch_indices_positions(indptr, seq_lens, 10, b, p)
    assert rb is b and rp is p
    np.testing.assert_array_equal(b, [0, 1, 1, 2, 2, 2, 3, 3, 3, 3])
    np.testing.assert_array_equal(p, [4, 3, 4, 2, 3, 4, 1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"positions: expected an int32 array of shape \[nnz"):
        flashkv.get_batch_indices_positions(indptr, seq_lens, 10, positions=np.zeros(9, np.int32))
