"""merge_state / merge_state_in_place / merge_states (base-2 LSE, FlashInfer's convention) on host
arrays: against the formula in float64, and attention split over KV chunks merging back into
attention over the whole KV."""

import numpy as np
import pytest

import flashkv
from conftest import assert_close, attention_ref, rand, to_fw, to_np


def merge_ref(v, s):
    """⊕ over axis 1 of v [n, S, H, D] and base-2 s [n, S, H] in float64."""
    v, s = v.astype(np.float64), s.astype(np.float64)
    m = s.max(axis=1, keepdims=True)
    m0 = np.where(np.isfinite(m), m, 0.0)
    w = np.exp2(s - m0)
    total = w.sum(axis=1)
    safe = np.where(total > 0, total, 1.0)
    out = (w[..., None] * v).sum(axis=1) / safe[..., None]
    lse = np.where(total > 0, m0[:, 0] + np.log2(safe), -np.inf)
    return out, lse


def states(rng, n, num, h, d, dtype):
    v = rand(rng, (n, num, h, d), dtype)
    s = (rng.uniform(-4, 4, size=(n, num, h))).astype(np.float32)
    s[0, 0, :] = -np.inf  # an empty state: the identity of ⊕
    return v, s


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_merge_state(fw, dtype):
    rng = np.random.default_rng(20)
    v, s = states(rng, 7, 2, 4, 64, dtype)
    out, lse = flashkv.merge_state(to_fw(v[:, 0], fw), to_fw(s[:, 0], fw), to_fw(v[:, 1], fw),
                                   to_fw(s[:, 1], fw))
    ref, ref_lse = merge_ref(v, s)
    assert_close(out, ref, dtype)
    np.testing.assert_allclose(to_np(lse), ref_lse, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_merge_state_in_place(fw, dtype):
    rng = np.random.default_rng(21)
    v, s = states(rng, 5, 2, 4, 64, dtype)
    va, sa = to_fw(v[:, 0].copy(), fw), to_fw(s[:, 0].copy(), fw)
    assert flashkv.merge_state_in_place(va, sa, to_fw(v[:, 1], fw), to_fw(s[:, 1], fw)) is None
    ref, ref_lse = merge_ref(v, s)
    assert_close(va, ref, dtype)
    np.testing.assert_allclose(to_np(sa), ref_lse, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("num_states", [1, 3, 8])
def test_merge_states(fw, dtype, num_states):
    rng = np.random.default_rng(22)
    v, s = states(rng, 6, num_states, 4, 64, dtype)
    out, lse = flashkv.merge_states(to_fw(v, fw), to_fw(s, fw))
    assert tuple(out.shape) == (6, 4, 64) and tuple(lse.shape) == (6, 4)
    ref, ref_lse = merge_ref(v, s)
    assert_close(out, ref, dtype)
    np.testing.assert_allclose(to_np(lse), ref_lse, rtol=1e-6, atol=1e-5)


def test_split_kv_merges_into_full_attention():
    """Attention over KV chunks (prefix / suffix, as cascade attention does) merged with ⊕ equals
    attention over the whole KV: the wrappers' base-2 LSE and the merges agree."""
    rng = np.random.default_rng(23)
    q = rand(rng, (5, 8, 64), np.float32)
    k, v = rand(rng, (60, 2, 64), np.float32), rand(rng, (60, 2, 64), np.float32)
    cuts = [0, 17, 18, 60]
    parts = [flashkv.single_prefill_with_kv_cache(q, k[a:b], v[a:b], return_lse=True)
             for a, b in zip(cuts, cuts[1:])]
    ref, ref_lse = attention_ref(q, k, v)
    v01, s01 = flashkv.merge_state(*parts[0], *parts[1])
    flashkv.merge_state_in_place(v01, s01, *parts[2])
    np.testing.assert_allclose(v01, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s01, ref_lse * np.log2(np.e), rtol=1e-5)
    vs = np.stack([p[0] for p in parts], axis=1)
    ss = np.stack([p[1] for p in parts], axis=1)
    v_all, s_all = flashkv.merge_states(vs, ss)
    np.testing.assert_allclose(v_all, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s_all, ref_lse * np.log2(np.e), rtol=1e-5)


def test_merge_with_empty_state_is_identity():
    rng = np.random.default_rng(24)
    v = rand(rng, (3, 2, 64), np.float32)
    s = rng.uniform(-3, 3, size=(3, 2)).astype(np.float32)
    empty_v, empty_s = np.zeros_like(v), np.full_like(s, -np.inf)
    out, lse = flashkv.merge_state(v, s, empty_v, empty_s)
    np.testing.assert_array_equal(out, v)
    np.testing.assert_allclose(lse, s, rtol=1e-6)  # base-2 -> natural -> base-2 rounding only
