"""GPU tests: every wrapper on CUDA torch tensors against torch's float32
scaled_dot_product_attention on the gathered KV, CUDA-graph capture and replay across re-plans,
the caller's stream, and the workspace-size error; the KV append and RoPE against the CPU path,
errors recorded by the kernels (check_device_errors), the fused decode step (run_step) bitwise
against the unfused ops, and both cascade wrappers against plain decode. Skipped unless torch
with CUDA and a GPU are present (run on a GPU machine: `scripts/gpu-test-python.sh`, or pytest
python/tests/test_gpu.py with the module built).

Tolerance (tests/common/test_util.h, STYLE.md): rel_err(out, ref) <= min(2 * rel_err(ref rounded
to the dtype, ref) + u, 1e-2), u the unit roundoff of the dtype P is rounded to (f16 2^-11,
bf16 2^-8); LSE relative error <= 1e-4, with -inf exactly where no key is visible.
"""

import math

import numpy as np
import pytest

import flashkv

from conftest import LOG2E, UNIT_ROUNDOFF, requires_gpu

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

pytestmark = requires_gpu

MB = 1 << 20


def tdtype(name):
    return getattr(torch, name)


def workspace(mb=128):
    return torch.empty(mb * MB, dtype=torch.uint8, device="cuda")


def rand(shape, dtype, gen):
    return (torch.rand(shape, generator=gen, device="cuda") * 2 - 1).to(tdtype(dtype))


def gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def sdpa_ref(q, k, v, causal=False, sm_scale=None):
    """float32 reference: q [Lq, Hq, D], k/v [Lk, Hk, D] -> out [Lq, Hq, D], natural lse [Lq, Hq].
    Causal aligned to the end of the KV; rows that see no key: out 0, lse -inf."""
    lq, hq, d = q.shape
    lk, hk = k.shape[0], k.shape[1]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    if lk == 0:
        return (torch.zeros(lq, hq, d, device=q.device),
                torch.full((lq, hq), -math.inf, device=q.device))
    qh = q.float().transpose(0, 1)
    kh = k.float().repeat_interleave(hq // hk, dim=1).transpose(0, 1)
    vh = v.float().repeat_interleave(hq // hk, dim=1).transpose(0, 1)
    visible = None
    if causal:
        visible = (torch.arange(lk, device=q.device)[None, :]
                   <= (lk - lq) + torch.arange(lq, device=q.device)[:, None])
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=visible, scale=scale)
    scores = (qh @ kh.transpose(-1, -2)) * scale
    if visible is not None:
        scores = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(out), out)
    return out.transpose(0, 1), lse.transpose(0, 1)


def rel_err(a, b):
    a, b = a.double(), b.double()
    den = torch.linalg.norm(b)
    num = torch.linalg.norm(a - b)
    return float(num / den) if den > 0 else float(num)


def check_out(out, ref, dtype):
    assert not torch.isnan(out).any()
    err_lowp = rel_err(ref.to(tdtype(dtype)).float(), ref)
    bound = min(2 * err_lowp + UNIT_ROUNDOFF[dtype], 1e-2)
    err = rel_err(out.float(), ref)
    assert err <= bound, f"rel_err {err:.3g} > bound {bound:.3g}"


def check_lse(lse2, ref_lse):
    """lse2: flashkv's base-2 LSE; ref_lse natural."""
    ref2 = ref_lse.double() * LOG2E
    empty = torch.isinf(ref2)
    assert torch.equal(torch.isinf(lse2) & (lse2 < 0), empty)
    if (~empty).any():
        assert rel_err(lse2[~empty], ref2[~empty]) <= 1e-4


class Paged:
    """A random paged cache on the GPU (scattered pages), with its page table and gather()."""

    def __init__(self, kv_lens, page_size, hk, d, dtype, layout, g, spare=5):
        self.page_size, self.layout, self.kv_lens = page_size, layout, list(kv_lens)
        pages = [(n + page_size - 1) // page_size for n in kv_lens]
        num_pages = sum(pages) + spare
        self.indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32,
                                   device="cuda")
        perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(len(kv_lens)))
        self.indices = perm[: sum(pages)].to(torch.int32).cuda()
        self.last_page_len = torch.tensor(
            [n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, pages)],
            dtype=torch.int32, device="cuda")
        inner = (page_size, hk, d) if layout == "NHD" else (hk, page_size, d)
        self.kv = rand((num_pages, 2) + inner, dtype, g)
        self.k, self.v = self.kv[:, 0].contiguous(), self.kv[:, 1].contiguous()

    def gather(self, i):
        ids = self.indices[self.indptr[i]: self.indptr[i + 1]].long()
        out = []
        for c in (self.k, self.v):
            c = c if self.layout == "NHD" else c.transpose(1, 2)
            out.append(c[ids].reshape(-1, c.shape[2], c.shape[3])[: self.kv_lens[i]])
        return out

    def cache(self, interleaved):
        return self.kv if interleaved else (self.k, self.v)


DTYPES = ["float16", "bfloat16"]


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
    # The C++ auto rule (src/ops/decode_shape_choice.cpp), seen through plan_info(): one CTA of 8
    # warps per SM for a few equal requests, 4 of 2 warps for a large batch, else 2 of 4.
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


def test_batch_prefill_fa3_takes_full_tiles_and_refuses_variants():
    # "fa3" plans the wgmma kernel's 128-row tiles even for short queries (the heuristic's tile
    # would be 16 rows here), and raises for a variant (which runs on mma.sync only).
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
    with pytest.raises(Exception, match="variant"):
        w.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
               causal=True, q_data_type=torch.float16, logits_soft_cap=30.0)


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


@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_graph_decode_across_replans(dtype):
    """Capture run() once with torch.cuda.CUDAGraph, then re-plan (new lengths, pages and a
    smaller batch) and replay: every replay matches the reference."""
    g = gen(9)
    hq, hk, d, ps, max_batch, num_pages = 32, 8, 128, 16, 8, 600
    kv = rand((num_pages, 2, ps, hk, d), dtype, g)
    indptr_buf = torch.zeros(max_batch + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.zeros(num_pages, dtype=torch.int32, device="cuda")
    last_buf = torch.zeros(max_batch, dtype=torch.int32, device="cuda")
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(
        workspace(), "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr_buf,
        paged_kv_indices_buffer=indices_buf, paged_kv_last_page_len_buffer=last_buf)
    q_static = torch.zeros(max_batch, hq, d, dtype=tdtype(dtype), device="cuda")
    out_static = torch.zeros_like(q_static)
    lse_static = torch.zeros(max_batch, hq, device="cuda")
    rng = np.random.default_rng(0)

    def step(kv_lens):
        pages = [(n + ps - 1) // ps for n in kv_lens]
        indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32)
        indices = torch.tensor(rng.permutation(num_pages)[: sum(pages)], dtype=torch.int32)
        last = torch.tensor([n - (p - 1) * ps if p else 0 for n, p in zip(kv_lens, pages)],
                            dtype=torch.int32)
        w.plan(indptr, indices.cuda(), last, hq, hk, d, ps, q_data_type=tdtype(dtype))
        return indptr, indices, last

    def check(kv_lens, indptr, indices):
        b = len(kv_lens)
        for i in range(b):
            ids = indices[indptr[i]: indptr[i + 1]].long().cuda()
            k = kv[ids, 0].reshape(-1, hk, d)[: kv_lens[i]]
            v = kv[ids, 1].reshape(-1, hk, d)[: kv_lens[i]]
            ref, ref_lse = sdpa_ref(q_static[i:i + 1], k, v)
            check_out(out_static[i], ref[0], dtype)
            check_lse(lse_static[i], ref_lse[0])

    lens = [100, 1, 2000, 17, 0, 640, 33, 5]
    indptr, indices, _ = step(lens)
    q_static.copy_(rand((max_batch, hq, d), dtype, g))
    side = torch.cuda.Stream()  # warm-up off the default stream, as torch recommends
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.run(q_static, kv, out=out_static, lse=lse_static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_static, kv, out=out_static, lse=lse_static)
    graph.replay()
    torch.cuda.synchronize()
    check(lens, indptr, indices)
    for lens in ([3000, 2, 1, 64, 64, 900, 7, 4000], [1, 2, 3], [512] * 8):
        indptr, indices, _ = step(lens)
        q_static.copy_(rand((max_batch, hq, d), dtype, g))
        out_static.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        check(lens, indptr, indices)


def test_cuda_graph_prefill_across_replans():
    """Paged prefill captured once (the first plan fixes the token capacity and the query tile),
    replayed after re-plans with other query splits and KV lengths."""
    g = gen(10)
    hq, hk, d, ps, batch, num_pages, tokens = 32, 8, 128, 16, 4, 400, 64
    kv = rand((num_pages, 2, ps, hk, d), "float16", g)
    bufs = dict(qo_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device="cuda"),
                paged_kv_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device="cuda"),
                paged_kv_indices_buf=torch.zeros(num_pages, dtype=torch.int32, device="cuda"),
                paged_kv_last_page_len_buf=torch.zeros(batch, dtype=torch.int32, device="cuda"))
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", use_cuda_graph=True,
                                                    **bufs)
    q_static = torch.zeros(tokens, hq, d, dtype=torch.float16, device="cuda")
    out_static = torch.zeros_like(q_static)
    rng = np.random.default_rng(1)

    def step(qo_lens, kv_lens):
        pages = [(n + ps - 1) // ps for n in kv_lens]
        qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32)
        indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32)
        indices = torch.tensor(rng.permutation(num_pages)[: sum(pages)], dtype=torch.int32)
        last = torch.tensor([n - (p - 1) * ps if p else 0 for n, p in zip(kv_lens, pages)],
                            dtype=torch.int32)
        w.plan(qo_indptr, indptr, indices.cuda(), last, hq, hk, d, ps, causal=True)
        q_static.copy_(rand((tokens, hq, d), "float16", g))
        return qo_indptr, indptr, indices

    def check(qo_lens, kv_lens, qo_indptr, indptr, indices):
        for i in range(len(qo_lens)):
            rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
            ids = indices[indptr[i]: indptr[i + 1]].long().cuda()
            k = kv[ids, 0].reshape(-1, hk, d)[: kv_lens[i]]
            v = kv[ids, 1].reshape(-1, hk, d)[: kv_lens[i]]
            ref, _ = sdpa_ref(q_static[rows], k, v, causal=True)
            check_out(out_static[rows], ref, "float16")

    qo, kvl = [16, 16, 16, 16], [100, 16, 700, 40]
    state = step(qo, kvl)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.run(q_static, kv, out=out_static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_static, kv, out=out_static)
    graph.replay()
    torch.cuda.synchronize()
    check(qo, kvl, *state)
    for qo, kvl in (([1, 40, 3, 20], [1, 2000, 3, 64]), ([64, 0, 0, 0], [64, 5, 0, 9])):
        state = step(qo, kvl)
        graph.replay()
        torch.cuda.synchronize()
        check(qo, kvl, *state)


# --- KV-cache ops, RoPE, the fused decode step, cascades ---


def i32(values):
    return torch.tensor(values, dtype=torch.int32, device="cuda")


def clone_cache(c):
    return c.clone() if isinstance(c, torch.Tensor) else tuple(x.clone() for x in c)


def cpu_cache(c):
    return c.cpu() if isinstance(c, torch.Tensor) else tuple(x.cpu() for x in c)


def flat(c):
    """A cache's elements, k then v (or the interleaved kv), as one CPU vector."""
    parts = (c,) if isinstance(c, torch.Tensor) else c
    return torch.cat([x.reshape(-1).cpu() for x in parts])


def assert_caches_equal(a, b):
    for x, y in zip((a,) if isinstance(a, torch.Tensor) else a,
                    (b,) if isinstance(b, torch.Tensor) else b):
        assert torch.equal(x.cpu(), y.cpu())


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


STEP_ROPES = ["none", "llama", "llama31", "cos_sin_cache"]


def step_cos_sin_cache(d, max_position=1 << 17):
    freqs = 1e4 ** (-torch.arange(0, d, 2, dtype=torch.float64, device="cuda") / d)
    ang = torch.arange(max_position, dtype=torch.float64, device="cuda")[:, None] * freqs[None]
    return torch.cat([ang.cos(), ang.sin()], dim=1).float()


def unfused_step(rope, q, k_new, v_new, cache, pos, append_pos, w, indices, indptr, last,
                 layout, cos_sin):
    """What run_step replaces: RoPE -> append_paged_kv_cache -> run."""
    if rope == "none":
        q_rot, k_rot = q, k_new
    elif rope == "llama":
        q_rot, k_rot = flashkv.apply_rope_pos_ids(q, k_new, pos)
    elif rope == "llama31":
        q_rot, k_rot = flashkv.apply_llama31_rope_pos_ids(q, k_new, pos)
    else:
        q_rot, k_rot = flashkv.apply_rope_with_cos_sin_cache(pos, q, k_new, q.shape[-1], cos_sin)
    b = q.shape[0]
    flashkv.append_paged_kv_cache(k_rot, v_new, torch.arange(b, dtype=torch.int32, device="cuda"),
                                  append_pos, cache, indices, indptr, last, kv_layout=layout)
    out, lse = w.run(q_rot, cache, return_lse=True)
    return q_rot, out, lse


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


def test_run_step_cuda_graph_across_replans():
    """run_step captured once (at max_batch rows), replayed after re-plans: each replay appends
    where its plan says (the cache equals the unfused ops' bitwise) and attends the result."""
    g = gen(17)
    hq, hk, d, ps, max_batch, num_pages = 32, 8, 128, 16, 4, 300
    kv = rand((num_pages, 2, ps, hk, d), "float16", g)
    bufs = dict(paged_kv_indptr_buffer=torch.zeros(max_batch + 1, dtype=torch.int32,
                                                   device="cuda"),
                paged_kv_indices_buffer=torch.zeros(num_pages, dtype=torch.int32, device="cuda"),
                paged_kv_last_page_len_buffer=torch.zeros(max_batch, dtype=torch.int32,
                                                          device="cuda"))
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", use_cuda_graph=True,
                                                   **bufs)
    plain = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace())
    q_s = torch.zeros(max_batch, hq, d, dtype=torch.float16, device="cuda")
    k_s, v_s = (torch.zeros(max_batch, hk, d, dtype=torch.float16, device="cuda")
                for _ in range(2))
    out_s = torch.zeros_like(q_s)
    rng = np.random.default_rng(3)

    def plan(kv_lens):
        pages = [(n + ps - 1) // ps for n in kv_lens]
        indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32)
        indices = torch.tensor(rng.permutation(num_pages)[: sum(pages)], dtype=torch.int32).cuda()
        last = torch.tensor([n - (p - 1) * ps for n, p in zip(kv_lens, pages)], dtype=torch.int32)
        w.plan(indptr, indices, last, hq, hk, d, ps)
        plain.plan(indptr, indices, last, hq, hk, d, ps)
        for x in (q_s, k_s, v_s):
            x.copy_(rand(x.shape, "float16", g))
        return indptr.cuda(), indices, last.cuda()

    plan([5, 17, 300, 1])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.run_step(q_s, k_s, v_s, kv, rope="llama31", out=out_s)  # warm-up (compiles, appends)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run_step(q_s, k_s, v_s, kv, rope="llama31", out=out_s)
    for lens in ([5, 17, 300, 1], [1000, 2, 64], [33, 16, 1, 700]):
        indptr, indices, last = plan(lens)
        b = len(lens)
        expected = kv.clone()
        q_rot, _, _ = unfused_step("llama31", q_s[:b], k_s[:b], v_s[:b], expected,
                                   i32(lens) - 1, i32(lens) - 1, plain, indices, indptr, last,
                                   "NHD", None)
        graph.replay()
        torch.cuda.synchronize()
        flashkv.check_device_errors()
        assert torch.equal(kv, expected)
        for i in range(b):
            ids = indices[indptr[i]: indptr[i + 1]].long()
            k = kv[ids, 0].reshape(-1, hk, d)[: lens[i]]
            v = kv[ids, 1].reshape(-1, hk, d)[: lens[i]]
            ref, _ = sdpa_ref(q_rot[i:i + 1], k, v)
            check_out(out_s[i], ref[0], "float16")


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


# --- torch custom ops (flashkv._torch_ops): opcheck, torch.compile(fullgraph=True) ---


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
