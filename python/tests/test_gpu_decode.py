"""GPU tests of decode: single_decode_with_kv_cache and BatchDecodeWithPagedKVCacheWrapper on
CUDA torch tensors against torch's float32 SDPA on the gathered KV (the tolerance rule of
gpu_helpers.check_out), the kernel shape the plan picks for the batch, and fixed_split_size beyond
the dynamic-splitting workspace. Skipped unless torch with CUDA and a GPU are present.
"""

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
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("heads", [(32, 8), (8, 8)])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_single_decode(dtype, head_dim, heads, layout):
    g = gen(1)
    hq, hk = heads
    for kv_len in (1, 333):
        shape = (kv_len, hk, head_dim) if layout == "NHD" else (hk, kv_len, head_dim)
        q, k, v = rand((hq, head_dim), dtype, g), rand(shape, dtype, g), rand(shape, dtype, g)
        out, lse = flashkv.single_decode_with_kv_cache(q, k, v, kv_layout=layout,
                                                       return_lse=True)
        assert out.is_cuda and out.dtype == q.dtype
        kn, vn = (k, v) if layout == "NHD" else (k.transpose(0, 1), v.transpose(0, 1))
        ref, ref_lse = sdpa_ref(q[None], kn, vn)
        check_out(out, ref[0], dtype)
        check_lse(lse, ref_lse[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads_dim", [(32, 8, 128), (8, 8, 128), (16, 2, 64), (8, 1, 256)])
def test_batch_decode(dtype, layout, interleaved, page_size, heads_dim):
    g = gen(3)
    hq, hk, d = heads_dim
    kv_lens = [1, 0, 129, 2000, 17, page_size]
    cache = Paged(kv_lens, page_size, hk, d, dtype, layout, g)
    q = rand((len(kv_lens), hq, d), dtype, g)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace(), layout)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, page_size,
           q_data_type=tdtype(dtype))
    out, lse = w.run(q, cache.cache(interleaved), return_lse=True)
    for i in range(len(kv_lens)):
        ref, ref_lse = sdpa_ref(q[i:i + 1], *cache.gather(i))
        check_out(out[i], ref[0], dtype)
        check_lse(lse[i], ref_lse[0])


@pytest.mark.parametrize("lens_shape", [([3000] * 4, (1, 8)), ([2048] * 48, (4, 2)),
                                        ([3000, 1000, 2000, 17], (2, 4))])
def test_batch_decode_kernel_shape_follows_the_batch(lens_shape):
    # The C++ auto rule (src/ops/decode/decode_shape_choice.cpp), seen through plan_info(): one
    # CTA of 8 warps per SM for a few equal requests, 4 of 2 warps for a large batch, else 2 of 4.
    kv_lens, (ctas, warps) = lens_shape
    g = gen(29)
    hq, hk, d, ps, dtype = 32, 8, 128, 16, "float16"
    cache = Paged(kv_lens, ps, hk, d, dtype, "NHD", g)
    q = rand((len(kv_lens), hq, d), dtype, g)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD")
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           q_data_type=tdtype(dtype))
    info = w.plan_info()
    assert (info["ctas_per_sm"], info["warps"]) == (ctas, warps)
    out = w.run(q, cache.cache(False))
    for i in range(0, len(kv_lens), 7):
        ref, _ = sdpa_ref(q[i:i + 1], *cache.gather(i))
        check_out(out[i], ref[0], dtype)


def test_batch_decode_fixed_split_size_beyond_dynamic_capacity():
    # fixed_split_size (in pages) of 1 page cuts 16 requests of 4000 tokens into 250 chunks each
    # per KV head: 4000 partial states per head, more than the dynamic-splitting workspace holds
    # (2 per CTA); the wrapper sizes it for the plan's chunks (BatchDecodeConfig.max_kv_tokens).
    g = gen(31)
    hq, hk, d, ps, dtype = 8, 2, 64, 16, "float16"
    kv_lens = [4000] * 15 + [3]
    cache = Paged(kv_lens, ps, hk, d, dtype, "NHD", g)
    q = rand((len(kv_lens), hq, d), dtype, g)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace(256), "NHD")
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           q_data_type=tdtype(dtype), fixed_split_size=1)
    out = w.run(q, cache.cache(False))
    for i in (0, 7, 14, 15):
        ref, _ = sdpa_ref(q[i:i + 1], *cache.gather(i))
        check_out(out[i], ref[0], dtype)
