"""GPU tests of the KV-cache ops and RoPE: get_batch_indices_positions and append_paged_kv_cache,
and every RoPE form (in place and out of place, the cos/sin cache), on CUDA tensors against the
CPU path; errors recorded by the kernels (check_device_errors). Skipped unless torch with CUDA
and a GPU are present.
"""

import numpy as np
import pytest

import flashkv

from conftest import requires_gpu
from gpu_helpers import (DTYPES, Paged, assert_caches_equal, clone_cache, cpu_cache, flat, gen, i32,
                         rand)

try:
    import torch
except ImportError:  # the module is skipped (requires_gpu) without torch
    torch = None

pytestmark = requires_gpu


@pytest.mark.parametrize("dtype", DTYPES + ["float32"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
def test_append_matches_cpu(dtype, layout, interleaved, page_size):
    """get_batch_indices_positions and append_paged_kv_cache on CUDA tensors equal the CPU path
    (a bitwise copy), for strided new keys/values."""
    g = gen(11)
    hk, d = 8, 128
    seq_lens = [1, 37, 16, 5, 300]  # after the append
    append_lens = [1, 37, 3, 0, 129]
    cache = Paged(seq_lens, page_size, hk, d, dtype, layout, g)
    nnz = sum(append_lens)
    append_indptr = i32(np.concatenate([[0], np.cumsum(append_lens)]))
    bi, pos = flashkv.get_batch_indices_positions(append_indptr, i32(seq_lens), nnz)
    bi_h, pos_h = flashkv.get_batch_indices_positions(append_indptr.cpu(), i32(seq_lens).cpu(),
                                                      nnz)
    assert bi.is_cuda and torch.equal(bi.cpu(), bi_h) and torch.equal(pos.cpu(), pos_h)
    packed = rand((nnz, 2 * hk * d), dtype, g)  # new k / v: strided views of one projection
    keys, values = packed[:, : hk * d].view(nnz, hk, d), packed[:, hk * d:].view(nnz, hk, d)
    on_gpu = clone_cache(cache.cache(interleaved))
    on_cpu = cpu_cache(on_gpu)
    flashkv.append_paged_kv_cache(keys, values, bi, pos, on_gpu, cache.indices, cache.indptr,
                                  cache.last_page_len, kv_layout=layout)
    flashkv.append_paged_kv_cache(keys.cpu(), values.cpu(), bi_h, pos_h, on_cpu,
                                  cache.indices.cpu(), cache.indptr.cpu(),
                                  cache.last_page_len.cpu(), kv_layout=layout)
    flashkv.check_device_errors()
    assert_caches_equal(on_gpu, on_cpu)
    assert not torch.equal(flat(on_gpu), flat(cache.cache(interleaved)))  # it did write


def test_append_device_error_is_reported_and_the_token_skipped():
    g = gen(12)
    cache = Paged([5, 9], 16, 8, 128, "float16", "NHD", g)
    keys = rand((2, 8, 128), "float16", g)
    flashkv.check_device_errors()  # nothing pending
    before = cache.kv.clone()
    flashkv.append_paged_kv_cache(keys, keys, i32([0, 1]), i32([4, 9]), cache.kv, cache.indices,
                                  cache.indptr, cache.last_page_len)
    with pytest.raises(ValueError, match=r"positions\[1\] = 9 is outside request 1's KV length"):
        flashkv.check_device_errors()
    flashkv.check_device_errors()  # raised once, then cleared
    page0 = int(cache.indices[0])
    expected = before.clone()
    expected[page0, 0, 4] = keys[0]
    expected[page0, 1, 4] = keys[0]
    assert torch.equal(cache.kv, expected)  # token 0 written, token 1 skipped


# Agreement of the GPU RoPE (f32 rotation) with the CPU reference (double, rounded once): one
# rounding flip (relative) plus the f32 error of rotated values that cancel (absolute).
ROPE_TOL = {"float16": dict(rtol=2.0**-10, atol=1e-5), "bfloat16": dict(rtol=2.0**-7, atol=1e-5),
            "float32": dict(rtol=1e-5, atol=1e-5)}


def rope_cases(d, rotary_dim, interleave, indptr, offsets, pos, cos_sin):
    """(name, out-of-place fn, in-place fn, args after q and k) for every RoPE form."""
    kw = dict(rotary_dim=rotary_dim, interleave=interleave)
    return [
        ("rope", flashkv.apply_rope, flashkv.apply_rope_inplace, (indptr, offsets),
         dict(kw, rope_theta=5e5)),
        ("rope_pos_ids", flashkv.apply_rope_pos_ids, flashkv.apply_rope_pos_ids_inplace, (pos,),
         dict(kw, rope_scale=2.0)),
        ("llama31", flashkv.apply_llama31_rope, flashkv.apply_llama31_rope_inplace,
         (indptr, offsets), kw),
        ("llama31_pos_ids", flashkv.apply_llama31_rope_pos_ids,
         flashkv.apply_llama31_rope_pos_ids_inplace, (pos,), dict(kw, old_context_len=4096)),
    ]


@pytest.mark.parametrize("dtype", DTYPES + ["float32"])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("dims", [(128, None), (128, 64), (64, 32), (256, None)])
def test_rope_matches_cpu(dtype, interleave, dims):
    """Every RoPE form on CUDA tensors (strided views of a packed qkv) against the CPU path;
    in place equals out of place bitwise."""
    g = gen(13)
    d, rotary_dim = dims
    nnz, hq, hk = 37, 32, 8
    qkv = rand((nnz, (hq + 2 * hk) * d), dtype, g) * 4
    q = qkv[:, : hq * d].view(nnz, hq, d)
    k = qkv[:, hq * d: (hq + hk) * d].view(nnz, hk, d)
    indptr, offsets = i32([0, 5, 5, 6, 37]), i32([0, 9000, 3, 100000])
    pos = torch.randint(0, 1 << 17, (nnz,), generator=g, device="cuda")  # int64: converted
    for name, fn, fn_inplace, where, kw in rope_cases(d, rotary_dim, interleave, indptr, offsets,
                                                      pos, None):
        q_rope, k_rope = fn(q, k, *where, **kw)
        q_ref, k_ref = fn(q.cpu(), k.cpu(), *(x.cpu() for x in where), **kw)
        torch.testing.assert_close(q_rope.cpu(), q_ref, **ROPE_TOL[dtype], msg=name)
        torch.testing.assert_close(k_rope.cpu(), k_ref, **ROPE_TOL[dtype], msg=name)
        qi, ki = q.clone(), k.clone()
        assert fn_inplace(qi, ki, *where, **kw) is None
        assert torch.equal(qi, q_rope) and torch.equal(ki, k_rope), name
    flashkv.check_device_errors()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [128, 64])
def test_rope_cos_sin_cache_matches_cpu(dtype, is_neox, rotary_dim):
    """vLLM's layout: query/key [nnz, heads * head_size], a float32 cos/sin cache."""
    g = gen(14)
    nnz, hq, hk, d = 29, 32, 8, 128
    query = rand((nnz, hq * d), dtype, g) * 4
    key = rand((nnz, hk * d), dtype, g) * 4
    freqs = 1e4 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    ang = torch.arange(8192, dtype=torch.float64)[:, None] * freqs[None, :]
    cache = torch.cat([ang.cos(), ang.sin()], dim=1).float()
    positions = torch.randint(0, 8192, (nnz,), generator=g, device="cuda").to(torch.int32)
    q_out, k_out = flashkv.apply_rope_with_cos_sin_cache(positions, query, key, d, cache.cuda(),
                                                         is_neox)
    assert q_out.shape == query.shape and k_out.shape == key.shape
    q_ref, k_ref = flashkv.apply_rope_with_cos_sin_cache(positions.cpu(), query.cpu(), key.cpu(),
                                                         d, cache, is_neox)
    torch.testing.assert_close(q_out.cpu(), q_ref, **ROPE_TOL[dtype])
    torch.testing.assert_close(k_out.cpu(), k_ref, **ROPE_TOL[dtype])
    flashkv.apply_rope_with_cos_sin_cache_inplace(positions, query, key, d, cache.cuda(), is_neox)
    assert torch.equal(query, q_out) and torch.equal(key, k_out)


def test_rope_device_error_is_reported():
    g = gen(15)
    q, k = rand((3, 8, 64), "float16", g), rand((3, 2, 64), "float16", g)
    q0, k0 = q.clone(), k.clone()
    flashkv.apply_rope_pos_ids_inplace(q, k, i32([0, -5, 2]))
    with pytest.raises(ValueError, match=r"pos_ids\[1\] = -5 is negative"):
        flashkv.check_device_errors()
    flashkv.check_device_errors()  # raised once, then cleared
    assert torch.equal(q[1], q0[1]) and torch.equal(k[1], k0[1])  # that token left as it was
    assert not torch.equal(q[2], q0[2])
