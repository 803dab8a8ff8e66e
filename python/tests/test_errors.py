"""Bad inputs raise Python exceptions carrying flashkv's message (ValueError for arguments,
TypeError for dtypes/devices flashkv does not take, NotImplementedError for FlashInfer arguments
flashkv does not implement yet), never crash the interpreter."""

import numpy as np
import pytest

import flashkv
from conftest import PagedCache, assert_close, attention_ref, rand

WS = np.empty(16, np.uint8)


def make_decode(rng, kv_lens=(5, 20), ps=4, hq=4, hk=2, d=64, dtype=np.float16):
    cache = PagedCache(rng, list(kv_lens), ps, hk, d, dtype, "NHD")
    q = rand(rng, (len(kv_lens), hq, d), dtype)
    return cache, q


def test_unsupported_dtype_is_type_error():
    q = np.zeros((4, 64), np.float64)
    with pytest.raises(TypeError, match="q: unsupported dtype"):
        flashkv.single_decode_with_kv_cache(q, q[None], q[None])


def test_shape_mismatch_carries_cpp_message():
    q = np.zeros((4, 64), np.float16)
    k = np.zeros((9, 2, 32), np.float16)
    with pytest.raises(ValueError, match="head_dim 32 .* does not match q's head_dim 64"):
        flashkv.single_decode_with_kv_cache(q, k, k)


def test_bad_gqa_group():
    q = np.zeros((3, 6, 64), np.float16)
    k = np.zeros((5, 4, 64), np.float16)
    with pytest.raises(ValueError, match="num_qo_heads = 6 is not divisible by num_kv_heads = 4"):
        flashkv.single_prefill_with_kv_cache(q, k, k)


def test_bad_layout():
    q = np.zeros((4, 64), np.float16)
    with pytest.raises(ValueError, match="kv_layout"):
        flashkv.single_decode_with_kv_cache(q, q[None], q[None], kv_layout="NDH")
    with pytest.raises(ValueError, match="kv_layout"):
        flashkv.BatchDecodeWithPagedKVCacheWrapper(WS, "nhd ")


def test_page_table_errors_name_the_entry():
    rng = np.random.default_rng(30)
    cache, q = make_decode(rng)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    bad = cache.indices.copy()
    bad[3] = cache.k.shape[0]  # one past the last page
    w.plan(cache.indptr, bad, cache.last_page_len, 4, 2, 64, 4)  # the cache arrives at run()
    with pytest.raises(ValueError, match=r"indices\[3\] = \d+ is out of range \[0, num_pages\)"):
        w.run(q, (cache.k, cache.v))
    # The rest of the page table is checked at plan(), as on the GPU (test_plan_checks.py).
    with pytest.raises(ValueError, match=r"indptr\[2\] = 1: expected >= indptr\[1\] = 3"):
        w.plan(np.array([0, 3, 1], np.int32), cache.indices, cache.last_page_len, 4, 2, 64, 4)
    with pytest.raises(ValueError, match=r"last_page_len\[0\] = 5: expected 1 <= value <= 4"):
        w.plan(cache.indptr, cache.indices, np.array([5, 1], np.int32), 4, 2, 64, 4)


def test_run_checks_against_plan():
    rng = np.random.default_rng(31)
    cache, q = make_decode(rng)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    with pytest.raises(ValueError, match="before a successful plan"):
        w.run(q, (cache.k, cache.v))
    w.plan(cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 4)
    with pytest.raises(ValueError, match=r"q: expected dtype f16 \(the plan's q_data_type\), got "
                                         r"f32"):
        w.run(q.astype(np.float32), (cache.k, cache.v))
    with pytest.raises(ValueError, match=r"paged_kv.page_size: expected 4 \(the plan's\), got 2"):
        w.run(q, (cache.k[:, :2], cache.v[:, :2]))
    with pytest.raises(ValueError, match="q: expected shape"):
        w.run(q[:, :2], (cache.k, cache.v))
    with pytest.raises(ValueError, match="batch size 1 .* does not match paged_kv's batch size 2"):
        w.run(q[:1], (cache.k, cache.v))
    with pytest.raises(ValueError, match="paged_kv_cache: expected"):
        w.run(q, cache.k)
    with pytest.raises(ValueError, match="out: expected shape"):
        w.run(q, (cache.k, cache.v), out=np.empty((2, 4, 32), np.float16))
    with pytest.raises(ValueError, match="lse: expected dtype f32"):
        w.run(q, (cache.k, cache.v), lse=np.empty((2, 4), np.float16))


def test_index_arrays():
    rng = np.random.default_rng(32)
    cache, q = make_decode(rng)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    # int64 (NumPy's default) and Python lists are accepted and converted
    w.plan(cache.indptr.astype(np.int64), list(cache.indices), cache.last_page_len.tolist(), 4, 2,
           64, 4)
    out = w.run(q, (cache.k, cache.v))
    for i in range(len(cache.kv_lens)):  # the converted page table is the one that was given
        ref, _ = attention_ref(q[i:i + 1], *cache.gather(i))
        assert_close(out[i], ref[0], np.float16)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 4)  # int32 arrays
    np.testing.assert_array_equal(out, w.run(q, (cache.k, cache.v)))
    with pytest.raises(TypeError, match="indptr: expected an integer array"):
        w.plan(cache.indptr.astype(np.float32), cache.indices, cache.last_page_len, 4, 2, 64, 4)
    with pytest.raises(ValueError, match="indptr: values do not fit int32"):
        w.plan(np.array([0, 2**40]), cache.indices, cache.last_page_len, 4, 2, 64, 4)


def test_prefill_errors():
    rng = np.random.default_rng(33)
    q = rand(rng, (5, 4, 64), np.float16)
    k = rand(rng, (7, 4, 64), np.float16)
    w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS)
    w.plan(np.array([0, 2, 5], np.int32), np.array([0, 3, 7], np.int32), 4, 4, 64)
    with pytest.raises(ValueError, match=r"qo_indptr\[batch\] = 5 must equal q.size\(0\) = 4"):
        w.run(q[:4], k, k)
    with pytest.raises(ValueError, match="k: expected 4 kv heads"):
        w.run(q, k[:, :2], k[:, :2])
    w.plan(np.array([0, 2, 5], np.int32), np.array([0, 3, 9], np.int32), 4, 4, 64)
    with pytest.raises(ValueError, match="kv_indptr"):
        w.run(q, k, k)


@pytest.mark.parametrize("kwargs, name", [  # decode variants: test_variants.py
    (dict(block_tables=np.zeros((2, 4), np.int32)), "block_tables"),
])
def test_decode_plan_not_implemented(kwargs, name):
    rng = np.random.default_rng(34)
    cache, _ = make_decode(rng)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    with pytest.raises(NotImplementedError, match=name):
        w.plan(cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 4, **kwargs)


@pytest.mark.parametrize("kwargs, name", [  # prefill variants: test_prefill_variants.py
    (dict(head_dim_vo=128), "head_dim_vo"),
    (dict(block_tables=np.zeros((1, 4), np.int32)), "block_tables"),
])
def test_prefill_plan_not_implemented(kwargs, name):
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(WS)
    ip = np.array([0, 1], np.int32)
    with pytest.raises(NotImplementedError, match=name):
        w.plan(ip, ip, ip, ip, 4, 4, 64, 16, **kwargs)


def test_other_not_implemented():
    q = np.zeros((4, 64), np.float16)
    with pytest.raises(NotImplementedError, match="q_scale"):  # k_scale / v_scale: test_fp8.py
        flashkv.single_decode_with_kv_cache(q, q[None], q[None], q_scale=0.5)
    with pytest.raises(NotImplementedError, match="scale_q"):
        flashkv.single_prefill_with_kv_cache(q[None], q[None], q[None], scale_q=0.5)
    with pytest.raises(NotImplementedError, match="backend"):
        flashkv.BatchDecodeWithPagedKVCacheWrapper(WS, backend="trtllm-gen")
    with pytest.raises(NotImplementedError, match="backend"):  # fa3 is a prefill kernel
        flashkv.BatchDecodeWithPagedKVCacheWrapper(WS, backend="fa3")
    with pytest.raises(NotImplementedError, match="'auto' or 'fa2' or 'fa3'"):
        flashkv.BatchPrefillWithPagedKVCacheWrapper(WS, backend="cudnn")
    for backend in ("auto", "fa2", "fa3"):  # prefill: mma.sync (fa2), Hopper wgmma (fa3)
        flashkv.BatchPrefillWithPagedKVCacheWrapper(WS, backend=backend)
        flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS, backend=backend)
    with pytest.raises(NotImplementedError, match="jit_args"):
        flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS, jit_args=["variant"])
    rng = np.random.default_rng(35)
    cache, qb = make_decode(rng)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 4)
    with pytest.raises(NotImplementedError, match="variant parameters"):
        w.run(qb, (cache.k, cache.v), 1.0)
    with pytest.raises(NotImplementedError, match="q_scale"):
        w.run(qb, (cache.k, cache.v), q_scale=2.0)


def test_cuda_graph_mode_needs_buffers():
    with pytest.raises(ValueError, match="paged_kv_indptr_buffer is required"):
        flashkv.BatchDecodeWithPagedKVCacheWrapper(WS, use_cuda_graph=True)
    with pytest.raises(ValueError, match="kv_indptr_buf is required"):
        flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS, use_cuda_graph=True,
                                                     qo_indptr_buf=np.zeros(3, np.int32))


def test_merge_errors():
    v = np.zeros((3, 2, 64), np.float16)
    s = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="v_b: expected shape"):
        flashkv.merge_state(v, s, v[:, :1], s[:, :1])
    with pytest.raises(ValueError, match="s_a: expected dtype f32"):
        flashkv.merge_state(v, s.astype(np.float16), v, s)
    with pytest.raises(ValueError, match="v: expected shape"):
        flashkv.merge_states(v, s)


def test_gpu_paths_report_missing_gpu():
    """Without a GPU, GPU-only entry points raise RuntimeError with the reason (no crash)."""
    if flashkv.cuda_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="CUDA|driver"):
        flashkv._C.BatchDecode.workspace_bytes(8, 32, 128, 0)
