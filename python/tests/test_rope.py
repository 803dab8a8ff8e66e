"""RoPE (flashkv.rope, FlashInfer's flashinfer.rope API) on host arrays against a float64 NumPy
rotation written here: Llama and Llama 3.1 frequencies (Meta's piecewise definition),
NeoX / interleaved pairs, partial rotary_dim, positions from indptr + offsets or pos_ids, vLLM's
cos/sin cache, in place and out of place, strided inputs; bad arguments raise."""

import numpy as np
import pytest

import flashkv
from conftest import (FRAMEWORKS, llama31_freqs, llama_freqs, rand, rope_ref, rotate, to_fw,
                      to_np)

# Half an ulp, relative: the CPU reference computes in double and rounds once to the dtype.
HALF_ULP = {"float16": 2.0**-11, "float32": 2.0**-24, "bfloat16": 2.0**-8}
SMALLEST_HALF_ULP = {"float16": 2.0**-25, "float32": 2.0**-150, "bfloat16": 2.0**-134}


def positions_of(indptr, offsets):
    return np.concatenate([offsets[i] + np.arange(indptr[i + 1] - indptr[i])
                           for i in range(len(offsets))]).astype(np.int64)


def assert_rounded(out, ref, dtype, rotary_dim, x):
    """out is ref rounded once to dtype (half an ulp, relative); the unrotated tail is x's."""
    got = to_np(out).astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=HALF_ULP[dtype] * 1.001,
                               atol=SMALLEST_HALF_ULP[dtype])
    tail = to_np(x).astype(np.float64)[..., rotary_dim:]
    np.testing.assert_array_equal(got[..., rotary_dim:], tail)


def inputs(rng, fw, dtype, nnz, hq=4, hk=2, d=64):
    if dtype == "bfloat16":
        if fw != "torch":
            pytest.skip("bfloat16 host arrays need torch")
        import torch

        q = torch.from_numpy(rand(rng, (nnz, hq, d), np.float32) * 4).to(torch.bfloat16)
        k = torch.from_numpy(rand(rng, (nnz, hk, d), np.float32) * 4).to(torch.bfloat16)
        return q, k
    q = rand(rng, (nnz, hq, d), np.dtype(dtype)) * 4
    k = rand(rng, (nnz, hk, d), np.dtype(dtype)) * 4
    return to_fw(q, fw), to_fw(k, fw)


DTYPES = ["float16", "float32", "bfloat16"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("dims", [(64, None), (64, 32), (40, 24), (8, 2)])
def test_apply_rope_pos_ids(fw, dtype, interleave, dims):
    rng = np.random.default_rng(100)
    d, rotary_dim = dims
    q, k = inputs(rng, fw, dtype, 13, d=d)
    pos = np.array([0, 1, 2, 7, 100, 4095, 4096, 65535, 3, 3, 99999, 12, 131071], np.int32)
    q_rope, k_rope = flashkv.apply_rope_pos_ids(q, k, to_fw(pos, fw), rotary_dim=rotary_dim,
                                                interleave=interleave, rope_scale=2.0,
                                                rope_theta=5e5)
    assert type(q_rope) is type(q) and tuple(q_rope.shape) == tuple(q.shape)
    r = d if rotary_dim is None else rotary_dim
    freqs = llama_freqs(r, 2.0, 5e5)
    assert_rounded(q_rope, rope_ref(to_np(q), pos, freqs, interleave), dtype, r, q)
    assert_rounded(k_rope, rope_ref(to_np(k), pos, freqs, interleave), dtype, r, k)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("interleave", [False, True])
def test_apply_rope_indptr_offsets(fw, dtype, interleave):
    rng = np.random.default_rng(101)
    indptr = np.array([0, 3, 3, 4, 11], np.int32)  # request 1 is empty
    offsets = np.array([5, 1000, 0, 32000], np.int32)
    q, k = inputs(rng, fw, dtype, 11)
    q_rope, k_rope = flashkv.apply_rope(q, k, to_fw(indptr, fw), to_fw(offsets, fw),
                                        interleave=interleave)
    pos = positions_of(indptr, offsets)
    freqs = llama_freqs(64)  # FlashInfer's defaults: rope_scale 1, rope_theta 1e4
    assert_rounded(q_rope, rope_ref(to_np(q), pos, freqs, interleave), dtype, 64, q)
    assert_rounded(k_rope, rope_ref(to_np(k), pos, freqs, interleave), dtype, 64, k)
    # The same rotation by explicit positions.
    q2, k2 = flashkv.apply_rope_pos_ids(q, k, to_fw(pos.astype(np.int32), fw),
                                        interleave=interleave)
    np.testing.assert_array_equal(to_np(q2), to_np(q_rope))
    np.testing.assert_array_equal(to_np(k2), to_np(k_rope))


def test_llama31_frequencies_cover_all_bands():
    """The test's own check: head_dim 128 with Llama 3.1's defaults has bands kept, scaled and
    interpolated, so the tests below exercise every branch."""
    base = llama_freqs(128, 1.0, 5e5)
    f = llama31_freqs(128)
    assert np.any(f == base) and np.any(np.isclose(f, base / 8, rtol=1e-15))
    assert np.any((f < base) & (f > base / 8 * (1 + 1e-12)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 96])
@pytest.mark.parametrize("params", [{}, dict(rope_scale=32.0, rope_theta=1e6, low_freq_factor=2.0,
                                             high_freq_factor=8.0, old_context_len=4096)])
def test_apply_llama31_rope(fw, dtype, interleave, rotary_dim, params):
    rng = np.random.default_rng(102)
    q, k = inputs(rng, fw, dtype, 9, hq=8, hk=2, d=128)
    indptr = np.array([0, 4, 9], np.int32)
    offsets = np.array([8190, 100000], np.int32)
    r = 128 if rotary_dim is None else rotary_dim
    freqs = llama31_freqs(r, **params)
    pos = positions_of(indptr, offsets)
    q_rope, k_rope = flashkv.apply_llama31_rope(q, k, to_fw(indptr, fw), to_fw(offsets, fw),
                                                rotary_dim=rotary_dim, interleave=interleave,
                                                **params)
    assert_rounded(q_rope, rope_ref(to_np(q), pos, freqs, interleave), dtype, r, q)
    assert_rounded(k_rope, rope_ref(to_np(k), pos, freqs, interleave), dtype, r, k)
    q2, k2 = flashkv.apply_llama31_rope_pos_ids(q, k, to_fw(pos.astype(np.int32), fw),
                                                rotary_dim=rotary_dim, interleave=interleave,
                                                **params)
    np.testing.assert_array_equal(to_np(q2), to_np(q_rope))
    np.testing.assert_array_equal(to_np(k2), to_np(k_rope))


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_inplace_forms_equal_out_of_place(fw, dtype):
    rng = np.random.default_rng(103)
    q0, k0 = inputs(rng, fw, dtype, 7)
    indptr = np.array([0, 2, 7], np.int32)
    offsets = np.array([3, 70000], np.int32)
    pos = positions_of(indptr, offsets).astype(np.int32)
    copy = (lambda x: x.clone()) if fw == "torch" else (lambda x: x.copy())
    kw = dict(rotary_dim=32, interleave=True)
    cases = [
        (flashkv.apply_rope, flashkv.apply_rope_inplace, (indptr, offsets), {}),
        (flashkv.apply_rope_pos_ids, flashkv.apply_rope_pos_ids_inplace, (pos,), {}),
        (flashkv.apply_llama31_rope, flashkv.apply_llama31_rope_inplace, (indptr, offsets),
         dict(old_context_len=4096)),
        (flashkv.apply_llama31_rope_pos_ids, flashkv.apply_llama31_rope_pos_ids_inplace, (pos,),
         dict(rope_scale=4.0)),
    ]
    for out_of_place, in_place, where, extra in cases:
        q, k = copy(q0), copy(k0)
        q_rope, k_rope = out_of_place(q, k, *where, **kw, **extra)
        np.testing.assert_array_equal(to_np(q), to_np(q0))  # inputs untouched
        np.testing.assert_array_equal(to_np(k), to_np(k0))
        assert in_place(q, k, *where, **kw, **extra) is None
        np.testing.assert_array_equal(to_np(q), to_np(q_rope))
        np.testing.assert_array_equal(to_np(k), to_np(k_rope))


def test_strided_views_of_packed_qkv(fw):
    """q and k as views of one packed [nnz, (Hq + 2 Hk) * D] projection (FlashInfer's example):
    rotated in place inside the packed array, v untouched."""
    rng = np.random.default_rng(104)
    nnz, hq, hk, d = 6, 4, 2, 64
    packed = rand(rng, (nnz, (hq + 2 * hk) * d), np.float32)
    qkv = to_fw(packed.copy(), fw)
    q = qkv[:, : hq * d].reshape(nnz, hq, d)
    k = qkv[:, hq * d: (hq + hk) * d].reshape(nnz, hk, d)
    pos = np.arange(nnz, dtype=np.int32) * 1000
    flashkv.apply_rope_pos_ids_inplace(q, k, to_fw(pos, fw))
    out = to_np(qkv)
    freqs = llama_freqs(d)
    ref_q = rope_ref(packed[:, : hq * d].reshape(nnz, hq, d), pos, freqs, False)
    ref_k = rope_ref(packed[:, hq * d: (hq + hk) * d].reshape(nnz, hk, d), pos, freqs, False)
    np.testing.assert_allclose(out[:, : hq * d].reshape(nnz, hq, d), ref_q, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out[:, hq * d: (hq + hk) * d].reshape(nnz, hk, d), ref_k,
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(out[:, (hq + hk) * d:], packed[:, (hq + hk) * d:])


def cos_sin_cache(max_position, rotary_dim, theta=1e4):
    freqs = llama_freqs(rotary_dim, 1.0, theta)
    ang = np.arange(max_position, dtype=np.float64)[:, None] * freqs[None, :]
    return np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [64, 32])
@pytest.mark.parametrize("flat", [True, False])
def test_apply_rope_with_cos_sin_cache(fw, dtype, is_neox, rotary_dim, flat):
    rng = np.random.default_rng(105)
    nnz, hq, hk, d = 10, 4, 2, 64
    q, k = inputs(rng, fw, dtype, nnz, hq, hk, d)
    cache = cos_sin_cache(5000, rotary_dim)
    pos = rng.integers(0, 5000, size=nnz).astype(np.int32)
    pos[0] = 4999
    query = q.reshape(nnz, hq * d) if flat else q
    key = k.reshape(nnz, hk * d) if flat else k
    q_out, k_out = flashkv.apply_rope_with_cos_sin_cache(to_fw(pos, fw), query, key, d,
                                                         to_fw(cache, fw), is_neox=is_neox)
    assert tuple(q_out.shape) == tuple(query.shape) and tuple(k_out.shape) == tuple(key.shape)
    c = cache[pos].astype(np.float64)  # the rotation uses the cache's float32 values
    cos, sin = c[:, : rotary_dim // 2], c[:, rotary_dim // 2:]
    ref_q = rotate(to_np(q), cos, sin, interleave=not is_neox)
    ref_k = rotate(to_np(k), cos, sin, interleave=not is_neox)
    assert_rounded(to_np(q_out).reshape(nnz, hq, d), ref_q, dtype, rotary_dim, q)
    assert_rounded(to_np(k_out).reshape(nnz, hk, d), ref_k, dtype, rotary_dim, k)
    # In place, into the (flat) arrays themselves.
    assert flashkv.apply_rope_with_cos_sin_cache_inplace(to_fw(pos, fw), query, key, d,
                                                         to_fw(cache, fw), is_neox) is None
    np.testing.assert_array_equal(to_np(query), to_np(q_out))
    np.testing.assert_array_equal(to_np(key), to_np(k_out))


def test_cos_sin_cache_equals_llama_rope():
    """A cache built from Llama frequencies rotates as apply_rope_pos_ids does (to the cache's
    float32 rounding)."""
    rng = np.random.default_rng(106)
    q, k = inputs(rng, "numpy", "float32", 8)
    pos = np.array([0, 1, 5, 17, 300, 1023, 2, 999], np.int32)
    a = flashkv.apply_rope_with_cos_sin_cache(pos, q, k, 64, cos_sin_cache(1024, 64))
    b = flashkv.apply_rope_pos_ids(q, k, pos)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("fwk", FRAMEWORKS)
def test_int64_positions_are_accepted(fwk):
    rng = np.random.default_rng(107)
    q, k = inputs(rng, fwk, "float32", 4)
    a = flashkv.apply_rope_pos_ids(q, k, to_fw(np.array([1, 2, 3, 4], np.int64), fwk))
    b = flashkv.apply_rope_pos_ids(q, k, to_fw(np.array([1, 2, 3, 4], np.int32), fwk))
    np.testing.assert_array_equal(to_np(a[0]), to_np(b[0]))


def test_bad_arguments_raise():
    rng = np.random.default_rng(108)
    q, k = inputs(rng, "numpy", "float16", 4)
    pos = np.arange(4, dtype=np.int32)
    with pytest.raises(ValueError, match="rotary_dim = 33 must be even"):
        flashkv.apply_rope_pos_ids(q, k, pos, rotary_dim=33)
    with pytest.raises(ValueError, match="rotary_dim = 128 is out of range"):
        flashkv.apply_rope_pos_ids(q, k, pos, rotary_dim=128)
    with pytest.raises(ValueError, match="pos_ids"):
        flashkv.apply_rope_pos_ids(q, k, np.array([0, 1, -1, 2], np.int32))
    with pytest.raises(ValueError, match="pos_ids"):
        flashkv.apply_rope_pos_ids(q, k, pos[:3])
    with pytest.raises(ValueError, match="k"):
        flashkv.apply_rope_pos_ids(q, k.astype(np.float32), pos)
    with pytest.raises(TypeError, match="q: unsupported dtype"):
        flashkv.apply_rope_pos_ids(q.astype(np.float64), k, pos)
    with pytest.raises(ValueError, match="indptr"):
        flashkv.apply_rope(q, k, np.array([0, 2, 3], np.int32), np.array([0, 0], np.int32))
    with pytest.raises(ValueError, match="offsets"):
        flashkv.apply_rope(q, k, np.array([0, 2, 4], np.int32), np.array([0], np.int32))
    with pytest.raises(ValueError, match="high_freq_factor"):
        flashkv.apply_llama31_rope_pos_ids(q, k, pos, low_freq_factor=4, high_freq_factor=4)
    with pytest.raises(ValueError, match="rope_theta"):
        flashkv.apply_rope_pos_ids(q, k, pos, rope_theta=0)
    cache = cos_sin_cache(16, 64)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        flashkv.apply_rope_with_cos_sin_cache(pos, q, k, 64, cache.astype(np.float16))
    with pytest.raises(ValueError, match="positions"):
        flashkv.apply_rope_with_cos_sin_cache(np.array([0, 1, 16, 2], np.int32), q, k, 64, cache)
    with pytest.raises(ValueError, match="query: expected shape"):
        flashkv.apply_rope_with_cos_sin_cache(pos, q.reshape(4, -1), k.reshape(4, -1), 48, cache)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        flashkv.apply_rope_with_cos_sin_cache(pos, q, k, 64, cos_sin_cache(16, 66)[:, :66])
