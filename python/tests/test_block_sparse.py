"""flashkv.BlockSparseAttentionWrapper (FlashInfer's flashinfer.sparse API) against dense masked
attention computed here in float64 from the BSR description: random patterns with R != C,
empty block rows, element masks (``mask`` and ``packed_mask`` alike), causal by position,
soft-cap and sinks; the errors plan() and run() raise. Host arrays (the CPU reference) in CI; the
GPU test runs the same cases on CUDA tensors."""

import math

import numpy as np
import pytest

import flashkv
from conftest import LOG2E, UNIT_ROUNDOFF, assert_close, assert_lse2, rand, requires_gpu, to_fw


def bsr(rng, MB, NB, density, empty_row=None):
    """(indptr, indices): block row empty_row has no block; columns in random order."""
    indptr, indices = [0], []
    for i in range(MB):
        row = [j for j in range(NB) if i != empty_row and rng.uniform() < density]
        rng.shuffle(row)
        indices += row
        indptr.append(len(indices))
    return np.array(indptr, np.int32), np.array(indices, np.int32)


def dense_visible(indptr, indices, M, N, R, C, mask=None, causal=False):
    """[M, N] bool: the keys each query row sees."""
    vis = np.zeros((M, N), bool)
    for i in range(M // R):
        for t in range(indptr[i], indptr[i + 1]):
            j = indices[t]
            block = np.ones((R, C), bool) if mask is None else mask[t].astype(bool)
            vis[i * R:(i + 1) * R, j * C:(j + 1) * C] = block
    if causal:
        vis &= np.arange(N)[None, :] <= np.arange(M)[:, None] + N - M
    return vis


def rope_rows(x, pos, theta):
    """Llama RoPE (rotate-half pairs) of x [n, h, d] at positions pos [n], float64."""
    d = x.shape[-1]
    f = theta ** (-np.arange(0, d // 2) * 2.0 / d)
    a = np.asarray(pos, np.float64)[:, None] * f[None, :]
    c, s = np.cos(a)[:, None, :], np.sin(a)[:, None, :]
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def masked_attention(q, k, v, vis, sm_scale=None, cap=0.0, sinks=None, slopes=None,
                     rope_theta=None):
    """(out, natural-log lse) in float64 over the visible keys; GQA by head // group. ALiBi
    (slopes [hq]) and RoPE (rope_theta) at token positions: query row m at m + N - M, key n."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    M, hq, d = q.shape
    N = k.shape[0]
    qpos = np.arange(M) + N - M
    if rope_theta is not None:
        q, k = rope_rows(q, qpos, rope_theta), rope_rows(k, np.arange(N), rope_theta)
    group = hq // k.shape[1]
    kk, vv = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("qhd,khd->qhk", q, kk) * (1.0 / math.sqrt(d) if sm_scale is None else sm_scale)
    if slopes is not None:
        s = s + np.asarray(slopes, np.float64)[None, :, None] * (
            np.arange(N)[None, None, :] - qpos[:, None, None])
    if cap:
        s = cap * np.tanh(s / cap)
    s = np.where(vis[:, None, :], s, -np.inf)
    sink = np.full(hq, -np.inf) if sinks is None else np.asarray(sinks, np.float64)
    m = np.maximum(s.max(axis=-1, initial=-np.inf), sink[None, :])
    seen = np.isfinite(m)
    m0 = np.where(seen, m, 0.0)
    p = np.exp(s - m0[..., None])
    denom = p.sum(axis=-1) + np.exp(sink[None, :] - m0)
    safe = np.where(seen, denom, 1.0)
    out = np.einsum("qhk,khd->qhd", p, vv) / safe[..., None]
    out[~seen] = 0.0
    return out, np.where(seen, m0 + np.log(safe), -np.inf)


def make_case(rng, R, C, MB, NB, density, hq, hkv, d, dtype, element_mask=False):
    indptr, indices = bsr(rng, MB, NB, density, empty_row=MB // 2)
    M, N = R * MB, C * NB
    mask = (rng.uniform(size=(len(indices), R, C)) < 0.7) if element_mask else None
    q = rand(rng, (M, hq, d), dtype)
    k = rand(rng, (N, hkv, d), dtype)
    v = rand(rng, (N, hkv, d), dtype)
    return dict(indptr=indptr, indices=indices, M=M, N=N, R=R, C=C, mask=mask, q=q, k=k, v=v)


def plan_run(w, c, fw="numpy", causal=False, packed=False, **kw):
    mask = c["mask"]
    mask_kw = {}
    if mask is not None:
        mask_kw = ({"packed_mask": np.packbits(mask.reshape(-1), bitorder="little")} if packed
                   else {"mask": to_fw(mask, fw)})
    hq, d = c["q"].shape[1:]
    w.plan(to_fw(c["indptr"], fw), to_fw(c["indices"], fw), c["M"], c["N"], c["R"], c["C"], hq,
           c["k"].shape[1], d, causal=causal, q_data_type=c["q"].dtype.name, **mask_kw, **kw)
    return w.run(to_fw(c["q"], fw), to_fw(c["k"], fw), to_fw(c["v"], fw), return_lse=True)


@pytest.mark.parametrize("R,C,causal,element_mask", [
    (3, 5, False, False), (16, 4, True, False), (1, 1, True, True), (8, 24, False, True),
])
def test_matches_dense_masked_attention(fw, R, C, causal, element_mask):
    rng = np.random.default_rng(R * 100 + C)
    c = make_case(rng, R, C, MB=6, NB=5, density=0.5, hq=4, hkv=2, d=64, dtype="float16",
                  element_mask=element_mask)
    w = flashkv.BlockSparseAttentionWrapper(np.empty(1, np.uint8))
    out, lse = plan_run(w, c, fw, causal=causal)
    vis = dense_visible(c["indptr"], c["indices"], c["M"], c["N"], R, C, c["mask"], causal)
    ref, ref_lse = masked_attention(c["q"], c["k"], c["v"], vis)
    assert_close(out, ref, "float16")
    assert_lse2(lse, ref_lse)
    assert np.isneginf(ref_lse).any()  # the empty block row


def test_packed_mask_soft_cap_and_sinks():
    rng = np.random.default_rng(7)
    c = make_case(rng, 4, 4, MB=5, NB=6, density=0.6, hq=2, hkv=1, d=64, dtype="float32",
                  element_mask=True)
    sinks = np.array([0.5, -1.0], np.float32)
    w = flashkv.BlockSparseAttentionWrapper(np.empty(1, np.uint8))
    kw = dict(logits_soft_cap=2.0, sm_scale=0.2, sinks=sinks)
    out_p, lse_p = plan_run(w, c, packed=True, causal=True, **kw)
    out_m, lse_m = plan_run(w, c, packed=False, causal=True, **kw)
    np.testing.assert_array_equal(out_p, out_m)
    vis = dense_visible(c["indptr"], c["indices"], c["M"], c["N"], 4, 4, c["mask"], True)
    ref, ref_lse = masked_attention(c["q"], c["k"], c["v"], vis, 0.2, 2.0, sinks)
    assert_close(out_p, ref, "float32")
    assert_lse2(lse_p, ref_lse)


@pytest.mark.parametrize("mode", ["ALIBI", "ROPE_LLAMA"])
def test_alibi_and_rope_at_token_positions(mode):
    """Blocks gathered out of order and with gaps: ALiBi / RoPE use the tokens' own positions."""
    from flashkv.variants import alibi_slopes_for

    rng = np.random.default_rng(19)
    c = make_case(rng, 4, 8, MB=6, NB=5, density=0.5, hq=4, hkv=2, d=64, dtype="float32")
    w = flashkv.BlockSparseAttentionWrapper(np.empty(1, np.uint8))
    out, lse = plan_run(w, c, causal=True, pos_encoding_mode=mode, rope_theta=500.0)
    vis = dense_visible(c["indptr"], c["indices"], c["M"], c["N"], 4, 8, None, True)
    ref, ref_lse = masked_attention(
        c["q"], c["k"], c["v"], vis, slopes=alibi_slopes_for(4) if mode == "ALIBI" else None,
        rope_theta=500.0 if mode == "ROPE_LLAMA" else None)
    assert_close(out, ref, "float32")
    assert_lse2(lse, ref_lse)


def test_bad_plans_and_runs_are_named():
    rng = np.random.default_rng(3)
    c = make_case(rng, 2, 2, MB=3, NB=3, density=1.0, hq=2, hkv=2, d=64, dtype="float16")
    w = flashkv.BlockSparseAttentionWrapper(np.empty(1, np.uint8))
    with pytest.raises(ValueError, match="plan"):
        w.run(c["q"], c["k"], c["v"])
    far = c["indices"].copy()
    far[0] = 3
    with pytest.raises(ValueError, match=r"outside \[0, N / C = 3\)"):
        w.plan(c["indptr"], far, 6, 6, 2, 2, 2, 2, 64)
    twice = c["indices"].copy()
    twice[1] = twice[0]
    with pytest.raises(ValueError, match="repeated in block row 0"):
        w.plan(c["indptr"], twice, 6, 6, 2, 2, 2, 2, 64)
    with pytest.raises(ValueError, match="not a multiple of R"):
        w.plan(c["indptr"], c["indices"], 7, 6, 2, 2, 2, 2, 64)
    with pytest.raises(ValueError, match="pos_encoding_mode"):
        w.plan(c["indptr"], c["indices"], 6, 6, 2, 2, 2, 2, 64, pos_encoding_mode="XPOS")
    with pytest.raises(ValueError, match="mask"):
        w.plan(c["indptr"], c["indices"], 6, 6, 2, 2, 2, 2, 64, mask=np.ones(5, bool))
    w.plan(c["indptr"], c["indices"], 6, 6, 2, 2, 2, 2, 64)
    with pytest.raises(ValueError, match="k: expected N = 6"):
        w.run(c["q"], c["k"][:4], c["v"][:4])


@requires_gpu
@pytest.mark.parametrize("mode", ["ALIBI", "ROPE_LLAMA"])
def test_gpu_alibi_and_rope_at_token_positions(mode):
    import torch

    from flashkv.variants import alibi_slopes_for

    rng = np.random.default_rng(29)
    c = make_case(rng, 16, 16, MB=8, NB=8, density=0.4, hq=8, hkv=2, d=128, dtype="float16")
    t = {n: torch.from_numpy(c[n]).cuda() for n in "qkv"}
    w = flashkv.BlockSparseAttentionWrapper(torch.empty(64 << 20, dtype=torch.uint8,
                                                        device="cuda"))
    w.plan(c["indptr"], c["indices"], c["M"], c["N"], 16, 16, 8, 2, 128, causal=True,
           q_data_type="float16", pos_encoding_mode=mode, rope_theta=500.0)
    out = w.run(t["q"], t["k"], t["v"]).cpu().numpy()
    vis = dense_visible(c["indptr"], c["indices"], c["M"], c["N"], 16, 16, None, True)
    ref, _ = masked_attention(c["q"], c["k"], c["v"], vis,
                              slopes=alibi_slopes_for(8) if mode == "ALIBI" else None,
                              rope_theta=500.0 if mode == "ROPE_LLAMA" else None)
    assert_close(out, ref, "float16")


@requires_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_matches_dense_masked_attention(dtype):
    import torch

    rng = np.random.default_rng(11)
    for R, C, causal, element_mask in [(16, 16, True, False), (3, 64, False, True), (1, 1, True,
                                                                                      False)]:
        c = make_case(rng, R, C, MB=8, NB=8, density=0.4, hq=8, hkv=2, d=128, dtype="float32",
                      element_mask=element_mask)
        t = {n: torch.from_numpy(c[n]).to("cuda", getattr(torch, dtype)) for n in "qkv"}
        exact = {n: t[n].float().cpu().numpy() for n in "qkv"}
        w = flashkv.BlockSparseAttentionWrapper(torch.empty(64 << 20, dtype=torch.uint8,
                                                            device="cuda"))
        mask_kw = {} if c["mask"] is None else {"mask": torch.from_numpy(c["mask"])}
        w.plan(c["indptr"], c["indices"], c["M"], c["N"], R, C, 8, 2, 128, causal=causal,
               q_data_type=dtype, **mask_kw)
        out, lse = w.run(t["q"], t["k"], t["v"], return_lse=True)
        vis = dense_visible(c["indptr"], c["indices"], c["M"], c["N"], R, C, c["mask"], causal)
        ref, ref_lse = masked_attention(exact["q"], exact["k"], exact["v"], vis)
        err = np.abs(out.float().cpu().numpy() - ref).max() / max(np.abs(ref).max(), 1e-30)
        assert err <= min(4 * UNIT_ROUNDOFF[dtype], 1e-2), (R, C, err)
        got = lse.cpu().numpy().astype(np.float64)
        np.testing.assert_allclose(got, ref_lse * LOG2E, rtol=1e-3, atol=1e-3)


def select_tokens(rng, cache, kv_lens, page, frac):
    """(chosen token positions per request, view page ids, indptr): a random subset of each
    request's tokens (all of a one-token request), as a page table over token_pages()."""
    chosen, ids, indptr = [], [], [0]
    for r, n in enumerate(kv_lens):
        toks = [t for t in range(n) if n == 1 or rng.uniform() < frac]
        chosen.append(toks)
        pages = cache.indices[cache.indptr[r]:cache.indptr[r + 1]]
        ids += [int(pages[t // page]) * page + t % page for t in toks]
        indptr.append(len(ids))
    return chosen, ids, indptr


def test_token_selection_decode_over_token_pages(fw):
    """Sparse-KV decode: each request attends to a chosen subset of its tokens through the
    ordinary decode wrapper over token_pages(k) with page_size 1; equals attention over the
    gathered tokens."""
    from conftest import PagedCache, attention_ref

    rng = np.random.default_rng(21)
    kv_lens, page, hq, hk, d = [300, 40, 1], 16, 8, 2, 64
    cache = PagedCache(rng, kv_lens, page, hk, d, np.float16, "NHD")
    kt, vt = flashkv.token_pages(cache.k), flashkv.token_pages(cache.v)
    assert kt.shape == (cache.k.shape[0] * page, 1, hk, d)
    assert np.shares_memory(kt, cache.k)
    chosen, ids, indptr = select_tokens(rng, cache, kv_lens, page, 0.3)
    q = rand(rng, (len(kv_lens), hq, d), np.float16)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(np.empty(1, np.uint8))
    w.plan(to_fw(np.array(indptr, np.int32), fw), to_fw(np.array(ids, np.int32), fw),
           to_fw(np.ones(len(kv_lens), np.int32), fw), hq, hk, d, 1, q_data_type="float16")
    out, lse = w.run(to_fw(q, fw), (to_fw(kt, fw), to_fw(vt, fw)), return_lse=True)
    for r, toks in enumerate(chosen):
        k, v = cache.gather(r)
        ref, ref_lse = attention_ref(q[r:r + 1], k[toks], v[toks])
        assert_close(out[r], ref[0], "float16")
        assert_lse2(lse[r], ref_lse[0])
    with pytest.raises(ValueError, match="NHD"):
        flashkv.token_pages(cache.k, "HND")


@requires_gpu
def test_gpu_token_selection_decode():
    import torch

    from conftest import PagedCache, attention_ref

    rng = np.random.default_rng(22)
    kv_lens, page, hq, hk, d = [4000, 513, 1, 64], 16, 32, 8, 128
    cache = PagedCache(rng, kv_lens, page, hk, d, np.float16, "NHD")
    k, v = (torch.from_numpy(x).cuda() for x in (cache.k, cache.v))
    kt, vt = flashkv.token_pages(k), flashkv.token_pages(v)
    assert kt.data_ptr() == k.data_ptr()
    chosen, ids, indptr = select_tokens(rng, cache, kv_lens, page, 0.1)
    q = rand(rng, (len(kv_lens), hq, d), np.float16)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8,
                                                               device="cuda"))
    w.plan(torch.tensor(indptr, dtype=torch.int32, device="cuda"),
           torch.tensor(ids, dtype=torch.int32, device="cuda"),
           torch.ones(len(kv_lens), dtype=torch.int32, device="cuda"), hq, hk, d, 1,
           q_data_type="float16")
    out = w.run(torch.from_numpy(q).cuda(), (kt, vt)).cpu().numpy()
    for r, toks in enumerate(chosen):
        kg, vg = cache.gather(r)
        ref, _ = attention_ref(q[r:r + 1], kg[toks], vg[toks])
        assert_close(out[r], ref[0], "float16")


def select_per_head(rng, cache, kv_lens, page, hk, layout, frac):
    """Per (request, KV head) selections as page tables over head_pages(): NHD tokens (view page
    (p * S + s) * H + h, page_size 1), HND pages (view page p * H + h, page_size S; a request's
    partial last page, when chosen, last). Returns (chosen token positions per (r, h), ids,
    indptr, last_page_len)."""
    chosen, ids, indptr, last = [], [], [0], []
    for r, n in enumerate(kv_lens):
        pages = cache.indices[cache.indptr[r]:cache.indptr[r + 1]]
        for h in range(hk):
            toks, last_len = [], page if layout == "HND" else 1
            for pi, p in enumerate(pages):
                in_page = min(page, n - pi * page)
                if layout == "HND":
                    if len(pages) > 1 and rng.uniform() >= frac:
                        continue
                    ids.append(int(p) * hk + h)
                    toks += range(pi * page, pi * page + in_page)
                    last_len = in_page
                    continue
                for s in range(in_page):
                    if n == 1 or rng.uniform() < frac:
                        ids.append((int(p) * page + s) * hk + h)
                        toks.append(pi * page + s)
            chosen.append(toks)
            indptr.append(len(ids))
            last.append(last_len)
    return chosen, ids, indptr, last


def check_head_selection(out, lse, q, cache, chosen, hk, dtype):
    from conftest import attention_ref

    B, hq, d = q.shape
    g = hq // hk
    for rh, toks in enumerate(chosen):
        r, h = divmod(rh, hk)
        kg, vg = cache.gather(r)
        ref, ref_lse = attention_ref(q[r:r + 1, h * g:(h + 1) * g],
                                     kg[toks][:, h:h + 1], vg[toks][:, h:h + 1])
        assert_close(out[r, h * g:(h + 1) * g], ref[0], dtype)
        if lse is not None:
            assert_lse2(lse[r, h * g:(h + 1) * g], ref_lse[0])


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_per_head_selection_decode_over_head_pages(fw, layout):
    """Selections per request and KV head: the decode wrapper over head_pages(k) with the
    group's query heads and one KV head, q / out viewed [B * H, group, D]; equals attention over
    each head's gathered tokens."""
    from conftest import PagedCache

    rng = np.random.default_rng(23)
    kv_lens, page, hq, hk, d = [300, 40, 1], 16, 8, 2, 64
    cache = PagedCache(rng, kv_lens, page, hk, d, np.float16, layout)
    kh, vh = flashkv.head_pages(cache.k, layout), flashkv.head_pages(cache.v, layout)
    assert np.shares_memory(kh, cache.k)
    chosen, ids, indptr, last = select_per_head(rng, cache, kv_lens, page, hk, layout, 0.4)
    q = rand(rng, (len(kv_lens), hq, d), np.float16)
    B = len(kv_lens)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(np.empty(1, np.uint8), kv_layout=layout)
    w.plan(to_fw(np.array(indptr, np.int32), fw), to_fw(np.array(ids, np.int32), fw),
           to_fw(np.array(last, np.int32), fw), hq // hk, 1, d,
           1 if layout == "NHD" else page, q_data_type="float16")
    out, lse = w.run(to_fw(q.reshape(B * hk, hq // hk, d), fw), (to_fw(kh, fw), to_fw(vh, fw)),
                     return_lse=True)
    out = np.asarray(out).reshape(B, hq, d)
    lse = np.asarray(lse).reshape(B, hq)
    check_head_selection(out, lse, q, cache, chosen, hk, "float16")
    with pytest.raises(ValueError, match="kv_layout"):
        flashkv.head_pages(cache.k, "XYZ")


@requires_gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_gpu_per_head_selection_decode_in_a_graph(layout):
    """Per-head selections on the GPU, captured once in a CUDA graph and replayed with a new
    selection written into the same page-id buffer (same counts)."""
    import torch

    from conftest import PagedCache

    rng = np.random.default_rng(24)
    kv_lens, page, hq, hk, d = [4000, 513, 1, 64], 16, 32, 8, 128
    cache = PagedCache(rng, kv_lens, page, hk, d, np.float16, layout)
    k, v = (torch.from_numpy(x).cuda() for x in (cache.k, cache.v))
    kh, vh = flashkv.head_pages(k, layout), flashkv.head_pages(v, layout)
    assert kh.data_ptr() == k.data_ptr()
    B, g = len(kv_lens), hq // hk
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    chosen, ids, indptr, last = select_per_head(rng, cache, kv_lens, page, hk, layout, 0.3)
    ids_d = torch.tensor(ids, dtype=torch.int32, device="cuda")
    indptr_d = torch.tensor(indptr, dtype=torch.int32, device="cuda")
    last_d = torch.tensor(last, dtype=torch.int32, device="cuda")
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(
        ws, layout, use_cuda_graph=True, paged_kv_indptr_buffer=indptr_d,
        paged_kv_indices_buffer=ids_d, paged_kv_last_page_len_buffer=last_d)
    w.plan(indptr_d, ids_d, last_d, g, 1, d, 1 if layout == "NHD" else page,
           q_data_type="float16")
    q = torch.from_numpy(rand(rng, (B, hq, d), np.float16)).cuda()
    out = torch.empty_like(q)
    w.run(q.view(B * hk, g, d), (kh, vh), out=out.view(B * hk, g, d))  # warm-up, outside
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q.view(B * hk, g, d), (kh, vh), out=out.view(B * hk, g, d))
    graph.replay()
    torch.cuda.synchronize()
    check_head_selection(out.cpu().numpy(), None, q.cpu().numpy(), cache, chosen, hk, "float16")
    # A new selection with the same counts per (request, head): new ids, same graph.
    ids2 = []
    for rh in range(B * hk):
        r, h = divmod(rh, hk)
        n = indptr[rh + 1] - indptr[rh]
        pages = cache.indices[cache.indptr[r]:cache.indptr[r + 1]]
        if layout == "NHD":
            toks = sorted(rng.choice(kv_lens[r], size=n, replace=False).tolist())
            ids2 += [(int(pages[t // page]) * page + t % page) * hk + h for t in toks]
            chosen[rh] = toks
        else:  # the request's last page stays last where it was chosen (last_page_len)
            last_kept = bool(chosen[rh]) and chosen[rh][-1] == kv_lens[r] - 1
            m = n - (1 if last_kept else 0)
            pick = sorted(rng.choice(len(pages) - 1, size=m, replace=False).tolist()) if m else []
            if last_kept:
                pick.append(len(pages) - 1)
            ids2 += [int(pages[pi]) * hk + h for pi in pick]
            chosen[rh] = [t for pi in pick
                          for t in range(pi * page, min(kv_lens[r], (pi + 1) * page))]
    ids_d.copy_(torch.tensor(ids2, dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check_head_selection(out.cpu().numpy(), None, q.cpu().numpy(), cache, chosen, hk, "float16")
