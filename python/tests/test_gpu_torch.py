"""GPU tests of the torch custom ops (flashkv._torch_ops) on the GPU kernels: opcheck of every op
(schema, fake tensors, autograd registration, AOT dispatch), and torch.compile(fullgraph=True) of
decode, a decode layer (RoPE + append + decode + merge) and prefill, bitwise equal to eager.
Skipped unless torch with CUDA and a GPU are present.
"""

import numpy as np
import pytest

import flashkv

from conftest import requires_gpu
from gpu_helpers import (DTYPES, Paged, check_lse, check_out, gen, i32, rand, sdpa_ref, tdtype,
                         workspace)

try:
    import torch
except ImportError:  # the module is skipped (requires_gpu) without torch
    torch = None

pytestmark = requires_gpu


def torch_op_cases(dtype):
    """{case: (op name, args)} on CUDA tensors, and the wrappers the args' handles name (keep
    them alive while the ops run)."""
    g = gen(21)
    hq, hk, d, ps = 32, 8, 128, 16
    dt = tdtype(dtype)
    c = Paged([100, 1, 2000, 17], ps, hk, d, dtype, "NHD", g)
    dec = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace(32))
    dec.plan(c.indptr, c.indices, c.last_page_len, hq, hk, d, ps, q_data_type=dt)
    q = rand((4, hq, d), dtype, g)
    qo_lens = [3, 1, 40, 17]
    pre = flashkv.BatchPrefillWithPagedKVCacheWrapper(workspace(64))
    pre.plan(torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32),
             c.indptr, c.indices, c.last_page_len, hq, hk, d, ps, causal=True, q_data_type=dt)
    pq = rand((sum(qo_lens), hq, d), dtype, g)
    rag = flashkv.BatchPrefillWithRaggedKVCacheWrapper(workspace(64))
    rag.plan(i32([0, 4, 13]), i32([0, 30, 39]), hq, hk, d, causal=True, q_data_type=dt)
    rq = rand((13, hq, d), dtype, g)
    rk, rv = rand((39, hk, d), dtype, g), rand((39, hk, d), dtype, g)
    v = rand((37, 2, hq, d), dtype, g)
    s = torch.rand((37, 2, hq), generator=g, device="cuda") * 8 - 4
    va, sa = v[:, 0].contiguous(), s[:, 0].contiguous()
    vb, sb = v[:, 1].contiguous(), s[:, 1].contiguous()
    a = Paged([18, 3], ps, hk, d, dtype, "NHD", g)  # after appending one token each
    keys, values = rand((2, hk, d), dtype, g), rand((2, hk, d), dtype, g)
    append = (keys, values, i32([0, 1]), i32([17, 2]))
    table = (a.indices, a.indptr, a.last_page_len, "NHD")
    rope_q, rope_k = rand((6, hq, d), dtype, g), rand((6, hk, d), dtype, g)
    rope_pos = i32([0, 5, 9, 100, 3, 70000])
    llama31 = ("llama31", 0, False, 8.0, 5e5, 1.0, 4.0, 8192.0)
    lse = torch.empty(4, hq, device="cuda")
    cases = {
        "decode": ("batch_decode_run", (q, c.k, c.v, dec._handle, dt, True)),
        "decode_interleaved": ("batch_decode_run", (q, c.kv[:, 0], c.kv[:, 1], dec._handle, dt,
                                                    False)),
        "decode_out": ("batch_decode_run_out", (q, c.k, c.v, torch.empty_like(q), lse,
                                                dec._handle)),
        "prefill": ("batch_prefill_paged_run", (pq, c.k, c.v, pre._handle, dt, True)),
        "prefill_out": ("batch_prefill_paged_run_out", (pq, c.k, c.v, torch.empty_like(pq), None,
                                                        pre._handle)),
        "ragged": ("batch_prefill_ragged_run", (rq, rk, rv, rag._handle, dt, True)),
        "merge_state": ("merge_state", (va, sa, vb, sb)),
        "merge_state_in_place": ("merge_state_in_place", (va.clone(), sa.clone(), vb, sb)),
        "merge_states": ("merge_states", (v, s)),
        "append": ("append_paged_kv_cache", append + (a.k.clone(), a.v.clone()) + table),
        "append_interleaved": ("append_paged_kv_cache", append + (a.kv.clone(), None) + table),
        "rope_pos_ids": ("rope_pos_ids", (rope_q, rope_k, rope_pos) + llama31),
        "rope_pos_ids_": ("rope_pos_ids_", (rope_q.clone(), rope_k.clone(), rope_pos) + llama31),
    }
    return cases, (dec, pre, rag)


TORCH_OP_CASES = ["decode", "decode_interleaved", "decode_out", "prefill", "prefill_out",
                  "ragged", "merge_state", "merge_state_in_place", "merge_states", "append",
                  "append_interleaved", "rope_pos_ids", "rope_pos_ids_"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", TORCH_OP_CASES)
def test_torch_opcheck(dtype, case):
    """Schema (declared mutations), fake tensors, autograd registration and AOT dispatch of every
    custom op, on the GPU kernels."""
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck missing (torch < 2.4)")
    cases, keep = torch_op_cases(dtype)
    name, args = cases[case]
    result = torch.library.opcheck(getattr(torch.ops.flashkv, name).default, args)
    assert all(v == "SUCCESS" for v in result.values()), result
    flashkv.check_device_errors()
    del keep


def replan_decode(w, lens, num_pages, ps, hq, hk, d, dtype, seed):
    pages = [(n + ps - 1) // ps for n in lens]
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32)
    perm = np.random.default_rng(seed).permutation(num_pages)[: sum(pages)]
    indices = torch.tensor(perm, dtype=torch.int32, device="cuda")
    last = torch.tensor([n - (p - 1) * ps if p else 0 for n, p in zip(lens, pages)],
                        dtype=torch.int32)
    w.plan(indptr, indices, last, hq, hk, d, ps, q_data_type=tdtype(dtype))
    return indptr, indices


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_compile_decode_run(dtype):
    """w.run() inside torch.compile(fullgraph=True) equals eager, bitwise, and the reference; a
    new plan (same batch size) runs in the compiled function without a recompile."""
    g = gen(22)
    hq, hk, d, ps, num_pages = 32, 8, 128, 16, 300
    kv = rand((num_pages, 2, ps, hk, d), dtype, g)
    q = rand((3, hq, d), dtype, g)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace())
    compiled = torch.compile(lambda q, kv: w.run(q, kv, return_lse=True), fullgraph=True)
    for step, lens in enumerate(([1000, 7, 2000], [1, 3000, 33], [16, 0, 4000])):
        indptr, indices = replan_decode(w, lens, num_pages, ps, hq, hk, d, dtype, step)
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            out, lse = compiled(q, kv)
        eager_out, eager_lse = w.run(q, kv, return_lse=True)
        assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
        for i in range(len(lens)):
            ids = indices[indptr[i]: indptr[i + 1]].long()
            k = kv[ids, 0].reshape(-1, hk, d)[: lens[i]]
            v = kv[ids, 1].reshape(-1, hk, d)[: lens[i]]
            ref, ref_lse = sdpa_ref(q[i:i + 1], k, v)
            check_out(out[i], ref[0], dtype)
            check_lse(lse[i], ref_lse[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_compile_decode_layer(dtype):
    """RoPE + append + decode + merge with a prefix state, one compiled graph
    (fullgraph=True: a call into flashkv._C would break it), bitwise equal to eager, the cache
    included (the append mutates a graph input)."""
    g = gen(23)
    hq, hk, d, ps = 32, 8, 128, 16
    lens = [100, 1, 2000, 17]  # after the append: the new token is at kv_len - 1
    c = Paged(lens, ps, hk, d, dtype, "NHD", g)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(c.indptr, c.indices, c.last_page_len, hq, hk, d, ps, q_data_type=tdtype(dtype))
    b = len(lens)
    q = rand((b, hq, d), dtype, g)
    k_new, v_new = rand((b, hk, d), dtype, g), rand((b, hk, d), dtype, g)
    pos, bi = i32([n - 1 for n in lens]), i32(list(range(b)))
    v_prefix = rand((b, hq, d), dtype, g)
    s_prefix = torch.rand((b, hq), generator=g, device="cuda") * 8

    def layer(q, k_new, v_new, kv):
        q, k_new = flashkv.apply_llama31_rope_pos_ids(q, k_new, pos)
        flashkv.append_paged_kv_cache(k_new, v_new, bi, pos, kv, c.indices, c.indptr,
                                      c.last_page_len)
        out, lse = w.run(q, kv, return_lse=True)
        return flashkv.merge_state(out, lse, v_prefix, s_prefix)

    kv_eager, kv_compiled = c.kv.clone(), c.kv.clone()
    ref = layer(q, k_new, v_new, kv_eager)
    got = torch.compile(layer, fullgraph=True)(q, k_new, v_new, kv_compiled)
    flashkv.check_device_errors()
    assert torch.equal(kv_compiled, kv_eager)
    assert not torch.equal(kv_eager, c.kv)  # it did append
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_torch_compile_prefill_run():
    g = gen(24)
    hq, hk, d, ps = 32, 8, 128, 16
    qo_lens, kv_lens = [17, 1, 300], [17, 700, 300]
    c = Paged(kv_lens, ps, hk, d, "float16", "NHD", g)
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32)
    q = rand((sum(qo_lens), hq, d), "float16", g)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(workspace())
    w.plan(qo_indptr, c.indptr, c.indices, c.last_page_len, hq, hk, d, ps, causal=True)
    out = torch.compile(lambda q, k, v: w.run(q, (k, v)), fullgraph=True)(q, c.k, c.v)
    assert torch.equal(out, w.run(q, (c.k, c.v)))
    for i in range(len(qo_lens)):
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        ref, _ = sdpa_ref(q[rows], *c.gather(i), causal=True)
        check_out(out[rows], ref, "float16")
