"""GPU tests of the fused decode step (run_step: RoPE, append, decode in one call) bitwise against
the unfused ops, for every RoPE form, both layouts, interleaved or separate caches and explicit
positions; the output also against SDPA over the updated cache. Skipped unless torch with CUDA
and a GPU are present.
"""

import pytest

import flashkv

from conftest import requires_gpu
from gpu_helpers import (DTYPES, Paged, assert_caches_equal, check_lse, check_out, clone_cache, gen,
                         i32, rand, sdpa_ref, tdtype, unfused_step, workspace)

try:
    import torch
except ImportError:  # the module is skipped (requires_gpu) without torch
    torch = None

pytestmark = requires_gpu


STEP_ROPES = ["none", "llama", "llama31", "cos_sin_cache"]


def step_cos_sin_cache(d, max_position=1 << 17):
    freqs = 1e4 ** (-torch.arange(0, d, 2, dtype=torch.float64, device="cuda") / d)
    ang = torch.arange(max_position, dtype=torch.float64, device="cuda")[:, None] * freqs[None]
    return torch.cat([ang.cos(), ang.sin()], dim=1).float()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rope", STEP_ROPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("explicit_pos", [False, True])
def test_run_step_equals_unfused(dtype, rope, layout, interleaved, explicit_pos):
    """run_step == apply_*_pos_ids -> append_paged_kv_cache -> run: outputs, LSE and cache
    bitwise (torch.equal); the output also against SDPA over the updated cache."""
    g = gen(16)
    hq, hk, d, ps = 32, 8, 128, 16
    kv_lens = [1, 17, 16, 300, 2048, 33]  # after the append: the new token is at kv_len - 1
    cache = Paged(kv_lens, ps, hk, d, dtype, layout, g)
    b = len(kv_lens)
    q = rand((b, hq, d), dtype, g)
    k_new, v_new = rand((b, hk, d), dtype, g), rand((b, hk, d), dtype, g)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace(), layout)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           q_data_type=tdtype(dtype))
    append_pos = i32(kv_lens) - 1
    pos_ids = i32([5, 0, 70000, 299, 2047, 12]) if explicit_pos else None
    cos_sin = step_cos_sin_cache(d) if rope == "cos_sin_cache" else None
    fused, unfused = clone_cache(cache.cache(interleaved)), clone_cache(cache.cache(interleaved))
    q_before = q.clone()
    out, lse = w.run_step(q, k_new, v_new, fused, rope=rope, pos_ids=pos_ids,
                          cos_sin_cache=cos_sin, return_lse=True)
    assert torch.equal(q, q_before)  # q is read, not modified
    q_rot, ref_out, ref_lse = unfused_step(
        rope, q, k_new, v_new, unfused, append_pos if pos_ids is None else pos_ids, append_pos,
        w, cache.indices, cache.indptr, cache.last_page_len, layout, cos_sin)
    torch.cuda.synchronize()
    flashkv.check_device_errors()
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    assert_caches_equal(fused, unfused)
    cache.k, cache.v = (fused[:, 0], fused[:, 1]) if interleaved else fused
    for i in range(b):
        ref, ref_l = sdpa_ref(q_rot[i:i + 1], *cache.gather(i))
        check_out(out[i], ref[0], dtype)
        check_lse(lse[i], ref_l[0])
