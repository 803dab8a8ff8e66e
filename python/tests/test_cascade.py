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


def test_merge_state_in_place_with_mask(fw):
    """FlashInfer's mask: rows where it is True are merged, the others keep their state."""
    rng = np.random.default_rng(22)
    v, s = states(rng, 6, 2, 4, 64, np.float16)
    mask = np.array([True, False, True, True, False, False])
    va, sa = to_fw(v[:, 0].copy(), fw), to_fw(s[:, 0].copy(), fw)
    flashkv.merge_state_in_place(va, sa, to_fw(v[:, 1], fw), to_fw(s[:, 1], fw),
                                 mask=to_fw(mask, fw))
    ref, ref_lse = merge_ref(v, s)
    assert_close(to_np(va)[mask], ref[mask], np.float16)
    np.testing.assert_allclose(to_np(sa)[mask], ref_lse[mask], rtol=1e-6, atol=1e-5)
    np.testing.assert_array_equal(to_np(va)[~mask], v[~mask, 0])
    np.testing.assert_array_equal(to_np(sa)[~mask], s[~mask, 0])
    with pytest.raises(ValueError, match=r"mask: expected a bool array of shape \[seq_len = 6"):
        flashkv.merge_state_in_place(va, sa, va, sa, mask=to_fw(mask[:5], fw))


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


# --- cascade attention over shared prefixes (host wrappers: the CPU reference) ---

WS = np.empty(16, np.uint8)


class SharedPrefixBatch:
    """A paged cache (page 4, NHD, float32) holding a batch whose requests share prefixes: a
    2-page prefix shared by all, a 1-page prefix shared by requests 0-2 after it, and per-request
    suffixes. Gives FlashInfer-style per-level arrays and the plain page table of the batch."""

    ps, hk, d = 4, 2, 64

    def __init__(self, rng, suffix_lens, qo_lens=None):
        self.batch = len(suffix_lens)
        self.qo_lens = [1] * self.batch if qo_lens is None else list(qo_lens)
        num_pages = 64
        perm = rng.permutation(num_pages).astype(np.int32)
        self.top, self.mid = perm[:2], perm[2:3]
        free = list(perm[3:])
        self.suffix_pages = [[free.pop() for _ in range((n + self.ps - 1) // self.ps)]
                             for n in suffix_lens]
        self.suffix_lens = list(suffix_lens)
        self.k = rand(rng, (num_pages, self.ps, self.hk, self.d), np.float32)
        self.v = rand(rng, (num_pages, self.ps, self.hk, self.d), np.float32)
        self.group1 = 3  # requests 0..2 share `mid`

    def pages(self, i):
        return (list(self.top) + (list(self.mid) if i < self.group1 else [])
                + self.suffix_pages[i])

    def last(self, n):
        return n - (((n + self.ps - 1) // self.ps) - 1) * self.ps if n else 0

    def table(self):
        """The plain page table: (indptr, indices, last_page_len)."""
        lists = [self.pages(i) for i in range(self.batch)]
        indptr = np.concatenate([[0], np.cumsum([len(p) for p in lists])]).astype(np.int32)
        last = np.array([self.last(n) if n else self.ps for n in self.suffix_lens], np.int32)
        return indptr, np.concatenate(lists).astype(np.int32), last

    def qo_indptr(self):
        return np.concatenate([[0], np.cumsum(self.qo_lens)]).astype(np.int32)

    def levels(self):
        """FlashInfer's arrays for 3 levels: all / requests 0-2 / each request."""
        rows = self.qo_indptr()
        g1 = int(rows[self.group1])
        qo = [np.array([0, rows[-1]], np.int32), np.array([0, g1, rows[-1]], np.int32), rows]
        kv_indptr = [np.array([0, 2], np.int32), np.array([0, 1, 1], np.int32),
                     np.concatenate([[0], np.cumsum([len(p) for p in self.suffix_pages])])
                     .astype(np.int32)]
        indices = [self.top.astype(np.int32), self.mid.astype(np.int32),
                   np.concatenate(self.suffix_pages).astype(np.int32)]
        last = [np.array([self.ps], np.int32), np.array([self.ps, 0], np.int32),
                np.array([self.last(n) for n in self.suffix_lens], np.int32)]
        return qo, kv_indptr, indices, last

    def reference(self, q, causal):
        rows = self.qo_indptr()
        out = np.zeros(q.shape)
        lse = np.zeros(q.shape[:2])
        for i in range(self.batch):
            ids = self.pages(i)
            n = (len(ids) - len(self.suffix_pages[i])) * self.ps + self.suffix_lens[i]
            k = self.k[ids].reshape(-1, self.hk, self.d)[:n]
            v = self.v[ids].reshape(-1, self.hk, self.d)[:n]
            r = slice(rows[i], rows[i + 1])
            out[r], lse[r] = attention_ref(q[r], k, v, causal=causal)
        return out, lse


@pytest.mark.parametrize("interleaved", [False, True])
def test_multi_level_cascade_attention_wrapper_decode(fw, interleaved):
    """FlashInfer's explicit levels (3 here) merge into plain attention over each request."""
    rng = np.random.default_rng(25)
    b = SharedPrefixBatch(rng, [5, 1, 9, 4, 13])
    q = rand(rng, (5, 8, 64), np.float32)
    w = flashkv.MultiLevelCascadeAttentionWrapper(3, to_fw(WS, fw))
    qo, kv_indptr, indices, last = b.levels()
    w.plan([to_fw(x, fw) for x in qo], [to_fw(x, fw) for x in kv_indptr],
           [to_fw(x, fw) for x in indices], [to_fw(x, fw) for x in last], 8, 2, 64, 4,
           q_data_type="float32")
    cache = (np.stack([b.k, b.v], axis=1) if interleaved else (to_fw(b.k, fw), to_fw(b.v, fw)))
    out = w.run(to_fw(q, fw), to_fw(cache, fw) if interleaved else cache)
    ref, ref_lse = b.reference(q, causal=False)
    assert_close(out, ref, np.float32)
    out, lse = w.run(to_fw(q, fw), to_fw(cache, fw) if interleaved else cache, return_lse=True)
    np.testing.assert_allclose(to_np(lse), ref_lse * np.log2(np.e), rtol=1e-5, atol=1e-5)


def test_multi_level_cascade_attention_wrapper_causal_append():
    rng = np.random.default_rng(26)
    b = SharedPrefixBatch(rng, [5, 3, 9, 4], qo_lens=[2, 3, 1, 4])
    q = rand(rng, (10, 8, 64), np.float32)
    w = flashkv.MultiLevelCascadeAttentionWrapper(3, WS)
    w.plan(*b.levels(), 8, 2, 64, 4, causal=True, q_data_type=np.float32)
    ref, _ = b.reference(q, causal=True)
    assert_close(w.run(q, (b.k, b.v)), ref, np.float32)


@pytest.mark.parametrize("decode", [True, False])
def test_multi_level_cascade_wrapper_host(fw, decode):
    """flashkv's automatic wrapper takes the plain page table; on the host it runs the reference
    of the plain attention the cascade computes."""
    rng = np.random.default_rng(27)
    qo_lens = None if decode else [2, 1, 3, 1, 5]
    b = SharedPrefixBatch(rng, [5, 1, 9, 4, 13], qo_lens)
    rows = 5 if decode else 12
    q = rand(rng, (rows, 8, 64), np.float32)
    indptr, indices, last = b.table()
    w = flashkv.MultiLevelCascadeWrapper(to_fw(WS, fw))
    w.plan(None if decode else to_fw(b.qo_indptr(), fw), to_fw(indptr, fw), to_fw(indices, fw),
           to_fw(last, fw), 8, 2, 64, 4, causal=True, q_data_type="float32",
           use_cascade="always")
    out, lse = w.run(to_fw(q, fw), (to_fw(b.k, fw), to_fw(b.v, fw)), return_lse=True)
    ref, ref_lse = b.reference(q, causal=not decode)
    assert_close(out, ref, np.float32)
    np.testing.assert_allclose(to_np(lse), ref_lse * np.log2(np.e), rtol=1e-5, atol=1e-5)
    assert w.plan_info() == {}


def test_cascade_wrapper_errors():
    rng = np.random.default_rng(28)
    b = SharedPrefixBatch(rng, [5, 1, 9, 4])
    with pytest.raises(ValueError, match="num_levels"):
        flashkv.MultiLevelCascadeAttentionWrapper(0, WS)
    w = flashkv.MultiLevelCascadeAttentionWrapper(2, WS)
    with pytest.raises(ValueError, match="qo_indptr_arr: expected 2 arrays"):
        w.plan(*b.levels(), 8, 2, 64, 4)
    with pytest.raises(ValueError, match="qo_indptr_buf_arr: expected a list of 2"):
        flashkv.MultiLevelCascadeAttentionWrapper(2, WS, use_cuda_graph=True)
    with pytest.raises(NotImplementedError, match="pos_encoding_mode"):
        flashkv.MultiLevelCascadeAttentionWrapper(3, WS).plan(
            *b.levels(), 8, 2, 64, 4, pos_encoding_mode="ROPE_LLAMA")
    auto = flashkv.MultiLevelCascadeWrapper(WS)
    indptr, indices, last = b.table()
    with pytest.raises(ValueError, match="use_cascade"):
        auto.plan(None, indptr, indices, last, 8, 2, 64, 4, use_cascade="sometimes")
    with pytest.raises(ValueError, match="the cache may be fp8"):
        auto.plan(None, indptr, indices, last, 8, 2, 64, 4, kv_data_type="bfloat16")
    with pytest.raises(ValueError, match="max_levels"):
        flashkv.MultiLevelCascadeWrapper(WS, max_levels=5)
    with pytest.raises(ValueError, match="before a successful plan"):
        auto.run(np.zeros((4, 8, 64), np.float16), (b.k, b.v))
