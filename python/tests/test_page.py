"""flashkv.page (FlashInfer's flashinfer.page API) and the fused decode step on host arrays:
append_paged_kv_cache against a NumPy scatter written here, get_batch_indices_positions and
get_seq_lens against their formulas, BatchDecodeWithPagedKVCacheWrapper.run_step against NumPy
RoPE + scatter + float64 attention (and equal to the unfused flashkv ops); bad inputs raise and
write nothing."""

import numpy as np
import pytest

import flashkv
from conftest import (PagedCache, assert_close, assert_lse2, attention_ref, llama31_freqs,
                      llama_freqs, rand, rope_ref, rotate, to_fw, to_np)

WS = np.empty(16, np.uint8)


def batch_indices_positions_ref(append_lens, seq_lens):
    bi, pos = [], []
    for i, (a, n) in enumerate(zip(append_lens, seq_lens)):
        bi += [i] * a
        pos += list(range(n - a, n))
    return np.array(bi, np.int32), np.array(pos, np.int32)


def append_ref(cache, keys, values, batch_indices, positions):
    """NumPy scatter of token t into its slot (copies of cache.k / cache.v)."""
    k, v = cache.k.copy(), cache.v.copy()
    for t, (b, p) in enumerate(zip(batch_indices, positions)):
        page = cache.indices[cache.indptr[b] + p // cache.page_size]
        slot = p % cache.page_size
        if cache.layout == "NHD":
            k[page, slot], v[page, slot] = keys[t], values[t]
        else:
            k[page, :, slot], v[page, :, slot] = keys[t], values[t]
    return k, v


def cache_arrays(c, interleaved):
    """(k, v) as NumPy arrays from what was passed to flashkv (a tuple or one 5-D array)."""
    if interleaved:
        kv = to_np(c)
        return kv[:, 0], kv[:, 1]
    return to_np(c[0]), to_np(c[1])


def test_get_batch_indices_positions_flashinfer_example(fw):
    append_indptr = to_fw(np.array([0, 1, 3, 6, 10], np.int32), fw)
    seq_lens = to_fw(np.array([5, 5, 5, 5], np.int32), fw)
    bi, pos = flashkv.get_batch_indices_positions(append_indptr, seq_lens, 10)
    assert type(bi) is type(append_indptr)
    np.testing.assert_array_equal(to_np(bi), [0, 1, 1, 2, 2, 2, 3, 3, 3, 3])
    np.testing.assert_array_equal(to_np(pos), [4, 3, 4, 2, 3, 4, 1, 2, 3, 4])


def test_get_batch_indices_positions_random(fw):
    rng = np.random.default_rng(200)
    append_lens = rng.integers(0, 40, size=17)
    append_lens[3] = 0
    seq_lens = append_lens + rng.integers(0, 1000, size=17)
    indptr = np.concatenate([[0], np.cumsum(append_lens)]).astype(np.int64)  # int64 accepted
    bi, pos = flashkv.get_batch_indices_positions(to_fw(indptr, fw), to_fw(seq_lens, fw),
                                                  int(indptr[-1]))
    ref_bi, ref_pos = batch_indices_positions_ref(append_lens, seq_lens)
    np.testing.assert_array_equal(to_np(bi), ref_bi)
    np.testing.assert_array_equal(to_np(pos), ref_pos)
    empty = flashkv.get_batch_indices_positions(np.zeros(3, np.int32), np.ones(2, np.int32), 0)
    assert all(x.shape == (0,) for x in empty)


def test_get_seq_lens(fw):
    indptr = to_fw(np.array([0, 3, 3, 4, 9], np.int32), fw)
    last = to_fw(np.array([5, 0, 16, 1], np.int32), fw)
    np.testing.assert_array_equal(to_np(flashkv.get_seq_lens(indptr, last, 16)),
                                  [2 * 16 + 5, 0, 16, 4 * 16 + 1])


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("page_size", [1, 5, 16])
def test_append_paged_kv_cache(fw, dtype, layout, interleaved, page_size):
    rng = np.random.default_rng(201)
    hk, d = 2, 40
    seq_lens = np.array([1, 37, 16, 5, 80], np.int32)  # after the append
    append_lens = np.array([1, 37, 3, 0, 17], np.int32)  # prefill, append, decode, idle, chunk
    cache = PagedCache(rng, seq_lens, page_size, hk, d, dtype, layout)
    nnz = int(append_lens.sum())
    # New keys/values as strided views of one packed [nnz, 2 * Hk * D] projection.
    packed = rand(rng, (nnz, 2 * hk * d), dtype)
    keys = packed[:, : hk * d].reshape(nnz, hk, d)
    values = packed[:, hk * d:].reshape(nnz, hk, d)
    append_indptr = np.concatenate([[0], np.cumsum(append_lens)]).astype(np.int32)
    bi, pos = flashkv.get_batch_indices_positions(to_fw(append_indptr, fw), to_fw(seq_lens, fw),
                                                  nnz)
    ref_k, ref_v = append_ref(cache, keys, values, to_np(bi), to_np(pos))
    c = cache.cache(interleaved, fw)
    k_in = packed if fw == "numpy" else to_fw(packed, fw)
    assert flashkv.append_paged_kv_cache(
        k_in[:, : hk * d].reshape(nnz, hk, d), k_in[:, hk * d:].reshape(nnz, hk, d), bi, pos, c,
        to_fw(cache.indices, fw), to_fw(cache.indptr, fw), to_fw(cache.last_page_len, fw),
        kv_layout=layout) is None
    got_k, got_v = cache_arrays(c, interleaved)
    np.testing.assert_array_equal(got_k, ref_k)
    np.testing.assert_array_equal(got_v, ref_v)


def test_append_then_decode_sees_the_new_tokens():
    """Append one token per request, then decode over the cache: attention includes it."""
    rng = np.random.default_rng(202)
    hq, hk, d, ps = 4, 2, 64, 4
    seq_lens = np.array([3, 9, 4], np.int32)
    cache = PagedCache(rng, seq_lens, ps, hk, d, np.float32, "NHD")
    keys, values = rand(rng, (3, hk, d), np.float32), rand(rng, (3, hk, d), np.float32)
    bi, pos = flashkv.get_batch_indices_positions(np.arange(4, dtype=np.int32), seq_lens, 3)
    flashkv.append_paged_kv_cache(keys, values, bi, pos, (cache.k, cache.v), cache.indices,
                                  cache.indptr, cache.last_page_len)
    q = rand(rng, (3, hq, d), np.float32)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           q_data_type="float32")
    out = w.run(q, (cache.k, cache.v))
    for i in range(3):
        k, v = cache.gather(i)
        np.testing.assert_array_equal(k[-1], keys[i])
        assert_close(out[i], attention_ref(q[i:i + 1], k, v)[0][0], np.float32)


def test_append_errors_write_nothing():
    rng = np.random.default_rng(203)
    cache = PagedCache(rng, [5, 9], 4, 2, 64, np.float16, "NHD")
    keys = rand(rng, (2, 2, 64), np.float16)
    before = cache.kv.copy()
    table = (cache.indices, cache.indptr, cache.last_page_len)

    def append(bi, pos, k=keys, layout="NHD"):
        flashkv.append_paged_kv_cache(k, k, np.array(bi, np.int32), np.array(pos, np.int32),
                                      cache.kv, *table, kv_layout=layout)

    with pytest.raises(ValueError, match="positions"):
        append([0, 1], [4, 9])  # request 1 has KV length 9: position 9 is past it
    with pytest.raises(ValueError, match="positions"):
        append([0, 1], [-1, 0])
    with pytest.raises(ValueError, match="batch_indices"):
        append([0, 2], [0, 0])
    with pytest.raises(ValueError, match="both write slot"):
        append([1, 1], [3, 3])
    with pytest.raises(ValueError, match="append_key|dtype"):
        append([0, 1], [0, 0], k=keys.astype(np.float32))
    with pytest.raises(ValueError, match="positions"):
        append([0, 1], [0])
    with pytest.raises(ValueError, match="kv_layout"):
        append([0, 1], [0, 0], layout="NDH")
    with pytest.raises(ValueError, match="paged_kv_cache"):
        flashkv.append_paged_kv_cache(keys, keys, np.zeros(2, np.int32), np.zeros(2, np.int32),
                                      (cache.k,), *table)
    np.testing.assert_array_equal(cache.kv, before)


def test_get_batch_indices_positions_errors():
    with pytest.raises(ValueError, match="nnz"):
        flashkv.get_batch_indices_positions(np.array([0, 2, 5], np.int32),
                                            np.array([4, 3], np.int32), 4)
    with pytest.raises(ValueError, match="seq_lens"):
        flashkv.get_batch_indices_positions(np.array([0, 2, 5], np.int32),
                                            np.array([4, 2], np.int32), 5)
    with pytest.raises(ValueError, match="append_indptr"):
        flashkv.get_batch_indices_positions(np.array([0, 3, 2], np.int32),
                                            np.array([4, 4], np.int32), 2)
    with pytest.raises(ValueError, match="nnz"):
        flashkv.get_batch_indices_positions(np.array([0, 1], np.int32), np.array([1], np.int32),
                                            -1)


# --- the fused decode step (host wrapper: the three CPU reference ops) ---

ROPES = {
    "none": (None, {}),
    "llama": (lambda r: llama_freqs(r, 1.0, 1e4), {}),
    "llama31": (lambda r: llama31_freqs(r, 8.0, 5e5, 1.0, 4.0, 8192), {}),
    "llama_custom": (lambda r: llama_freqs(r, 2.0, 5e5), dict(rope_scale=2.0, rope_theta=5e5)),
}


def step_setup(rng, dtype, layout, kv_lens, ps=4, hq=8, hk=2, d=64):
    cache = PagedCache(rng, kv_lens, ps, hk, d, dtype, layout)
    b = len(kv_lens)
    q = rand(rng, (b, hq, d), dtype)
    k_new, v_new = rand(rng, (b, hk, d), dtype), rand(rng, (b, hk, d), dtype)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS, layout)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           q_data_type=np.dtype(dtype).name)
    return cache, q, k_new, v_new, w


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("interleave", [False, True])
def test_run_step_matches_numpy(dtype, layout, rope, interleave):
    rng = np.random.default_rng(204)
    kv_lens = [1, 6, 8, 30]
    cache, q, k_new, v_new, w = step_setup(rng, dtype, layout, kv_lens)
    kind = "llama" if rope == "llama_custom" else rope
    freqs_of, extra = ROPES[rope]
    rotary_dim = 32 if interleave else None  # partial rotation in one of the two
    kv = cache.cache(True, "numpy")
    out, lse = w.run_step(q, k_new, v_new, kv, rope=kind, rotary_dim=rotary_dim,
                          interleave=interleave, return_lse=True, **extra)
    pos = np.array(kv_lens) - 1
    if freqs_of is None:
        q_rot, k_rot = q.astype(np.float64), k_new.astype(np.float64)
    else:
        freqs = freqs_of(64 if rotary_dim is None else rotary_dim)
        q_rot = rope_ref(q, pos, freqs, interleave)
        k_rot = rope_ref(k_new, pos, freqs, interleave)
    # What attention sees: the rotated values rounded once to the dtype, as flashkv stores them.
    q_rot, k_rot = q_rot.astype(dtype), k_rot.astype(dtype)
    ref_k, ref_v = append_ref(cache, k_rot, v_new, np.arange(len(kv_lens)), pos)
    got_k, got_v = kv[:, 0], kv[:, 1]
    tol = dict(rtol=2.0**-10, atol=2.0**-24) if dtype == np.float16 else dict(rtol=1e-6, atol=0)
    np.testing.assert_allclose(got_k.astype(np.float64), ref_k.astype(np.float64), **tol)
    np.testing.assert_array_equal(got_v, ref_v)
    for i, n in enumerate(kv_lens):
        cache.k, cache.v = got_k, got_v
        k, v = cache.gather(i)
        ref, ref_lse = attention_ref(q_rot[i:i + 1], k, v)
        assert_close(out[i], ref[0], dtype)
        assert_lse2(lse[i], ref_lse[0])


@pytest.mark.parametrize("rope", ["none", "llama", "llama31", "cos_sin_cache"])
def test_run_step_equals_unfused_ops(fw, rope):
    """run_step == apply_*_rope_pos_ids -> append_paged_kv_cache -> run, bit for bit, with and
    without explicit pos_ids."""
    rng = np.random.default_rng(205)
    kv_lens = [3, 1, 17, 64, 9]
    cache, q, k_new, v_new, w = step_setup(rng, np.float16, "NHD", kv_lens)
    pos = np.array(kv_lens, np.int32) - 1
    ang = np.arange(100, dtype=np.float64)[:, None] * llama_freqs(64)[None, :]
    cs = np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
    for pos_ids in (None, np.array([7, 0, 99, 3, 50], np.int32)):
        rope_pos = pos if pos_ids is None else pos_ids
        kwargs = dict(rope=rope, return_lse=True)
        if rope == "cos_sin_cache":
            kwargs["cos_sin_cache"] = to_fw(cs, fw)
        if pos_ids is not None:
            kwargs["pos_ids"] = to_fw(pos_ids, fw)
        fused = (to_fw(cache.k.copy(), fw), to_fw(cache.v.copy(), fw))
        q_in = to_fw(q, fw)
        out, lse = w.run_step(q_in, to_fw(k_new, fw), to_fw(v_new, fw), fused, **kwargs)
        np.testing.assert_array_equal(to_np(q_in), q)  # q is read, not modified
        unfused = (cache.k.copy(), cache.v.copy())
        if rope == "none":
            q_rot, k_rot = q, k_new
        elif rope == "llama":
            q_rot, k_rot = flashkv.apply_rope_pos_ids(q, k_new, rope_pos)
        elif rope == "llama31":
            q_rot, k_rot = flashkv.apply_llama31_rope_pos_ids(q, k_new, rope_pos)
        else:
            q_rot, k_rot = flashkv.apply_rope_with_cos_sin_cache(rope_pos, q, k_new, 64, cs)
        flashkv.append_paged_kv_cache(k_rot, v_new, np.arange(5, dtype=np.int32), pos, unfused,
                                      cache.indices, cache.indptr, cache.last_page_len)
        ref_out, ref_lse = w.run(q_rot, unfused, return_lse=True)
        np.testing.assert_array_equal(to_np(out), ref_out)
        np.testing.assert_array_equal(to_np(lse), ref_lse)
        np.testing.assert_array_equal(to_np(fused[0]), unfused[0])
        np.testing.assert_array_equal(to_np(fused[1]), unfused[1])


def test_run_step_cos_sin_cache_matches_numpy():
    rng = np.random.default_rng(206)
    kv_lens = [2, 11]
    cache, q, k_new, v_new, w = step_setup(rng, np.float32, "NHD", kv_lens)
    ang = np.arange(16, dtype=np.float64)[:, None] * llama_freqs(32, 1.0, 500.0)[None, :]
    cs = np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
    out = w.run_step(q, k_new, v_new, (cache.k, cache.v), rope="cos_sin_cache",
                     cos_sin_cache=cs, is_neox=False)
    c = cs[np.array(kv_lens) - 1].astype(np.float64)
    q_rot = rotate(q, c[:, :16], c[:, 16:], interleave=True).astype(np.float32)
    for i in range(2):
        k, v = cache.gather(i)
        np.testing.assert_array_equal(v[-1], v_new[i])
        ref, _ = attention_ref(q_rot[i:i + 1], k, v)
        assert_close(out[i], ref[0], np.float32)


def test_run_step_errors():
    rng = np.random.default_rng(207)
    cache, q, k_new, v_new, w = step_setup(rng, np.float16, "NHD", [4, 5])
    kv = (cache.k, cache.v)
    with pytest.raises(ValueError, match="rope: expected"):
        w.run_step(q, k_new, v_new, kv, rope="neox")
    with pytest.raises(ValueError, match="cos_sin_cache: required"):
        w.run_step(q, k_new, v_new, kv, rope="cos_sin_cache")
    with pytest.raises(ValueError, match="cos_sin_cache: required"):
        w.run_step(q, k_new, v_new, kv, rope="llama", cos_sin_cache=np.zeros((8, 64), np.float32))
    with pytest.raises(ValueError, match="pos_ids"):
        w.run_step(q, k_new, v_new, kv, rope="llama", pos_ids=np.array([0, -3], np.int32))
    with pytest.raises(ValueError, match="k_new: expected 2 rows"):
        w.run_step(q, k_new[:1], v_new, kv)
    cache0, q0, k0, v0, w0 = step_setup(rng, np.float16, "NHD", [4, 0])
    with pytest.raises(ValueError, match="kv_len >= 1"):
        w0.run_step(q0, k0, v0, (cache0.k, cache0.v))
    with pytest.raises(ValueError, match="before a successful plan"):
        flashkv.BatchDecodeWithPagedKVCacheWrapper(WS).run_step(q, k_new, v_new, kv)
