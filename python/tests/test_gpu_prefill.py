"""GPU tests of prefill: single_prefill_with_kv_cache and the paged and ragged batch prefill
wrappers on CUDA torch tensors against torch's float32 SDPA (causal or not), and the backends
(fa2: mma.sync; fa3: the Hopper wgmma kernel; auto). Skipped unless torch with CUDA and a GPU are
present.
"""

import numpy as np
import pytest

import flashkv

from conftest import requires_gpu
from gpu_helpers import DTYPES, Paged, check_lse, check_out, gen, rand, sdpa_ref, tdtype, workspace

try:
    import torch
except ImportError:  # the module is skipped (requires_gpu) without torch
    torch = None

pytestmark = requires_gpu


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens", [(128, 128), (7, 500), (65, 33), (1, 1)])
def test_single_prefill(dtype, causal, lens):
    g = gen(2)
    hq, hk, d = 32, 8, 128
    q = rand((lens[0], hq, d), dtype, g)
    k, v = rand((lens[1], hk, d), dtype, g), rand((lens[1], hk, d), dtype, g)
    out, lse = flashkv.single_prefill_with_kv_cache(q, k, v, causal=causal, return_lse=True)
    ref, ref_lse = sdpa_ref(q, k, v, causal=causal)
    check_out(out, ref, dtype)
    check_lse(lse, ref_lse)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_batch_prefill_paged(dtype, layout, interleaved, causal):
    g = gen(4)
    hq, hk, d, ps = 32, 8, 128, 16
    qo_lens = [17, 0, 130, 1, 4, 9]
    kv_lens = [17, 40, 700, 0, 4096, 3]  # kv 0 and kv < qo (causal rows that see nothing)
    cache = Paged(kv_lens, ps, hk, d, dtype, layout, g)
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32)
    q = rand((sum(qo_lens), hq, d), dtype, g)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(workspace(), layout)
    w.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           causal=causal, q_data_type=tdtype(dtype))
    out, lse = w.run(q, cache.cache(interleaved), return_lse=True)
    for i in range(len(qo_lens)):
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        if rows.start == rows.stop:
            continue
        ref, ref_lse = sdpa_ref(q[rows], *cache.gather(i), causal=causal)
        check_out(out[rows], ref, dtype)
        check_lse(lse[rows], ref_lse)


def _is_sm90():
    return torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.parametrize("backend", ["auto", "fa2", "fa3"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_prefill_backends(backend, dtype):
    # fa2: the mma.sync kernel; fa3: the Hopper wgmma kernel (sm_90a, 128-row query tiles: the
    # heuristic picks them for these lengths); auto: wgmma where it applies. Same answers.
    if backend == "fa3" and not _is_sm90():
        pytest.skip("the wgmma prefill kernel needs an sm_90a GPU")
    g = gen(41)
    hq, hk, d, ps = 32, 8, 128, 16
    qo_lens = [300, 77, 1, 512]
    kv_lens = [300, 900, 60, 2000]
    cache = Paged(kv_lens, ps, hk, d, dtype, "NHD", g)
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32)
    q = rand((sum(qo_lens), hq, d), dtype, g)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", backend=backend)
    w.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           causal=True, q_data_type=tdtype(dtype))
    info = w.plan_info()
    assert info["tile_rows"] == 128
    assert info["wgmma"] == (backend == "fa3" or (backend == "auto" and _is_sm90()))
    out, lse = w.run(q, cache.cache(False), return_lse=True)
    # 16-token pages: the wgmma kernel loads them by TMA (its warp-specialized form).
    assert w.plan_info()["kv_tma"] == info["wgmma"]
    for i in range(len(qo_lens)):
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        ref, ref_lse = sdpa_ref(q[rows], *cache.gather(i), causal=True)
        check_out(out[rows], ref, dtype)
        check_lse(lse[rows], ref_lse)


def test_batch_prefill_fa3_takes_full_tiles_and_refuses_key_rope():
    # "fa3" plans the wgmma kernel's 128-row tiles even for short queries (the heuristic's tile
    # would be 16 rows here), runs logits variants (soft-cap) and raises for fused RoPE, which
    # rewrites the staged keys (mma.sync only).
    if not _is_sm90():
        pytest.skip("the wgmma prefill kernel needs an sm_90a GPU")
    g = gen(42)
    hq, hk, d, ps, dtype = 32, 8, 128, 16, "float16"
    cache = Paged([40, 300], ps, hk, d, dtype, "NHD", g)
    qo_indptr = torch.tensor([0, 4, 7], dtype=torch.int32)
    q = rand((7, hq, d), dtype, g)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", backend="fa3")
    w.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           causal=True, q_data_type=torch.float16)
    assert w.plan_info()["tile_rows"] == 128 and w.plan_info()["wgmma"]
    out = w.run(q, cache.cache(False))
    for i in range(2):
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        check_out(out[rows], sdpa_ref(q[rows], *cache.gather(i), causal=True)[0], dtype)
    w.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           causal=True, q_data_type=torch.float16, logits_soft_cap=30.0)
    assert w.plan_info()["wgmma"]
    with pytest.raises(Exception, match="rewrites keys"):
        w.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
               causal=True, q_data_type=torch.float16, pos_encoding_mode="ROPE_LLAMA")


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_single_prefill_backends(backend):
    if backend == "fa3" and not _is_sm90():
        pytest.skip("the wgmma prefill kernel needs an sm_90a GPU")
    g = gen(43)
    q = rand((300, 32, 128), "bfloat16", g)
    k = rand((700, 8, 128), "bfloat16", g)
    v = rand((700, 8, 128), "bfloat16", g)
    out = flashkv.single_prefill_with_kv_cache(q, k, v, causal=True, backend=backend)
    check_out(out, sdpa_ref(q, k, v, causal=True)[0], "bfloat16")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [False, True])
def test_batch_prefill_ragged(dtype, layout, causal):
    g = gen(5)
    hq, hk, d = 16, 4, 128
    qo_lens, kv_lens = [33, 1, 0, 200], [33, 64, 5, 1000]
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32)
    kv_indptr = torch.tensor(np.concatenate([[0], np.cumsum(kv_lens)]), dtype=torch.int32)
    q = rand((sum(qo_lens), hq, d), dtype, g)
    k, v = rand((sum(kv_lens), hk, d), dtype, g), rand((sum(kv_lens), hk, d), dtype, g)
    w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(workspace(), layout)
    w.plan(qo_indptr.cuda(), kv_indptr.cuda(), hq, hk, d, causal=causal,
           q_data_type=tdtype(dtype))
    kl, vl = (k, v) if layout == "NHD" else (k.transpose(0, 1).contiguous(),
                                              v.transpose(0, 1).contiguous())
    out, lse = w.run(q, kl, vl, return_lse=True)
    for i in range(len(qo_lens)):
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        kv = slice(int(kv_indptr[i]), int(kv_indptr[i + 1]))
        if rows.start == rows.stop:
            continue
        ref, ref_lse = sdpa_ref(q[rows], k[kv], v[kv], causal=causal)
        check_out(out[rows], ref, dtype)
        check_lse(lse[rows], ref_lse)
