"""GPU tests of FP8 KV caches (torch.float8_e4m3fn / float8_e5m2) through the Python wrappers:
decode, paged and ragged prefill, single decode / prefill against torch's float32 SDPA on the
dequantized cache (cache.float() * scale) with k_scale / v_scale as floats, [1] tensors and
[num_kv_heads] tensors; tensor scales changed between CUDA-graph replays without a new capture;
append_paged_kv_cache quantizing bit for bit as (x.float() / scale).to(fp8) wherever torch's
result is finite (torch rounds to nearest even, as flashkv; past the format's range torch releases
differ: NaN or saturation for e4m3 (2.15 saturates), inf for e5m2, where flashkv always saturates
to the largest finite value: checked separately); run_step over an fp8 cache
equal (bitwise) to RoPE + append + run; torch.compile of a run with tensor scales. The host path
(CPU reference) of the same: test_fp8.py. Skipped unless torch with CUDA and a GPU are present.
"""

import copy
import math

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

FP8 = ["float8_e4m3fn", "float8_e5m2"]
MAX_FINITE = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
SCALES = ["float", "one", "per_head"]


def scale_args(kind, hk, seed=0):
    """(k_scale, v_scale): floats, float32 [1] CUDA tensors, or float32 [hk] CUDA tensors (one
    scale per KV head, not powers of two)."""
    if kind == "float":
        return 0.37, 1.75
    if kind == "one":
        return (torch.tensor([0.75], device="cuda"), torch.tensor([2.5], device="cuda"))
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.rand(hk, generator=g, device="cuda") * 2 + 0.1,
            torch.rand(hk, generator=g, device="cuda") * 2 + 0.1)


def dequantize(x, scale, head_axis):
    """fp8 x as float32 times its scale (a float, or a [1] / [H] tensor along head_axis)."""
    f = x.float()
    if not isinstance(scale, torch.Tensor):
        return f * scale
    shape = [1] * f.dim()
    if scale.numel() > 1:
        shape[head_axis] = scale.numel()
    return f * scale.float().view(shape)


def gather8(cache, i):
    """Request i's fp8 (k, v) as NHD [kv_len, H, D] (indexed as bytes: torch's advanced indexing
    need not support float8)."""
    ids = cache.indices[cache.indptr[i]: cache.indptr[i + 1]].long()
    out = []
    for c in (cache.k, cache.v):
        c = c if cache.layout == "NHD" else c.transpose(1, 2)
        rows = c.view(torch.uint8)[ids].reshape(-1, c.shape[2], c.shape[3])[: cache.kv_lens[i]]
        out.append(rows.view(c.dtype))
    return out


def decode_rows(q):
    """check_paged's rows of a decode batch: request i has q row i."""
    return [(q[i:i + 1], slice(i, i + 1)) for i in range(q.shape[0])]


def check_paged(cache, q_rows, out, lse, ks, vs, dtype, causal=False):
    """out / lse of request i against SDPA on its dequantized KV; q_rows[i] = (its queries, the
    slice of out's rows)."""
    for i, rows in enumerate(q_rows):
        k, v = gather8(cache, i)
        ref, ref_lse = sdpa_ref(rows[0], dequantize(k, ks, 1), dequantize(v, vs, 1),
                                causal=causal)
        check_out(out[rows[1]], ref, dtype)
        if lse is not None:
            check_lse(lse[rows[1]], ref_lse)


# --- attention over fp8 caches -------------------------------------------------------------------


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("scales", SCALES)
def test_batch_decode_fp8(fp8, dtype, layout, scales):
    g = gen(40)
    hq, hk, d, ps = 32, 8, 128, 16
    kv_lens = [1, 17, 300, 0, 2048, 16]
    cache = Paged(kv_lens, ps, hk, d, fp8, layout, g)
    q = rand((len(kv_lens), hq, d), dtype, g)
    ks, vs = scale_args(scales, hk)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace(), layout)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           q_data_type=tdtype(dtype), kv_data_type=tdtype(fp8))
    for interleaved in (False, True):
        out, lse = w.run(q, cache.cache(interleaved), k_scale=ks, v_scale=vs, return_lse=True)
        assert out.dtype == q.dtype
        check_paged(cache, decode_rows(q), out, lse, ks, vs, dtype)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_batch_decode_fp8_head_dims_and_groups(fp8, dtype, head_dim):
    g = gen(41)
    for hq, hk in ((32, 8), (8, 8), (16, 1)):
        cache = Paged([5, 700, 64], 16, hk, head_dim, fp8, "NHD", g)
        q = rand((3, hq, head_dim), dtype, g)
        ks, vs = scale_args("per_head", hk, seed=hq)
        w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace())
        w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, head_dim, 16,
               q_data_type=dtype, kv_data_type=fp8)
        out, lse = w.run(q, (cache.k, cache.v), k_scale=ks, v_scale=vs, return_lse=True)
        check_paged(cache, decode_rows(q), out, lse, ks, vs, dtype)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("decode", [True, False])
def test_multi_level_cascade_wrapper_fp8(fp8, decode):
    """flashkv's automatic cascade over an fp8 cache whose requests share a prefix: the levels
    read it with its scales; the answer is plain attention's (the decode / prefill wrapper's)."""
    g = gen(44)
    hq, hk, d, ps = 32, 8, 128, 16
    kv_lens = [600, 600, 600, 600]
    cache = Paged(kv_lens, ps, hk, d, fp8, "NHD", g)
    # Requests 1-3 share request 0's first 32 pages (512 tokens).
    shared = cache.indices[:32].clone()
    for i in range(1, 4):
        cache.indices[int(cache.indptr[i]):int(cache.indptr[i]) + 32] = shared
    qo = [1] * 4 if decode else [3, 1, 2, 5]
    qo_indptr = i32([0] + list(np.cumsum(qo)))
    q = rand((sum(qo), hq, d), "float16", g)
    ks, vs = scale_args("per_head", hk, seed=7)
    w = flashkv.MultiLevelCascadeWrapper(workspace())
    w.plan(None if decode else qo_indptr, cache.indptr, cache.indices, cache.last_page_len, hq,
           hk, d, ps, causal=True, kv_data_type=tdtype(fp8), use_cascade="always")
    assert w.plan_info()["num_levels"] == 2
    out = w.run(q, (cache.k, cache.v), k_scale=ks, v_scale=vs)
    if decode:
        ref = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace())
        ref.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
                 kv_data_type=tdtype(fp8))
    else:
        ref = flashkv.BatchPrefillWithPagedKVCacheWrapper(workspace())
        ref.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
                 causal=True, kv_data_type=tdtype(fp8))
    want = ref.run(q, (cache.k, cache.v), k_scale=ks, v_scale=vs)
    assert rel_err(out, want) < 2 * UNIT_ROUNDOFF["float16"]


def plan_or_skip(w, backend, *args, **kw):
    """w.plan(...); with backend "fa3" a plan the wgmma kernel cannot run (fp8 KV there, or no
    sm_90a GPU) skips the test."""
    try:
        w.plan(*args, **kw)
    except ValueError as e:
        if backend == "fa3" and "wgmma kernel cannot run" in str(e):
            pytest.skip(f"fa3: {e}")
        raise


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("backend", ["auto", "fa2", "fa3"])
def test_batch_prefill_paged_fp8(fp8, dtype, layout, scales, backend):
    g = gen(42)
    hq, hk, d, ps = 32, 8, 128, 16
    qo, kv = [3, 130, 1, 0, 64], [20, 200, 1000, 5, 64]
    cache = Paged(kv, ps, hk, d, fp8, layout, g)
    q = rand((sum(qo), hq, d), dtype, g)
    qo_indptr = i32(np.concatenate([[0], np.cumsum(qo)]))
    ks, vs = scale_args(scales, hk)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(workspace(), layout, backend=backend)
    plan_or_skip(w, backend, qo_indptr, cache.indptr, cache.indices, cache.last_page_len, hq,
                 hk, d, ps, causal=True, q_data_type=tdtype(dtype), kv_data_type=tdtype(fp8))
    assert w.plan_info()["wgmma"] == (backend == "fa3") or backend == "auto"
    out, lse = w.run(q, cache.cache(False), k_scale=ks, v_scale=vs, return_lse=True)
    ip = qo_indptr.tolist()
    check_paged(cache, [(q[ip[i]:ip[i + 1]], slice(ip[i], ip[i + 1])) for i in range(len(qo))],
                out, lse, ks, vs, dtype, causal=True)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("backend", ["auto", "fa2", "fa3"])
def test_batch_prefill_ragged_fp8(fp8, dtype, layout, scales, backend):
    g = gen(43)
    hq, hk, d = 32, 8, 128
    qo, kv = [4, 129, 1, 17], [30, 129, 513, 0]
    q = rand((sum(qo), hq, d), dtype, g)
    k, v = rand((sum(kv), hk, d), fp8, g), rand((sum(kv), hk, d), fp8, g)
    qo_ip, kv_ip = (np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in (qo, kv))
    ks, vs = scale_args(scales, hk)
    w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(workspace(), layout, backend=backend)
    plan_or_skip(w, backend, i32(qo_ip), i32(kv_ip), hq, hk, d, causal=True, q_data_type=dtype,
                 kv_data_type=fp8)
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(0, 1), v.transpose(0, 1))
    out, lse = w.run(q, kk, vv, k_scale=ks, v_scale=vs, return_lse=True)
    for i in range(len(qo)):
        rows, keys = slice(qo_ip[i], qo_ip[i + 1]), slice(kv_ip[i], kv_ip[i + 1])
        ref, ref_lse = sdpa_ref(q[rows], dequantize(k[keys], ks, 1), dequantize(v[keys], vs, 1),
                                causal=True)
        check_out(out[rows], ref, dtype)
        check_lse(lse[rows], ref_lse)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("scales", SCALES)
def test_single_decode_and_prefill_fp8(fp8, dtype, layout, scales):
    g = gen(44)
    hq, hk, d = 32, 8, 128
    ks, vs = scale_args(scales, hk)
    for kv_len in (1, 333):
        shape = (kv_len, hk, d) if layout == "NHD" else (hk, kv_len, d)
        q = rand((7, hq, d), dtype, g)
        k, v = rand(shape, fp8, g), rand(shape, fp8, g)
        head_axis = 1 if layout == "NHD" else 0
        kd, vd = dequantize(k, ks, head_axis), dequantize(v, vs, head_axis)
        if layout == "HND":
            kd, vd = kd.transpose(0, 1), vd.transpose(0, 1)
        out, lse = flashkv.single_decode_with_kv_cache(q[0], k, v, kv_layout=layout, k_scale=ks,
                                                       v_scale=vs, return_lse=True)
        ref, ref_lse = sdpa_ref(q[:1], kd, vd)
        check_out(out, ref[0], dtype)
        check_lse(lse, ref_lse[0])
        for backend in ("auto", "fa2"):
            out = flashkv.single_prefill_with_kv_cache(q, k, v, None, ks, vs, causal=True,
                                                       kv_layout=layout, backend=backend)
            ref, _ = sdpa_ref(q, kd, vd, causal=True)
            check_out(out, ref, dtype)


@pytest.mark.parametrize("fp8", FP8)
def test_variant_over_fp8_cache(fp8):
    """A built-in variant (soft-cap + window) over an fp8 cache with per-head scales: decode
    (single, through a BatchDecode of one-token pages) against the CPU reference of the same."""
    g = gen(45)
    hq, hk, d, kv_len = 32, 8, 128, 300
    q = rand((hq, d), "float16", g)
    k, v = rand((kv_len, hk, d), fp8, g), rand((kv_len, hk, d), fp8, g)
    ks, vs = scale_args("per_head", hk)
    variant = dict(logits_soft_cap=30.0, window_left=100)
    out = flashkv.single_decode_with_kv_cache(q, k, v, k_scale=ks, v_scale=vs, **variant)
    ref = flashkv.single_decode_with_kv_cache(q.cpu(), k.cpu(), v.cpu(), k_scale=ks.cpu(),
                                              v_scale=vs.cpu(), **variant)
    # Two float16 roundings of one result (the CPU reference's in double).
    assert rel_err(out.cpu().float(), ref.float()) <= 4 * UNIT_ROUNDOFF["float16"]


# --- scales read at run time: CUDA graphs -------------------------------------------------------


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("scales", ["one", "per_head"])
def test_cuda_graph_replays_with_changed_scales(fp8, scales):
    """Capture decode's run() once with tensor scales; new scale values (written into the same
    tensors), a new plan and new queries are what every replay computes: no re-capture."""
    g = gen(46)
    hq, hk, d, ps, max_batch, num_pages = 32, 8, 128, 16, 4, 300
    kv = rand((num_pages, 2, ps, hk, d), fp8, g)
    cache = (kv[:, 0], kv[:, 1])
    ks, vs = scale_args(scales, hk, seed=1)
    bufs = dict(paged_kv_indptr_buffer=torch.zeros(max_batch + 1, dtype=torch.int32,
                                                   device="cuda"),
                paged_kv_indices_buffer=torch.zeros(num_pages, dtype=torch.int32, device="cuda"),
                paged_kv_last_page_len_buffer=torch.zeros(max_batch, dtype=torch.int32,
                                                          device="cuda"))
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", use_cuda_graph=True,
                                                   **bufs)
    q_static = torch.zeros(max_batch, hq, d, dtype=torch.float16, device="cuda")
    out_static = torch.zeros_like(q_static)
    lse_static = torch.zeros(max_batch, hq, device="cuda")
    rng = np.random.default_rng(2)

    def step(kv_lens):
        pages = [(n + ps - 1) // ps for n in kv_lens]
        indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        indices = rng.permutation(num_pages)[: sum(pages)].astype(np.int32)
        last = np.array([n - (p - 1) * ps if p else 0 for n, p in zip(kv_lens, pages)], np.int32)
        w.plan(torch.from_numpy(indptr), torch.from_numpy(indices).cuda(),
               torch.from_numpy(last), hq, hk, d, ps, kv_data_type=fp8)
        q_static.copy_(rand((max_batch, hq, d), "float16", g))
        return indptr, indices

    def check(kv_lens, indptr, indices):
        for i, n in enumerate(kv_lens):
            ids = torch.from_numpy(indices[indptr[i]: indptr[i + 1]]).long().cuda()
            k8 = cache[0].view(torch.uint8)[ids].reshape(-1, hk, d)[:n].view(kv.dtype)
            v8 = cache[1].view(torch.uint8)[ids].reshape(-1, hk, d)[:n].view(kv.dtype)
            ref, ref_lse = sdpa_ref(q_static[i:i + 1], dequantize(k8, ks, 1),
                                    dequantize(v8, vs, 1))
            check_out(out_static[i], ref[0], "float16")
            check_lse(lse_static[i], ref_lse[0])

    lens = [100, 1, 2000, 17]
    indptr, indices = step(lens)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.run(q_static, cache, k_scale=ks, v_scale=vs, out=out_static, lse=lse_static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_static, cache, k_scale=ks, v_scale=vs, out=out_static, lse=lse_static)
    graph.replay()
    torch.cuda.synchronize()
    check(lens, indptr, indices)
    first = out_static.clone()
    # New scale values written into the captured tensors: with the same plan, then with new
    # plans (other lengths, pages, a smaller batch).
    for new_k, new_v, new_lens in ((0.125, 3.0, None), (1.5, 0.5, [7, 4000, 33, 1]),
                                   (None, None, [64, 64, 64])):
        if new_k is None:  # distinct values per head
            ks.copy_(torch.linspace(0.2, 2.0, ks.numel(), device="cuda"))
            vs.copy_(torch.linspace(3.0, 0.3, vs.numel(), device="cuda"))
        else:
            ks.fill_(new_k)
            vs.fill_(new_v)
        if new_lens is not None:
            lens = new_lens
            indptr, indices = step(lens)
        out_static.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        check(lens, indptr, indices)
        if new_lens is None:  # same plan and queries, new scales: a new result
            assert not torch.equal(first, out_static)


# --- quantizing: append_paged_kv_cache and run_step ----------------------------------------------


def read_rows(c, layout, page, slot):
    """Rows [n, H, D] of cache c (fp8) at (page[t], slot[t]), as bytes."""
    b = c.view(torch.uint8)
    return b[page, slot] if layout == "NHD" else b[page, :, slot]


def check_quantized(got_bits, x, scale, fp8):
    """got_bits (uint8 [n, H, D]) against (x.float() / scale).to(fp8): bit for bit wherever that
    and x / scale are finite (torch rounds to nearest even as flashkv; the division is one f32
    division per element, as flashkv's); elsewhere (torch gives NaN / inf, or saturates)
    flashkv saturates to +-the largest finite value; NaN stays NaN. Returns (fits, overflows)."""
    s = (torch.full_like(x, scale, dtype=torch.float32) if not isinstance(scale, torch.Tensor)
         else scale.float().view(1, -1, 1).expand(x.shape).contiguous())
    y = x.float() / s  # a tensor divisor: elementwise IEEE division (no reciprocal)
    ref = y.to(tdtype(fp8))
    got = got_bits.view(tdtype(fp8)).float()
    fits = torch.isfinite(y) & torch.isfinite(ref.float())
    overflow = ~fits & ~torch.isnan(y)
    assert torch.equal(got_bits[fits], ref.view(torch.uint8)[fits])
    assert torch.isnan(got[torch.isnan(y)]).all()
    assert torch.equal(got[overflow], torch.sign(y[overflow]) * MAX_FINITE[fp8])
    return int(fits.sum()), int(overflow.sum())


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("src", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("scales", SCALES)
def test_append_quantizes_as_torch_converts(fp8, src, layout, scales):
    g = gen(47)
    hk, d, ps = 8, 128, 16
    kv_lens = [7, 1, 300, 40]
    cache = Paged(kv_lens, ps, hk, d, fp8, layout, g)
    k_cache, v_cache = cache.k.clone(), cache.v.clone()
    # Tokens at assorted positions (each slot once), values over the format's range and past it.
    rng = np.random.default_rng(3)
    batch, pos = [], []
    for b, n in enumerate(kv_lens):
        for p in sorted(rng.choice(n, size=min(n, 9), replace=False)):
            batch.append(b)
            pos.append(int(p))
    nnz = len(batch)
    big = min(MAX_FINITE[fp8] * 2, 6e4 if src == "float16" else 1e6)
    key = ((torch.rand(nnz, hk, d, generator=g, device="cuda") * 2 - 1) * big).to(tdtype(src))
    magnitude = torch.tensor([1e-3, 1.0, 30.0], device="cuda")[
        torch.arange(nnz, device="cuda") % 3]  # subnormal, normal and larger values
    value = (torch.randn(nnz, hk, d, generator=g, device="cuda") * magnitude[:, None, None])
    value = value.to(tdtype(src))
    key[0, 0, :4] = torch.tensor([math.nan, math.inf, -math.inf, 0.0], device="cuda")
    ks, vs = scale_args(scales, hk, seed=4)
    flashkv.append_paged_kv_cache(key, value, i32(batch), i32(pos), (k_cache, v_cache),
                                  cache.indices, cache.indptr, cache.last_page_len,
                                  kv_layout=layout, k_scale=ks, v_scale=vs)
    flashkv.check_device_errors()
    pos_t = torch.tensor(pos, device="cuda")
    page = cache.indices[cache.indptr[torch.tensor(batch, device="cuda")].long() + pos_t // ps]
    page, slot = page.long(), (pos_t % ps).long()
    fits, overflow = check_quantized(read_rows(k_cache, layout, page, slot), key, ks, fp8)
    assert fits > 0 and overflow > 0
    check_quantized(read_rows(v_cache, layout, page, slot), value, vs, fp8)
    # Nothing else changed.
    mask = torch.ones(k_cache.shape[:2] if layout == "NHD" else
                      (k_cache.shape[0], k_cache.shape[2]), dtype=torch.bool, device="cuda")
    mask[page, slot] = False
    for new, old in ((k_cache, cache.k), (v_cache, cache.v)):
        a, b = new.view(torch.uint8), old.view(torch.uint8)
        if layout == "HND":
            a, b = a.transpose(1, 2), b.transpose(1, 2)
        assert torch.equal(a[mask], b[mask])


@pytest.mark.parametrize("fp8", FP8)
def test_append_host_and_gpu_agree(fp8):
    """The GPU append and the CPU reference's quantize the same bits (non-power-of-two scales)."""
    g = gen(48)
    hk, d, ps = 4, 64, 16
    cache = Paged([40, 9], ps, hk, d, fp8, "NHD", g)
    batch, pos = i32([0, 0, 0, 1, 1, 1]), i32([0, 13, 39, 2, 3, 8])
    ks, vs = torch.tensor([0.3, 0.7, 1.1, 2.9], device="cuda"), 0.013
    for src in ("float16", "bfloat16", "float32"):
        key = (torch.randn(6, hk, d, generator=g, device="cuda") * 100).to(tdtype(src))
        value = torch.randn(6, hk, d, generator=g, device="cuda").to(tdtype(src))
        gpu = (cache.k.clone(), cache.v.clone())
        flashkv.append_paged_kv_cache(key, value, batch, pos, gpu, cache.indices, cache.indptr,
                                      cache.last_page_len, k_scale=ks, v_scale=vs)
        host = (cache.k.cpu(), cache.v.cpu())
        flashkv.append_paged_kv_cache(key.cpu(), value.cpu(), batch.cpu(), pos.cpu(), host,
                                      cache.indices.cpu(), cache.indptr.cpu(),
                                      cache.last_page_len.cpu(), k_scale=ks.cpu(), v_scale=vs)
        for a, b in zip(gpu, host):
            assert torch.equal(a.view(torch.uint8).cpu(), b.view(torch.uint8))


@pytest.mark.parametrize("fp8", FP8)
def test_append_copies_fp8_rows(fp8):
    g = gen(49)
    hk, d, ps = 8, 128, 16
    cache = Paged([20], ps, hk, d, fp8, "HND", g)
    rows = rand((2, hk, d), fp8, g)
    k_cache, v_cache = cache.k.clone(), cache.v.clone()
    flashkv.append_paged_kv_cache(rows, rows, i32([0, 0]), i32([3, 19]), (k_cache, v_cache),
                                  cache.indices, cache.indptr, cache.last_page_len,
                                  kv_layout="HND", k_scale=3.0)  # copied: no scale applies
    pos = torch.tensor([3, 19], device="cuda")
    page = cache.indices[pos // ps].long()
    assert torch.equal(read_rows(k_cache, "HND", page, (pos % ps).long()),
                       rows.view(torch.uint8))


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rope", ["none", "llama31"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("scales", SCALES)
def test_run_step_fp8_equals_append_then_run(fp8, dtype, rope, layout, scales):
    """run_step over an fp8 cache (new keys/values in q's dtype, quantized with the scales) ==
    RoPE -> append_paged_kv_cache(k_scale=, v_scale=) -> run(k_scale=, v_scale=): cache and
    outputs bitwise."""
    g = gen(50)
    hq, hk, d, ps = 32, 8, 128, 16
    kv_lens = [1, 17, 16, 300, 2048, 33]  # after the append
    cache = Paged(kv_lens, ps, hk, d, fp8, layout, g)
    b = len(kv_lens)
    q = rand((b, hq, d), dtype, g)
    k_new, v_new = rand((b, hk, d), dtype, g), rand((b, hk, d), dtype, g)
    ks, vs = scale_args(scales, hk, seed=5)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace(), layout)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           q_data_type=tdtype(dtype), kv_data_type=tdtype(fp8))
    fused = (cache.k.clone(), cache.v.clone())
    out, lse = w.run_step(q, k_new, v_new, fused, rope=rope, k_scale=ks, v_scale=vs,
                          return_lse=True)
    unfused = (cache.k.clone(), cache.v.clone())
    pos = i32(kv_lens) - 1
    q_rot, k_rot = (q, k_new) if rope == "none" else flashkv.apply_llama31_rope_pos_ids(
        q, k_new, pos)
    flashkv.append_paged_kv_cache(k_rot, v_new, torch.arange(b, dtype=torch.int32, device="cuda"),
                                  pos, unfused, cache.indices, cache.indptr, cache.last_page_len,
                                  kv_layout=layout, k_scale=ks, v_scale=vs)
    ref_out, ref_lse = w.run(q_rot, unfused, k_scale=ks, v_scale=vs, return_lse=True)
    flashkv.check_device_errors()
    for a, c in zip(fused, unfused):
        assert torch.equal(a.view(torch.uint8), c.view(torch.uint8))
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    # And against SDPA over the updated (dequantized) cache.
    updated = copy.copy(cache)
    updated.k, updated.v = fused
    check_paged(updated, decode_rows(q_rot), out, lse, ks, vs, dtype)


# --- argument checks that need CUDA tensors -----------------------------------------------------


def test_scale_tensors_must_be_on_the_caches_device():
    g = gen(51)
    cache = Paged([5, 40], 16, 8, 128, "float8_e4m3fn", "NHD", g)
    q = rand((2, 32, 128), "float16", g)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(cache.indptr, cache.indices, cache.last_page_len, 32, 8, 128, 16,
           kv_data_type=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"k_scale: expected an array on cuda:0 \(the KV "
                                         r"cache's device"):
        w.run(q, (cache.k, cache.v), k_scale=torch.ones(1))
    with pytest.raises(ValueError, match=r"v_scale: expected shape \[1\] or \[8"):
        w.run(q, (cache.k, cache.v), v_scale=torch.ones(32, device="cuda"))
    with pytest.raises(ValueError, match="v_scale: expected a float32 array"):
        w.run(q, (cache.k, cache.v), v_scale=torch.ones(8, device="cuda", dtype=torch.float16))
    # A 16-bit cache: scales other than None / 1.0 are refused (fold them into sm_scale).
    c16 = Paged([5, 40], 16, 8, 128, "float16", "NHD", g)
    w.plan(c16.indptr, c16.indices, c16.last_page_len, 32, 8, 128, 16)
    w.run(q, (c16.k, c16.v), k_scale=1.0, v_scale=1.0)
    with pytest.raises(ValueError, match="k_scale=<array>.*fp8 KV caches"):
        w.run(q, (c16.k, c16.v), k_scale=torch.ones(1, device="cuda"))
    with pytest.raises(ValueError, match="k_scale=0.5.*sm_scale"):
        w.run(q, (c16.k, c16.v), k_scale=0.5)


@pytest.mark.parametrize("fp8", FP8)
def test_torch_compile_decode_with_tensor_scales(fp8):
    """torch.compile(fullgraph=True) of a decode run over an fp8 cache with tensor scales: the
    custom op carries them (Optional[Tensor]); equal to eager, and new scale values need no
    recompile."""
    g = gen(52)
    hq, hk, d, ps = 32, 8, 128, 16
    cache = Paged([5, 700, 64], ps, hk, d, fp8, "NHD", g)
    q = rand((3, hq, d), "bfloat16", g)
    ks, vs = scale_args("per_head", hk, seed=6)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hk, d, ps,
           q_data_type=torch.bfloat16, kv_data_type=fp8)
    f = torch.compile(lambda q, kv, ks, vs: w.run(q, kv, k_scale=ks, v_scale=vs,
                                                  return_lse=True), fullgraph=True)
    kv = (cache.k, cache.v)
    got = f(q, kv, ks, vs)
    ref = w.run(q, kv, k_scale=ks, v_scale=vs, return_lse=True)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = f(q, kv, ks * 2, vs * 0.5)
    ref = w.run(q, kv, k_scale=ks * 2, v_scale=vs * 0.5, return_lse=True)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
