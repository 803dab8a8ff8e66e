"""The host path's plan() runs the GPU plan's C++ checks (flashkv/plan_checks.h): what the GPU
refuses, a host wrapper refuses at plan() with the same message (page_size 0, heads that do not
divide, head_dim 100, dtypes, page tables, an empty workspace). Page ids of a host page table:
negative ones at plan(), ones past the cache at run(), named by entry, before anything is written
(outputs are poisoned and must be untouched). single_decode / single_prefill with k in the other
layout name the layout."""

import numpy as np
import pytest

import flashkv
from conftest import PagedCache, assert_close, attention_ref, rand, to_fw

WS = np.empty(16, np.uint8)
POISON = 7.0  # what out / lse hold before a refused run(); it must still be there after


def poisoned(shape, dtype):
    return np.full(shape, POISON, dtype)


def assert_untouched(*arrays):
    for a in arrays:
        assert np.all(a == POISON), "a refused call wrote into its output"


def decode_setup(rng, kv_lens=(5, 20, 9), ps=4, hk=2, d=64):
    return PagedCache(rng, list(kv_lens), ps, hk, d, np.float16, "NHD")


# --- item 3: the GPU plan's checks on the host path -------------------------------------------


def test_output_dtype_other_than_q_is_not_implemented(fw):
    """An f32 output (FlashInfer's o_data_type) needs a kernel epilogue change: a named
    NotImplementedError on the host as on the GPU (one check, _common.plan_dtypes)."""
    cache = decode_setup(np.random.default_rng(1))
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(to_fw(WS, fw))
    with pytest.raises(NotImplementedError, match="o_data_type='float32'"):
        w.plan(cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 4,
               o_data_type="float32")
    with pytest.raises(NotImplementedError, match="FP8 queries"):
        w.plan(cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 4,
               q_data_type="float8_e4m3fn", kv_data_type="float8_e4m3fn")
    p = flashkv.BatchPrefillWithRaggedKVCacheWrapper(to_fw(WS, fw))
    with pytest.raises(NotImplementedError, match="o_data_type"):
        p.plan(np.array([0, 1], np.int32), np.array([0, 3], np.int32), 4, 2, 64,
               q_data_type="bfloat16", o_data_type="float16")


@pytest.mark.parametrize("args, kwargs, message", [
    ((4, 2, 64, 0), {}, r"page_size: expected >= 1, got 0"),
    ((7, 2, 64, 4), {}, r"num_qo_heads = 7 is not divisible by num_kv_heads = 2"),
    ((4, 0, 64, 4), {}, r"num_kv_heads = 0: both must be positive"),
    ((4, 2, 100, 4), {}, r"head_dim: expected 64, 128 or 256, got 100"),
    ((128, 2, 64, 4), {}, None),  # a group of 64, the most the GPU takes: accepted
    ((256, 2, 64, 4), {}, r"expected a GQA group of at most 64, got 128"),
    ((4, 2, 64, 4), dict(kv_data_type="bfloat16"),
     r"kv_dtype: expected f16 \(the q dtype\) or an fp8 dtype \(e4m3, e5m2\), got bf16"),
])
def test_decode_plan_refuses_what_the_gpu_refuses(fw, args, kwargs, message):
    cache = decode_setup(np.random.default_rng(1))
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(to_fw(WS, fw))
    if message is None:
        w.plan(cache.indptr, cache.indices, cache.last_page_len, *args, **kwargs)
        return
    w.plan(cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 4)
    with pytest.raises(ValueError, match=message):
        w.plan(to_fw(cache.indptr, fw), to_fw(cache.indices, fw),
               to_fw(cache.last_page_len, fw), *args, **kwargs)
    # A refused plan() leaves the wrapper unplanned (the GPU path's rule): run() refuses too.
    q = rand(np.random.default_rng(2), (3, 4, 64), np.float16)
    with pytest.raises(ValueError, match="before a successful plan"):
        w.run(q, (cache.k, cache.v))


def test_decode_plan_page_table_entries():
    cache = decode_setup(np.random.default_rng(3))
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    with pytest.raises(ValueError, match=r"indptr\[0\]: expected 0, got 1"):
        w.plan(cache.indptr + 1, cache.indices, cache.last_page_len, 4, 2, 64, 4)
    with pytest.raises(ValueError, match=r"indptr\[2\] = 1: expected >= indptr\[1\] = 2"):
        w.plan(np.array([0, 2, 1, 5], np.int32), cache.indices, cache.last_page_len, 4, 2, 64, 4)
    with pytest.raises(ValueError, match=r"last_page_len\[1\] = 0: expected 1 <= value <= 4 "
                                         r"\(page_size\) for request 1"):
        w.plan(cache.indptr, cache.indices, np.array([1, 0, 1], np.int32), 4, 2, 64, 4)
    with pytest.raises(ValueError, match=r"last_page_len: expected at least 3 entries, got 2"):
        w.plan(cache.indptr, cache.indices, cache.last_page_len[:2], 4, 2, 64, 4)
    with pytest.raises(ValueError, match=r"indices: expected at least 10 entries, got 9"):
        w.plan(cache.indptr, cache.indices[:9], cache.last_page_len, 4, 2, 64, 4)


def test_float32_stays_a_host_dtype():
    """The CPU reference also runs float32 (the GPU plan refuses it: q_dtype f16 or bf16)."""
    rng = np.random.default_rng(4)
    cache = PagedCache(rng, [7, 3], 4, 2, 64, np.float32, "NHD")
    q = rand(rng, (2, 4, 64), np.float32)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 4, q_data_type="float32")
    out = w.run(q, (cache.k, cache.v))
    ref, _ = attention_ref(q[1:2], *cache.gather(1))
    assert_close(out[1], ref[0], np.float32)


@pytest.mark.parametrize("args, message", [
    ((4, 2, 64, 0), r"page_size: expected >= 1, got 0"),
    ((7, 2, 64, 4), r"num_qo_heads = 7 is not divisible by num_kv_heads = 2"),
    ((4, 2, 100, 4), r"head_dim: expected 64, 128 or 256, got 100"),
    ((256, 1, 64, 4), r"expected a GQA group of at most 128, got 256"),
])
def test_prefill_plans_refuse_what_the_gpu_refuses(args, message):
    cache = decode_setup(np.random.default_rng(5))
    qo = np.array([0, 2, 3, 6], np.int32)
    paged = flashkv.BatchPrefillWithPagedKVCacheWrapper(WS)
    with pytest.raises(ValueError, match=message):
        paged.plan(qo, cache.indptr, cache.indices, cache.last_page_len, *args)
    if "page_size" in message:
        return  # ragged KV has no pages
    hq, hk, d, _ = args
    ragged = flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS)
    with pytest.raises(ValueError, match=message):
        ragged.plan(qo, np.array([0, 4, 4, 9], np.int32), hq, hk, d)


def test_prefill_plan_page_tables():
    cache = decode_setup(np.random.default_rng(6))
    paged = flashkv.BatchPrefillWithPagedKVCacheWrapper(WS)
    with pytest.raises(ValueError, match=r"qo_indptr\[2\] = 1: expected >= qo_indptr\[1\] = 2"):
        paged.plan(np.array([0, 2, 1, 6], np.int32), cache.indptr, cache.indices,
                   cache.last_page_len, 4, 2, 64, 4)
    with pytest.raises(ValueError, match=r"paged_kv_last_page_len\[2\] = 5: expected 1 <= value "
                                         r"<= 4"):
        paged.plan(np.array([0, 2, 3, 6], np.int32), cache.indptr, cache.indices,
                   np.array([1, 4, 5], np.int32), 4, 2, 64, 4)
    with pytest.raises(ValueError, match=r"kv_dtype: expected bf16 \(the q dtype\) or an fp8"):
        paged.plan(np.array([0, 2, 3, 6], np.int32), cache.indptr, cache.indices,
                   cache.last_page_len, 4, 2, 64, 4, q_data_type="bfloat16",
                   kv_data_type="float16")
    ragged = flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS)
    with pytest.raises(ValueError, match=r"kv_indptr\[3\] = 2: expected >= kv_indptr\[2\] = 4"):
        ragged.plan(np.array([0, 2, 3, 6], np.int32), np.array([0, 4, 4, 2], np.int32), 4, 2, 64)


def test_cascade_plans_refuse_what_the_gpu_refuses():
    cache = decode_setup(np.random.default_rng(7))
    w = flashkv.MultiLevelCascadeWrapper(WS)
    for args, message in [((4, 2, 64, 0), r"page_size: expected >= 1, got 0"),
                          ((7, 2, 64, 4), r"num_qo_heads = 7 is not divisible"),
                          ((4, 2, 100, 4), r"head_dim: expected 64, 128 or 256, got 100")]:
        with pytest.raises(ValueError, match=message):
            w.plan(None, cache.indptr, cache.indices, cache.last_page_len, *args)
    with pytest.raises(ValueError, match=r"paged_kv_indptr\[2\] = 1: expected >= "
                                         r"paged_kv_indptr\[1\] = 2"):
        w.plan(None, np.array([0, 2, 1, 5], np.int32), cache.indices, cache.last_page_len,
               4, 2, 64, 4)
    # FlashInfer's explicit-level cascade: each level is a paged prefill plan.
    levels = flashkv.MultiLevelCascadeAttentionWrapper(2, WS)
    qo = np.array([0, 3], np.int32)
    with pytest.raises(ValueError, match=r"head_dim: expected 64, 128 or 256, got 100"):
        levels.plan([qo, np.arange(4, dtype=np.int32)],
                    [np.array([0, 1], np.int32), cache.indptr], [cache.indices[:1], cache.indices],
                    [np.array([4], np.int32), cache.last_page_len], 4, 2, 100, 4)


@pytest.mark.parametrize("make", ["decode", "paged", "ragged", "cascade", "levels"])
def test_empty_host_workspace_is_refused_at_plan(make):
    """A 0-byte host workspace: refused at plan(), naming float_workspace_buffer and the minimum
    (it used to pass plan() and fail in run() with unrelated text)."""
    cache = decode_setup(np.random.default_rng(8))
    empty = np.empty(0, np.uint8)
    qo = np.array([0, 1, 2, 3], np.int32)
    match = (r"float_workspace_buffer: 0 bytes is too small for this plan \(.*\): flashkv needs "
             r"at least 1 bytes")
    with pytest.raises(ValueError, match=match):
        if make == "decode":
            flashkv.BatchDecodeWithPagedKVCacheWrapper(empty).plan(
                cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 4)
        elif make == "paged":
            flashkv.BatchPrefillWithPagedKVCacheWrapper(empty).plan(
                qo, cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 4)
        elif make == "ragged":
            flashkv.BatchPrefillWithRaggedKVCacheWrapper(empty).plan(
                qo, np.array([0, 4, 4, 9], np.int32), 4, 2, 64)
        elif make == "cascade":
            flashkv.MultiLevelCascadeWrapper(empty).plan(
                None, cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 4)
        else:
            flashkv.MultiLevelCascadeAttentionWrapper(1, empty).plan(
                [qo], [cache.indptr], [cache.indices], [cache.last_page_len], 4, 2, 64, 4)
    # One byte is enough on the host path (the CPU reference allocates what it needs).
    flashkv.BatchDecodeWithPagedKVCacheWrapper(np.empty(1, np.uint8)).plan(
        cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 4)


@pytest.mark.parametrize("fn", ["decode", "prefill"])
def test_single_kv_in_the_other_layout_names_it(fn):
    """k, v in NHD passed with kv_layout="HND": the message names the layout and the shape it
    expects, not only the head counts it read."""
    rng = np.random.default_rng(9)
    k = rand(rng, (10, 2, 64), np.float16)  # NHD: kv_len 10, 2 heads
    expected = (r"k: with kv_layout 'HND' expected \[num_kv_heads, kv_len, head_dim\], got shape "
                r"\[10, 2, 64\].*num_qo_heads = 8 is not divisible by num_kv_heads = 10")
    if fn == "decode":
        q = rand(rng, (8, 64), np.float16)
        with pytest.raises(ValueError, match=expected):
            flashkv.single_decode_with_kv_cache(q, k, k, kv_layout="HND")
        out = flashkv.single_decode_with_kv_cache(q, k, k, kv_layout="NHD")
        assert out.shape == (8, 64)
    else:
        q = rand(rng, (3, 8, 64), np.float16)
        with pytest.raises(ValueError, match=expected):
            flashkv.single_prefill_with_kv_cache(q, k, k, kv_layout="HND")
        with pytest.raises(ValueError, match=expected):  # the CPU reference of a variant too
            flashkv.single_prefill_with_kv_cache(q, k, k, kv_layout="HND", logits_soft_cap=30.0)


# --- item 4: page ids of a host page table ----------------------------------------------------


def test_decode_page_ids(fw):
    rng = np.random.default_rng(10)
    cache = decode_setup(rng)
    q = rand(rng, (3, 4, 64), np.float16)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    num_pages = cache.k.shape[0]
    bad = cache.indices.copy()
    bad[7] = num_pages + 4  # past the cache: known only at run()
    w.plan(to_fw(cache.indptr, fw), to_fw(bad, fw), to_fw(cache.last_page_len, fw), 4, 2, 64, 4)
    out, lse = poisoned((3, 4, 64), np.float16), poisoned((3, 4), np.float32)
    with pytest.raises(ValueError, match=rf"indices\[7\] = {num_pages + 4} is out of range "
                                         rf"\[0, num_pages\): the paged KV cache given to run\(\) "
                                         rf"has {num_pages} pages"):
        w.run(q, (cache.k, cache.v), out=out, lse=lse)
    assert_untouched(out, lse)
    with pytest.raises(ValueError, match=r"indices\[7\]"):  # the interleaved cache as well
        w.run(q, cache.kv, out=out)
    assert_untouched(out)
    # The same table runs over a cache that has those pages.
    big = np.concatenate([cache.kv, np.zeros((5,) + cache.kv.shape[1:], np.float16)])
    w.run(q, big, out=out)
    # A negative id: refused at plan(), naming the entry.
    neg = cache.indices.copy()
    neg[2] = -1
    with pytest.raises(ValueError, match=r"indices\[2\] = -1 is out of range \[0, num_pages\)"):
        w.plan(cache.indptr, to_fw(neg, fw), cache.last_page_len, 4, 2, 64, 4)
    with pytest.raises(ValueError, match="before a successful plan"):
        w.run(q, (cache.k, cache.v))
    # Good ids run and match the reference.
    w.plan(cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 4)
    out = w.run(q, (cache.k, cache.v))
    for i in range(3):
        ref, _ = attention_ref(q[i:i + 1], *cache.gather(i))
        assert_close(out[i], ref[0], np.float16)


def test_decode_run_step_page_ids():
    """The fused step (host: RoPE, append, attention) refuses before appending into the cache."""
    rng = np.random.default_rng(11)
    cache = decode_setup(rng)
    q = rand(rng, (3, 4, 64), np.float16)
    k_new, v_new = rand(rng, (3, 2, 64), np.float16), rand(rng, (3, 2, 64), np.float16)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    bad = cache.indices.copy()
    bad[4] = cache.k.shape[0]
    w.plan(cache.indptr, bad, cache.last_page_len, 4, 2, 64, 4)
    k, v = cache.k.copy(), cache.v.copy()
    out = poisoned((3, 4, 64), np.float16)
    with pytest.raises(ValueError, match=r"indices\[4\] = \d+ is out of range \[0, num_pages\)"):
        w.run_step(q, k_new, v_new, (k, v), out=out)
    assert_untouched(out)
    np.testing.assert_array_equal(k, cache.k)  # nothing appended
    np.testing.assert_array_equal(v, cache.v)


def test_prefill_page_ids():
    rng = np.random.default_rng(12)
    cache = decode_setup(rng)
    qo = np.array([0, 2, 3, 6], np.int32)
    q = rand(rng, (6, 4, 64), np.float16)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(WS)
    bad = cache.indices.copy()
    bad[0] = cache.k.shape[0]
    w.plan(qo, cache.indptr, bad, cache.last_page_len, 4, 2, 64, 4, causal=True)
    out, lse = poisoned((6, 4, 64), np.float16), poisoned((6, 4), np.float32)
    with pytest.raises(ValueError, match=rf"paged_kv_indices\[0\] = {cache.k.shape[0]} is out of "
                                         r"range \[0, num_pages\)"):
        w.run(q, (cache.k, cache.v), out=out, lse=lse)
    assert_untouched(out, lse)
    bad[0] = -3
    with pytest.raises(ValueError, match=r"paged_kv_indices\[0\] = -3 is out of range"):
        w.plan(qo, cache.indptr, bad, cache.last_page_len, 4, 2, 64, 4)


def test_cascade_page_ids():
    rng = np.random.default_rng(13)
    cache = decode_setup(rng)
    q = rand(rng, (3, 4, 64), np.float16)
    w = flashkv.MultiLevelCascadeWrapper(WS)
    bad = cache.indices.copy()
    bad[9] = cache.k.shape[0] + 1
    w.plan(None, cache.indptr, bad, cache.last_page_len, 4, 2, 64, 4)
    out, lse = poisoned((3, 4, 64), np.float16), poisoned((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"paged_kv_indices\[9\] = \d+ is out of range"):
        w.run(q, (cache.k, cache.v), out=out, lse=lse)
    assert_untouched(out, lse)
    bad[9] = -1
    with pytest.raises(ValueError, match=r"paged_kv_indices\[9\] = -1 is out of range"):
        w.plan(None, cache.indptr, bad, cache.last_page_len, 4, 2, 64, 4)


def test_explicit_levels_check_every_level_before_writing():
    """FlashInfer's cascade runs the last level into out first: a bad id in level 0 must be caught
    before that, so out stays untouched."""
    rng = np.random.default_rng(14)
    cache = decode_setup(rng, kv_lens=(8, 8, 8))
    q = rand(rng, (3, 4, 64), np.float16)
    w = flashkv.MultiLevelCascadeAttentionWrapper(2, WS)
    shared = np.array([cache.k.shape[0]], np.int32)  # level 0: one page past the cache
    w.plan([np.array([0, 3], np.int32), np.array([0, 1, 2, 3], np.int32)],
           [np.array([0, 1], np.int32), cache.indptr], [shared, cache.indices],
           [np.array([4], np.int32), cache.last_page_len], 4, 2, 64, 4)
    out = poisoned((3, 4, 64), np.float16)
    with pytest.raises(ValueError, match=r"paged_kv_indices_arr\[0\]\[0\] = \d+ is out of range"):
        w.run(q, (cache.k, cache.v), out=out)
    assert_untouched(out)
