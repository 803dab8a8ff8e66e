"""GPU tests of both cascade wrappers (MultiLevelCascadeWrapper, FlashInfer's
MultiLevelCascadeAttentionWrapper) on caches whose requests share prefixes, against plain decode
and torch's float32 SDPA. Skipped unless torch with CUDA and a GPU are present.
"""

import numpy as np
import pytest

import flashkv

from conftest import UNIT_ROUNDOFF, requires_gpu
from gpu_helpers import (DTYPES, Paged, check_lse, check_out, gen, i32, rand, rel_err, sdpa_ref,
                         tdtype, workspace)

try:
    import torch
except ImportError:  # the module is skipped (requires_gpu) without torch
    torch = None

pytestmark = requires_gpu


class SharedPaged(Paged):
    """A paged cache whose requests share prefixes: `groups` lists (prefix pages, members);
    requests in no group have only their own pages. Page ids are scattered at random."""

    def __init__(self, prefix_pages, members, suffix_lens, page_size, hk, d, dtype, layout, g):
        self.page_size, self.layout = page_size, layout
        rng = np.random.default_rng(len(suffix_lens))
        prefixes, nxt = [], 0
        for n in prefix_pages:
            prefixes.append(list(range(nxt, nxt + n)))
            nxt += n
        lists, kv_lens, last = [], [], []
        for m, n in zip(members, suffix_lens):
            own = list(range(nxt, nxt + (n + page_size - 1) // page_size))
            nxt += len(own)
            pre = prefixes[m] if m is not None else []
            lists.append(pre + own)
            kv_lens.append(len(pre) * page_size + n)
            last.append(n - (len(own) - 1) * page_size)
        num_pages = nxt + 5
        perm = rng.permutation(num_pages)
        self.prefixes = [[int(perm[p]) for p in pre] for pre in prefixes]
        self.own = [[int(perm[p]) for p in lst[len(lst) - (n + page_size - 1) // page_size:]]
                    for lst, n in zip(lists, suffix_lens)]
        self.members, self.kv_lens, self.suffix_lens = list(members), kv_lens, list(suffix_lens)
        flat = [int(perm[p]) for lst in lists for p in lst]
        self.indptr = i32(np.concatenate([[0], np.cumsum([len(x) for x in lists])]))
        self.indices = i32(flat)
        self.last_page_len = i32(last)
        inner = (page_size, hk, d) if layout == "NHD" else (hk, page_size, d)
        self.kv = rand((num_pages, 2) + inner, dtype, g)
        self.k, self.v = self.kv[:, 0].contiguous(), self.kv[:, 1].contiguous()

    def levels(self, qo_lens):
        """FlashInfer's 2-level arrays (level 0: the groups' prefixes, level 1: suffixes), for
        requests ordered by group, as they are here."""
        rows = np.concatenate([[0], np.cumsum(qo_lens)])
        groups = sorted(set(m for m in self.members if m is not None))
        qo0, kv0, idx0, last0 = [0], [0], [], []
        for gi in groups:
            last_member = max(i for i, m in enumerate(self.members) if m == gi)
            qo0.append(int(rows[last_member + 1]))
            idx0 += self.prefixes[gi]
            kv0.append(len(idx0))
            last0.append(self.page_size)
        if qo0[-1] != rows[-1]:  # requests in no group: an empty group
            qo0.append(int(rows[-1]))
            kv0.append(len(idx0))
            last0.append(0)
        own = [p for lst in self.own for p in lst]
        kv1 = np.concatenate([[0], np.cumsum([len(x) for x in self.own])])
        last1 = [n - (len(o) - 1) * self.page_size for n, o in zip(self.suffix_lens, self.own)]
        return ([i32(qo0), i32(rows)], [i32(kv0), i32(kv1)], [i32(idx0), i32(own)],
                [i32(last0), i32(last1)])


def shared_batch(dtype, layout, g):
    # Requests 0-3 share a 1024-token prefix, 4-7 a 512-token one, request 8 shares nothing.
    return SharedPaged([64, 32], [0, 0, 0, 0, 1, 1, 1, 1, None],
                       [1, 17, 100, 5, 33, 16, 2, 250, 40], 16, 8, 128, dtype, layout, g)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("use", ["always", "auto"])
def test_cascade_wrapper_decode_matches_plain_decode(dtype, layout, use):
    g = gen(18)
    hq, hk, d, ps = 32, 8, 128, 16
    c = shared_batch(dtype, layout, g)
    b = len(c.kv_lens)
    q = rand((b, hq, d), dtype, g)
    plain = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace(), layout)
    plain.plan(c.indptr, c.indices, c.last_page_len, hq, hk, d, ps, q_data_type=tdtype(dtype))
    ref_out, ref_lse = plain.run(q, c.kv, return_lse=True)
    w = flashkv.MultiLevelCascadeWrapper(workspace(), layout)
    w.plan(None, c.indptr, c.indices, c.last_page_len, hq, hk, d, ps, q_data_type=tdtype(dtype),
           use_cascade=use)
    if use == "always":
        info = w.plan_info()
        assert info["cascade"] and info["num_levels"] >= 2
        assert info["cascade_kv_bytes"] < info["plain_kv_bytes"]
    out, lse = w.run(q, c.kv, return_lse=True)
    # Both within the tolerance rule of the exact result (about 2u each; the cascade rounds each
    # level's output once more), so within 4u of each other.
    assert rel_err(out.float(), ref_out.float()) <= 4 * UNIT_ROUNDOFF[dtype]
    for i in range(b):
        ref, ref_l = sdpa_ref(q[i:i + 1], *c.gather(i))
        check_out(out[i], ref[0], dtype)
        check_lse(lse[i], ref_l[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_cascade_wrapper_causal_append(dtype):
    g = gen(19)
    hq, hk, d, ps = 32, 8, 128, 16
    c = shared_batch(dtype, "NHD", g)
    qo_lens = [1, 4, 7, 2, 3, 1, 2, 9, 5]
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32)
    q = rand((sum(qo_lens), hq, d), dtype, g)
    w = flashkv.MultiLevelCascadeWrapper(workspace())
    w.plan(qo_indptr, c.indptr, c.indices, c.last_page_len, hq, hk, d, ps, causal=True,
           q_data_type=tdtype(dtype), use_cascade="always")
    assert w.plan_info()["cascade"]
    out, lse = w.run(q, (c.k, c.v), return_lse=True)
    for i in range(len(qo_lens)):
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        ref, ref_l = sdpa_ref(q[rows], *c.gather(i), causal=True)
        check_out(out[rows], ref, dtype)
        check_lse(lse[rows], ref_l)


@pytest.mark.parametrize("dtype", DTYPES)
def test_flashinfer_cascade_wrapper_matches_plain_decode(dtype):
    """FlashInfer's explicit 2-level arrays (shared prefixes, then suffixes) on the GPU."""
    g = gen(20)
    hq, hk, d, ps = 32, 8, 128, 16
    c = shared_batch(dtype, "NHD", g)
    b = len(c.kv_lens)
    q = rand((b, hq, d), dtype, g)
    w = flashkv.MultiLevelCascadeAttentionWrapper(2, workspace(), "NHD")
    w.plan(*c.levels([1] * b), hq, hk, d, ps, q_data_type=tdtype(dtype))
    out, lse = w.run(q, c.kv, return_lse=True)
    plain = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace())
    plain.plan(c.indptr, c.indices, c.last_page_len, hq, hk, d, ps, q_data_type=tdtype(dtype))
    ref_out = plain.run(q, c.kv)
    assert rel_err(out.float(), ref_out.float()) <= 4 * UNIT_ROUNDOFF[dtype]  # as above
    for i in range(b):
        ref, ref_l = sdpa_ref(q[i:i + 1], *c.gather(i))
        check_out(out[i], ref[0], dtype)
        check_lse(lse[i], ref_l[0])
