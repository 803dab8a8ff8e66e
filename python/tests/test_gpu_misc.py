"""GPU tests of the state merges (merge_states, merge_state, merge_state_in_place), a run on the
caller's stream into the caller's out/lse, the workspace-size error, and the wrappers' argument
errors on CUDA tensors. Skipped unless torch with CUDA and a GPU are present.
"""

import math

import pytest

import flashkv

from conftest import requires_gpu
from gpu_helpers import Paged, check_lse, check_out, gen, rand, rel_err, sdpa_ref, workspace

try:
    import torch
except ImportError:  # the module is skipped (requires_gpu) without torch
    torch = None

pytestmark = requires_gpu


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_merge(dtype):
    g = gen(6)
    n, h, d = 37, 8, 128
    v = rand((n, 3, h, d), dtype, g)
    s = (torch.rand((n, 3, h), generator=g, device="cuda") * 8 - 4)
    s[0, 0] = -math.inf
    m = s.max(dim=1, keepdim=True).values
    w = torch.exp2(s - m)
    ref_v = (w[..., None] * v.float()).sum(1) / w.sum(1)[..., None]
    ref_s = m[:, 0] + torch.log2(w.sum(1))
    out, lse = flashkv.merge_states(v.contiguous(), s.contiguous())
    assert rel_err(out.float(), ref_v) <= 1e-2 and rel_err(lse, ref_s) <= 1e-5
    # two states: out of place and in place
    va, vb = v[:, 0].contiguous(), v[:, 1].contiguous()
    sa, sb = s[:, 0].contiguous(), s[:, 1].contiguous()
    m2 = torch.maximum(sa, sb)
    wa, wb = torch.exp2(sa - m2), torch.exp2(sb - m2)
    ref2 = (wa[..., None] * va.float() + wb[..., None] * vb.float()) / (wa + wb)[..., None]
    o2, l2 = flashkv.merge_state(va, sa, vb, sb)
    assert rel_err(o2.float(), ref2) <= 1e-2
    assert rel_err(l2, m2 + torch.log2(wa + wb)) <= 1e-5
    flashkv.merge_state_in_place(va, sa, vb, sb)
    assert rel_err(va.float(), ref2) <= 1e-2


def test_runs_on_the_callers_stream_and_writes_out():
    g = gen(7)
    hq, hk, d, ps = 32, 8, 128, 16
    kv_lens = [300, 5, 1024]
    cache = Paged(kv_lens, ps, hk, d, "float16", "NHD", g)
    q = rand((3, hq, d), "float16", g)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps)
        out = torch.full_like(q, math.nan)
        lse = torch.full((3, hq), math.nan, device="cuda")
        assert w.run(q, cache.kv, out=out, lse=lse) is out
    side.synchronize()
    for i in range(3):
        ref, ref_lse = sdpa_ref(q[i:i + 1], *cache.gather(i))
        check_out(out[i], ref[0], "float16")
        check_lse(lse[i], ref_lse[0])


def test_workspace_too_small_names_the_size():
    # Below the plan arrays (a few KB for one request): any buffer from there up runs
    # (test_gpu_workspace.py).
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(256, dtype=torch.uint8, device="cuda"))
    ip = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"float_workspace_buffer: 256 bytes is too small .* "
                                         r"needs at least \d+ bytes"):
        w.plan(ip, ip[:1], torch.tensor([1], dtype=torch.int32), 32, 8, 128, 16)


def test_gpu_errors():
    g = gen(8)
    cache = Paged([20], 16, 8, 128, "float16", "NHD", g)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(cache.indptr, cache.indices, cache.last_page_len, 32, 8, 128, 16)
    q = rand((1, 32, 128), "float16", g)
    with pytest.raises(ValueError, match="q: expected dtype f16"):
        w.run(q.to(torch.bfloat16), cache.kv)
    with pytest.raises(ValueError, match="expected an array on cuda:0"):
        w.run(q.cpu(), cache.kv)
    with pytest.raises(ValueError, match="head_dim"):
        w.plan(cache.indptr, cache.indices, cache.last_page_len, 32, 8, 96, 16)
