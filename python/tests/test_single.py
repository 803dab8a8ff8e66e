"""single_decode_with_kv_cache and single_prefill_with_kv_cache on host arrays (CPU reference)
against the float64 NumPy reference of conftest.py."""

import numpy as np
import pytest

import flashkv
from conftest import assert_close, assert_lse2, attention_ref, rand, to_fw, to_np


def nhd(x, layout):
    """[L, H, D] from an array in `layout`."""
    return x if layout == "NHD" else x.transpose(1, 0, 2)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (6, 1)])  # MHA, GQA, MQA
def test_single_decode(fw, dtype, layout, heads):
    rng = np.random.default_rng(1)
    hq, hk = heads
    d, kv_len = 64, 37
    q = rand(rng, (hq, d), dtype)
    shape = (kv_len, hk, d) if layout == "NHD" else (hk, kv_len, d)
    k, v = rand(rng, shape, dtype), rand(rng, shape, dtype)
    out, lse = flashkv.single_decode_with_kv_cache(to_fw(q, fw), to_fw(k, fw), to_fw(v, fw),
                                                   kv_layout=layout, return_lse=True)
    ref, ref_lse = attention_ref(q[None], nhd(k, layout), nhd(v, layout))
    assert type(out) is type(to_fw(q, fw)) and tuple(out.shape) == (hq, d)
    assert str(out.dtype).removeprefix("torch.") == np.dtype(dtype).name  # numpy and torch
    assert_close(out, ref[0], dtype)
    assert_lse2(lse, ref_lse[0])


def test_single_decode_sm_scale_and_out():
    rng = np.random.default_rng(2)
    q, k, v = rand(rng, (4, 64), np.float32), rand(rng, (9, 2, 64), np.float32), rand(
        rng, (9, 2, 64), np.float32)
    out = np.full((4, 64), np.nan, np.float32)
    lse = np.full(4, np.nan, np.float32)
    ret = flashkv.single_decode_with_kv_cache(q, k, v, sm_scale=0.3, out=out, lse=lse)
    assert ret is out
    ref, ref_lse = attention_ref(q[None], k, v, sm_scale=0.3)
    assert_close(out, ref[0], np.float32)
    assert_lse2(lse, ref_lse[0])  # lse= is filled (base 2) even without return_lse


def test_single_decode_empty_kv():
    q = np.ones((4, 64), np.float16)
    k = np.zeros((0, 2, 64), np.float16)
    out, lse = flashkv.single_decode_with_kv_cache(q, k, k, return_lse=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens", [(13, 13), (5, 40), (9, 4)])  # qo_len, kv_len
def test_single_prefill(fw, dtype, layout, causal, lens):
    rng = np.random.default_rng(3)
    qo_len, kv_len = lens
    hq, hk, d = 8, 2, 64
    q = rand(rng, (qo_len, hq, d), dtype)
    shape = (kv_len, hk, d) if layout == "NHD" else (hk, kv_len, d)
    k, v = rand(rng, shape, dtype), rand(rng, shape, dtype)
    out, lse = flashkv.single_prefill_with_kv_cache(
        to_fw(q, fw), to_fw(k, fw), to_fw(v, fw), causal=causal, kv_layout=layout,
        return_lse=True)
    ref, ref_lse = attention_ref(q, nhd(k, layout), nhd(v, layout), causal=causal)
    assert tuple(out.shape) == (qo_len, hq, d) and tuple(lse.shape) == (qo_len, hq)
    assert_close(out, ref, dtype)
    assert_lse2(lse, ref_lse)
    if causal and qo_len > kv_len:  # the first rows see no key
        assert np.all(to_np(out)[: qo_len - kv_len] == 0)
        assert np.all(np.isneginf(to_np(lse)[: qo_len - kv_len]))


def test_single_prefill_o_dtype():
    rng = np.random.default_rng(4)
    q, k = rand(rng, (6, 4, 64), np.float16), rand(rng, (10, 4, 64), np.float16)
    out = flashkv.single_prefill_with_kv_cache(q, k, k, o_dtype=np.float32)
    assert out.dtype == np.float32
    ref, _ = attention_ref(q, k, k)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)  # rounded once, to float32
