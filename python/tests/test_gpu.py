"""GPU tests: every wrapper on CUDA torch tensors against torch's float32
scaled_dot_product_attention on the gathered KV, CUDA-graph capture and replay across re-plans,
the caller's stream, and the workspace-size error. Skipped unless torch with CUDA and a GPU are
present (run on a GPU machine: `scripts/gpu-test-python.sh`, or pytest python/tests/test_gpu.py
with the module built).

Tolerance (tests/common/test_util.h, STYLE.md): rel_err(out, ref) <= min(2 * rel_err(ref rounded
to the dtype, ref) + u, 1e-2), u the unit roundoff of the dtype P is rounded to (f16 2^-11,
bf16 2^-8); LSE relative error <= 1e-4, with -inf exactly where no key is visible.
"""

import math
import os

import numpy as np
import pytest

import flashkv

try:
    import torch
    import torch.nn.functional as F

    GPU = torch.cuda.is_available() and flashkv.cuda_available()
except ImportError:
    torch = None
    GPU = False

if not GPU and os.environ.get("FLASHKV_REQUIRE_GPU") == "1":  # scripts/gpu-test-python.sh
    raise RuntimeError("FLASHKV_REQUIRE_GPU=1, but PyTorch with CUDA and a CUDA GPU are missing")
pytestmark = pytest.mark.skipif(not GPU, reason="needs PyTorch with CUDA and a CUDA GPU")

LOG2E = 1.4426950408889634
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
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
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(4096, dtype=torch.uint8, device="cuda"))
    ip = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"float_workspace_buffer: 4096 bytes is too small .* "
                                         r"needs \d+ bytes"):
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
