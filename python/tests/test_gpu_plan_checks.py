"""GPU side of test_plan_checks.py: the CUDA wrappers refuse the same plans with the same messages
as the host ones (the C++ checks of flashkv/plan_checks.h), and a host page table's id past the
cache is refused by run() naming the entry, before anything is launched: out and lse (poisoned)
keep every byte, and the KV cache of the fused step is not appended to. Skipped unless torch with
CUDA and a GPU are present."""

import os

import numpy as np
import pytest

import flashkv
from flashkv import _arrays as A

from conftest import requires_gpu

try:
    import torch
except ImportError:
    torch = None

pytestmark = requires_gpu

POISON = 7.0


def page_table(kv_lens, ps, spare=3, seed=0):
    pages = [(n + ps - 1) // ps for n in kv_lens]
    num_pages = sum(pages) + spare
    rng = np.random.default_rng(seed)
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = rng.permutation(num_pages)[: sum(pages)].astype(np.int32)
    last = np.array([n - (p - 1) * ps if p else 0 for n, p in zip(kv_lens, pages)], np.int32)
    return indptr, indices, last, num_pages


def cache(num_pages, ps, hk, d, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    k = (torch.rand((num_pages, ps, hk, d), generator=g, device="cuda") * 2 - 1).half()
    v = (torch.rand((num_pages, ps, hk, d), generator=g, device="cuda") * 2 - 1).half()
    return k, v


def poisoned(shape, dtype):
    return torch.full(shape, POISON, dtype=dtype, device="cuda")


def untouched(*ts):
    torch.cuda.synchronize()
    return all(bool((t == POISON).all()) for t in ts)


def workspace():
    return torch.empty(32 << 20, dtype=torch.uint8, device="cuda")


@pytest.mark.parametrize("args, message", [
    ((4, 2, 64, 0), r"page_size: expected >= 1, got 0"),
    ((7, 2, 64, 16), r"num_qo_heads = 7 is not divisible by num_kv_heads = 2"),
    ((4, 2, 100, 16), r"head_dim: expected 64, 128 or 256, got 100"),
])
def test_gpu_and_host_plans_refuse_alike(args, message):
    indptr, indices, last, _ = page_table([40, 3], 16)
    for ws in (workspace(), np.empty(16, np.uint8)):
        w = flashkv.BatchDecodeWithPagedKVCacheWrapper(ws)
        with pytest.raises(ValueError, match=message):
            w.plan(indptr, indices, last, *args)
        p = flashkv.BatchPrefillWithPagedKVCacheWrapper(ws)
        with pytest.raises(ValueError, match=message):
            p.plan(np.array([0, 2, 3], np.int32), indptr, indices, last, *args)
        c = flashkv.MultiLevelCascadeWrapper(ws)
        with pytest.raises(ValueError, match=message):
            c.plan(None, indptr, indices, last, *args)


@pytest.mark.parametrize("indices_on", ["host", "cuda"])
def test_gpu_decode_page_id_past_the_cache(indices_on):
    hq, hk, d, ps = 32, 8, 128, 16
    indptr, indices, last, num_pages = page_table([40, 3], ps)
    k, v = cache(num_pages, ps, hk, d)
    bad = indices.copy()
    bad[2] = num_pages + 1
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace())
    table = bad if indices_on == "host" else torch.from_numpy(bad).cuda()
    w.plan(indptr, table, last, hq, hk, d, ps)
    q = torch.rand((2, hq, d), device="cuda").half()
    out, lse = poisoned((2, hq, d), torch.float16), poisoned((2, hq), torch.float32)
    if indices_on == "cuda":
        if os.environ.get("FLASHKV_CHECK_DEVICE_ERRORS") == "1":
            pytest.skip("the device-error debug mode raises for this id (test_gpu_kv.py covers it)")
        # Device-resident ids are not read on the host (opt-in kernel check): the run goes ahead
        # and the bad page reads as zeros.
        w.run(q, (k, v), out=out, lse=lse)
        torch.cuda.synchronize()
        return
    with pytest.raises(ValueError, match=rf"indices\[2\] = {num_pages + 1} is out of range "
                                         rf"\[0, num_pages\): the paged KV cache given to run\(\) "
                                         rf"has {num_pages} pages"):
        w.run(q, (k, v), out=out, lse=lse)
    assert untouched(out, lse)
    k_new = torch.rand((2, hk, d), device="cuda").half()
    k0, v0 = k.clone(), v.clone()
    with pytest.raises(ValueError, match=r"indices\[2\]"):
        w.run_step(q, k_new, k_new, (k, v), out=out)
    assert untouched(out)
    assert torch.equal(k, k0) and torch.equal(v, v0)  # nothing appended
    # A cache with that page: the same plan runs.
    k2, v2 = cache(num_pages + 2, ps, hk, d, seed=2)
    w.run(q, (k2, v2), out=out)
    torch.cuda.synchronize()
    assert not untouched(out)
    # Negative ids: refused at plan().
    bad[1] = -1
    with pytest.raises(ValueError, match=r"indices\[1\] = -1 is out of range"):
        w.plan(indptr, bad, last, hq, hk, d, ps)


def test_gpu_prefill_and_cascade_page_id_past_the_cache():
    hq, hk, d, ps = 32, 8, 128, 16
    indptr, indices, last, num_pages = page_table([40, 3], ps)
    k, v = cache(num_pages, ps, hk, d)
    bad = indices.copy()
    bad[3] = num_pages
    qo = np.array([0, 5, 6], np.int32)
    p = flashkv.BatchPrefillWithPagedKVCacheWrapper(workspace())
    p.plan(qo, indptr, bad, last, hq, hk, d, ps, causal=True)
    q = torch.rand((6, hq, d), device="cuda").half()
    out, lse = poisoned((6, hq, d), torch.float16), poisoned((6, hq), torch.float32)
    with pytest.raises(ValueError, match=rf"paged_kv_indices\[3\] = {num_pages} is out of range"):
        p.run(q, (k, v), out=out, lse=lse)
    assert untouched(out, lse)

    c = flashkv.MultiLevelCascadeWrapper(workspace())
    c.plan(None, indptr, bad, last, hq, hk, d, ps)
    q2 = torch.rand((2, hq, d), device="cuda").half()
    out2, lse2 = poisoned((2, hq, d), torch.float16), poisoned((2, hq), torch.float32)
    with pytest.raises(ValueError, match=rf"paged_kv_indices\[3\] = {num_pages} is out of range"):
        c.run(q2, (k, v), out=out2, lse=lse2)
    assert untouched(out2, lse2)
    # The C++ cascade checks too (its plan always has the host ids): straight through _C.
    with pytest.raises(ValueError, match=rf"kv_indices\[3\] = {num_pages} is out of range"):
        A.call(c._slot.op.run, q2, k, v, "NHD", out2, lse2,
               torch.cuda.current_stream().cuda_stream)
    assert untouched(out2, lse2)


def test_gpu_single_decode_names_the_layout():
    k = torch.rand((10, 2, 64), device="cuda").half()  # NHD
    q = torch.rand((8, 64), device="cuda").half()
    match = r"k: with kv_layout 'HND' expected \[num_kv_heads, kv_len, head_dim\]"
    with pytest.raises(ValueError, match=match):
        flashkv.single_decode_with_kv_cache(q, k, k, kv_layout="HND")
    with pytest.raises(ValueError, match=match):  # a variant: through a BatchDecode
        flashkv.single_decode_with_kv_cache(q, k, k, kv_layout="HND", logits_soft_cap=30.0)
    q3 = torch.rand((3, 8, 64), device="cuda").half()
    with pytest.raises(ValueError, match=match):
        flashkv.single_prefill_with_kv_cache(q3, k, k, kv_layout="HND")
    with pytest.raises(ValueError, match=match):
        flashkv.single_prefill_with_kv_cache(q3, k, k, kv_layout="HND", logits_soft_cap=30.0)
