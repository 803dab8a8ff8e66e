"""B1-B4 on the GPU (sparse_workloads.py): flashkv and its peers in one process, each checked on
sampled rows against a float32 torch reference of the same mask.

- B1 / B2 (block-sparse causal prefill): flashkv's BlockSparseAttentionWrapper; dense flashkv
  (causal single prefill over all 32k keys); FlexAttention with a BlockMask of the same pattern
  (BLOCK_SIZE = the pattern's block, torch.compile'd); SDPA with a dense boolean mask [M, N].
- B3 / B4 (sparse-KV decode, a selection per request and KV head): flashkv's decode wrapper over
  head_pages() (NHD: token ids, page_size 1; B4 also HND: page ids, page_size 16); dense flashkv
  decode over the whole context and over `selected` contiguous tokens (B3's target compares with
  the latter); SDPA over the whole context (no mask) and with a dense boolean mask; Flex with a
  BlockMask from the selection. Peers read contiguous KV (which favours them); the query heads of
  a KV head are its query rows ([B, H_kv, group, D]), the same arithmetic without a copy of K/V.

Counting: B1 / B2 FLOPs = 4 * D * H_qo * visible (query, key) pairs; B3 / B4 bytes = q + the
selected K and V once + out. Times: median of CUDA events around run() (plan excluded).
"""

import math
import time

import torch
import torch.nn.functional as F

import flashkv

from . import gpu
from . import sparse_workloads as SW

F16 = torch.float16


def _reps(fn, reps, budget_s=20.0):
    """Timing with fewer reps for slow peers: at most budget_s of timed work (>= 5 reps)."""
    t0 = time.perf_counter()
    fn(0)
    torch.cuda.synchronize()
    one = time.perf_counter() - t0
    n = max(5, min(reps, int(budget_s / max(one, 1e-6))))
    return gpu.time_events(fn, n, warmup=2)


def _sdpa_math(q, k, v, mask):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _check(got, ref, dtype="f16"):
    lowp = ref.to(F16).float()
    err = gpu.rel(got.float(), ref) if torch.isfinite(got).all() else math.nan
    bound = gpu.W.error_bound(gpu.rel(lowp, ref), dtype)
    return err, bound, bool(err <= bound)


def _row(w, system, timing, *, flops=None, nbytes=None, err=None, bound=None, ok=None,
         notes="", **extra):
    s = timing["time_us"] * 1e-6
    row = dict(workload=w.id, kind="sparse", shape="gqa-32-8", dtype="f16", kv_dtype="f16",
               system=system, api="python", **timing,
               tflops=flops / s / 1e12 if flops else None,
               tbps=nbytes / s / 1e12 if nbytes else None, rel_err=err, rel_err_bound=bound,
               ref_ok=ok, notes=notes, **extra)
    if flops:
        row["flops"] = flops
    if nbytes:
        row["bytes"] = nbytes
    return row


# --- B1 / B2: block-sparse prefill ---


def run_block(w: SW.BlockWorkload, reps, log, no_flex=False, peers=True):
    rows, fails = [], []
    n, blk, hq, hkv, d = w.n, w.block, SW.HQ, SW.HKV, SW.HEAD_DIM
    indptr, indices = SW.bsr_pattern(w)
    mb = w.blocks_per_side
    density = len(indices) / SW.causal_blocks(mb)
    pairs = SW.causal_pairs(w, indptr, indices)
    flops = 4.0 * d * hq * pairs
    g = torch.Generator(device="cuda").manual_seed(w.seed)
    q = gpu.uniform((n, hq, d), F16, g)
    k = gpu.uniform((n, hkv, d), F16, g)
    v = gpu.uniform((n, hkv, d), F16, g)
    extra = dict(blocks=len(indices), density=density, pairs=pairs, R=blk, C=blk, M=n, N=n)
    log(f"{w.id}: {mb} x {mb} blocks of {blk}, {len(indices)} stored ({100 * density:.2f} % of "
        f"the causal triangle), {pairs / (n * (n + 1) / 2) * 100:.2f} % of the causal pairs")
    # The reference on sampled query rows: the first and last of a few block rows.
    blocks = torch.zeros(mb, mb, dtype=torch.bool)
    for i in range(mb):
        blocks[i, indices[indptr[i]:indptr[i + 1]]] = True
    sample = sorted({0, 1, blk - 1, n // 2, n // 2 + blk // 2, n - blk, n - 1, 7 * n // 9})
    st = torch.tensor(sample)
    keys = torch.arange(n)
    vis = blocks[st // blk][:, keys // blk] & (keys[None, :] <= st[:, None])
    qs = q[st.cuda()].float().transpose(0, 1)  # [hq, rows, d]
    kx = k.float().repeat_interleave(hq // hkv, 1).transpose(0, 1)
    vx = v.float().repeat_interleave(hq // hkv, 1).transpose(0, 1)
    ref = _sdpa_math(qs, kx, vx, vis.cuda()).transpose(0, 1)  # [rows, hq, d]
    del kx, vx

    def check_out(out):
        return _check(out[st.cuda()], ref)

    out = torch.empty_like(q)
    ws = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    bsa = flashkv.BlockSparseAttentionWrapper(ws)
    t0 = time.perf_counter()
    bsa.plan(torch.tensor(indptr, dtype=torch.int32), torch.tensor(indices, dtype=torch.int32),
             n, n, blk, blk, hq, hkv, d, causal=True, q_data_type=F16)
    plan_us = (time.perf_counter() - t0) * 1e6
    timing = gpu.time_events(lambda i: bsa.run(q, k, v, out=out), reps)
    out.fill_(math.nan)
    bsa.run(q, k, v, out=out)
    torch.cuda.synchronize()
    err, bound, ok = check_out(out)
    rows.append(_row(w, "flashkv", timing, flops=flops, err=err, bound=bound, ok=ok,
                     plan_py_us=plan_us, **extra))
    log(_fmt(rows[-1]))
    # Dense flashkv: causal over all keys (the 'dense time' of the target).
    out.fill_(math.nan)
    dense_flops = 4.0 * d * hq * n * (n + 1) / 2
    timing = gpu.time_events(
        lambda i: flashkv.single_prefill_with_kv_cache(q, k, v, causal=True, out=out), reps)
    rows.append(_row(w, "flashkv-dense", timing, flops=dense_flops,
                     notes="causal over all keys (dense); tflops count the dense pairs", **extra))
    log(_fmt(rows[-1]))
    del bsa, ws
    if not peers:
        return rows, fails
    qt, kt, vt = (x.transpose(0, 1)[None] for x in (q, k, v))  # [1, H, n, d]
    if not no_flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            bl = blocks.cuda()

            def mask_mod(b, h, qi, ki):
                return bl[qi // blk, ki // blk] & (ki <= qi)

            # Flex's kernels take BlockMask blocks of 128 (its BLOCK_M / BLOCK_N) or multiples:
            # B2's 64 x 64 pattern is described at 128 with the exact mask_mod inside.
            fb = max(blk, 128)
            bm = create_block_mask(mask_mod, None, None, n, n, device="cuda", BLOCK_SIZE=fb)
            flex = torch.compile(flex_attention, dynamic=False)

            def fn(i):
                return flex(qt, kt, vt, block_mask=bm, enable_gqa=True)

            o = fn(0)
            torch.cuda.synchronize()
            timing = _reps(fn, reps)
            err, bound, ok = check_out(o[0].transpose(0, 1))
            rows.append(_row(w, "torch-flex-attention", timing, flops=flops, err=err,
                             bound=bound, ok=ok, notes=f"BlockMask BLOCK_SIZE={fb} from the "
                             f"pattern + causal mask_mod; torch.compile(dynamic=False); "
                             f"contiguous KV", **extra))
            log(_fmt(rows[-1]))
            del o, bm
        except Exception as e:  # noqa: BLE001  (a peer that cannot run is a result)
            fails.append(_fail(w, "torch-flex-attention", e, log))
        torch.cuda.empty_cache()
    try:
        mask = (blocks.cuda()[:, None, :, None].expand(mb, blk, mb, blk).reshape(n, n)
                & torch.ones(n, n, dtype=torch.bool, device="cuda").tril())
        kx = kt.repeat_interleave(hq // hkv, 1)
        vx = vt.repeat_interleave(hq // hkv, 1)

        def fn(i):
            return F.scaled_dot_product_attention(qt, kx, vx, attn_mask=mask)

        o = fn(0)
        torch.cuda.synchronize()
        timing = _reps(fn, reps)
        err, bound, ok = check_out(o[0].transpose(0, 1))
        rows.append(_row(w, "torch-sdpa-dense-mask", timing, flops=flops, err=err, bound=bound,
                         ok=ok, notes="SDPA (auto backend) with a dense bool mask [M, N]; K/V "
                         "repeated to 32 heads; tflops count the sparse pairs", **extra))
        log(_fmt(rows[-1]))
        del o, mask, kx, vx
    except Exception as e:  # noqa: BLE001
        fails.append(_fail(w, "torch-sdpa-dense-mask", e, log))
    torch.cuda.empty_cache()
    return rows, fails


# --- B3 / B4: sparse-KV decode, a selection per request and KV head ---


class Selection:
    """A paged NHD cache (page 16, scattered pages) of `batch` requests of `context` tokens and a
    random selection per (request, KV head): `selected` tokens (page 1) or pages (page 16),
    position order."""

    def __init__(self, w: SW.SelectWorkload):
        self.w = w
        B, hkv, d, page = w.batch, SW.HKV, SW.HEAD_DIM, 16
        self.pages_per_req = w.context // page
        P = B * self.pages_per_req
        g = torch.Generator(device="cuda").manual_seed(w.seed)
        self.k = gpu.uniform((P, page, hkv, d), F16, g)
        self.v = gpu.uniform((P, page, hkv, d), F16, g)
        self.q = gpu.uniform((B, SW.HQ, d), F16, g)
        gc = torch.Generator(device="cuda").manual_seed(w.seed + 1)
        self.page_of = torch.randperm(P, generator=gc, device="cuda").view(B, -1)  # [B, ppr]
        units = w.context // w.page  # tokens or pages to choose from
        scores = torch.rand(B * hkv, units, generator=gc, device="cuda")
        self.chosen = scores.topk(w.selected, dim=1).indices.sort(dim=1).values  # [B*hkv, sel]
        self.selected_tokens = w.selected_tokens

    def tokens(self):
        """Chosen token positions [B * hkv, selected_tokens] (position order)."""
        if self.w.page == 1:
            return self.chosen
        return (self.chosen[:, :, None] * 16 + torch.arange(16, device="cuda")).reshape(
            self.chosen.shape[0], -1)

    def nhd_ids(self):
        """View page ids over head_pages(k, "NHD"): (page * 16 + slot) * H + h."""
        B, hkv = self.w.batch, SW.HKV
        t = self.tokens()
        req = torch.arange(B * hkv, device="cuda") // hkv
        h = torch.arange(B * hkv, device="cuda") % hkv
        p = self.page_of[req[:, None], t // 16]
        return ((p * 16 + t % 16) * hkv + h[:, None]).to(torch.int32).reshape(-1)

    def dense_kv(self):
        """Contiguous [B, hkv, context, d] K and V (the peers' input)."""
        B, hkv, d = self.w.batch, SW.HKV, SW.HEAD_DIM
        k = self.k[self.page_of.reshape(-1)].view(B, -1, hkv, d).transpose(1, 2).contiguous()
        v = self.v[self.page_of.reshape(-1)].view(B, -1, hkv, d).transpose(1, 2).contiguous()
        return k, v

    def mask(self):
        """[B, hkv, 1, context] bool: the selection."""
        B, hkv = self.w.batch, SW.HKV
        m = torch.zeros(B * hkv, self.w.context, dtype=torch.bool, device="cuda")
        m.scatter_(1, self.tokens(), True)
        return m.view(B, hkv, 1, -1)


def _decode_bytes(w, tokens_per_head):
    B, hq, hkv, d = w.batch, SW.HQ, SW.HKV, SW.HEAD_DIM
    return 2 * B * hq * d * 2 + B * hkv * tokens_per_head * d * 2 * 2


def _decode_wrapper(indptr, ids, last, hq, hkv, page, layout="NHD"):
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    wr = flashkv.BatchDecodeWithPagedKVCacheWrapper(ws, layout)
    wr.plan(indptr, ids, last, hq, hkv, SW.HEAD_DIM, page, q_data_type=F16)
    return wr


def run_select(w: SW.SelectWorkload, reps, log, no_flex=False, peers=True):
    rows, fails = [], []
    B, hq, hkv, d = w.batch, SW.HQ, SW.HKV, SW.HEAD_DIM
    grp = hq // hkv
    s = Selection(w)
    sel = s.selected_tokens
    nbytes = _decode_bytes(w, sel)
    extra = dict(batch=B, context=w.context, selected_tokens=sel, selection_page=w.page)
    log(f"{w.id}: batch {B}, context {w.context}, {w.selected} "
        f"{'tokens' if w.page == 1 else 'pages of 16'} per request and KV head")
    # Reference: every (request, KV head) on its gathered tokens, float32.
    k_all, v_all = s.dense_kv()  # [B, hkv, ctx, d]
    toks = s.tokens().view(B, hkv, sel)
    kg = torch.gather(k_all, 2, toks[..., None].expand(B, hkv, sel, d)).float()
    vg = torch.gather(v_all, 2, toks[..., None].expand(B, hkv, sel, d)).float()
    qg = s.q.view(B, hkv, grp, d)
    ref = _sdpa_math(qg.float(), kg, vg, None)  # [B, hkv, grp, d]
    del kg, vg

    def check_out(o):  # o: [B, hq, d] or [B, hkv, grp, d]
        return _check(o.reshape(B, hkv, grp, d), ref)

    out = torch.empty_like(s.q)
    q2 = s.q.view(B * hkv, grp, d)
    o2 = out.view(B * hkv, grp, d)
    indptr = torch.arange(0, B * hkv * sel + 1, sel, dtype=torch.int32)
    # flashkv NHD: token ids over head_pages(k, "NHD"), page_size 1.
    ids = s.nhd_ids()
    kh, vh = flashkv.head_pages(s.k, "NHD"), flashkv.head_pages(s.v, "NHD")
    wr = _decode_wrapper(indptr, ids, torch.ones(B * hkv, dtype=torch.int32), grp, 1, 1)
    timing = gpu.time_events(lambda i: wr.run(q2, (kh, vh), out=o2), reps)
    out.fill_(math.nan)
    wr.run(q2, (kh, vh), out=o2)
    torch.cuda.synchronize()
    err, bound, ok = check_out(out)
    rows.append(_row(w, "flashkv", timing, nbytes=nbytes, err=err, bound=bound, ok=ok,
                     notes="NHD cache; head_pages view, token ids, page_size 1; "
                           f"info {wr.plan_info().get('num_ctas', '')}", **extra))
    log(_fmt(rows[-1]))
    del wr, ids
    if w.page > 1:  # flashkv HND: page ids over head_pages(k, "HND"), page_size 16.
        P = s.k.shape[0]
        k_hnd = s.k.transpose(1, 2).contiguous()
        v_hnd = s.v.transpose(1, 2).contiguous()
        req = torch.arange(B * hkv, device="cuda") // hkv
        h = torch.arange(B * hkv, device="cuda") % hkv
        pid = (s.page_of[req[:, None], s.chosen] * hkv + h[:, None]).to(torch.int32).reshape(-1)
        ip = torch.arange(0, B * hkv * w.selected + 1, w.selected, dtype=torch.int32)
        wr = _decode_wrapper(ip, pid, torch.full((B * hkv,), 16, dtype=torch.int32), grp, 1, 16,
                             "HND")
        kh2, vh2 = flashkv.head_pages(k_hnd, "HND"), flashkv.head_pages(v_hnd, "HND")
        timing = gpu.time_events(lambda i: wr.run(q2, (kh2, vh2), out=o2), reps)
        out.fill_(math.nan)
        wr.run(q2, (kh2, vh2), out=o2)
        torch.cuda.synchronize()
        err, bound, ok = check_out(out)
        rows.append(_row(w, "flashkv-hnd", timing, nbytes=nbytes, err=err, bound=bound, ok=ok,
                         notes="HND cache; head_pages view, page ids, page_size 16", **extra))
        log(_fmt(rows[-1]))
        del wr, k_hnd, v_hnd, kh2, vh2, P
        torch.cuda.empty_cache()
    # Dense flashkv decode over `sel` contiguous tokens (B3's comparator) and over the context.
    for system, n_tok in (("flashkv-dense-selected-len", sel), ("flashkv-dense", w.context)):
        pages = n_tok // 16
        ip = torch.arange(0, B * pages + 1, pages, dtype=torch.int32)
        pid = s.page_of[:, :pages].reshape(-1).to(torch.int32)
        wr = _decode_wrapper(ip, pid, torch.full((B,), 16, dtype=torch.int32), hq, hkv, 16)
        timing = gpu.time_events(lambda i: wr.run(s.q, (s.k, s.v), out=out), reps)
        rows.append(_row(w, system, timing, nbytes=_decode_bytes(w, n_tok),
                         notes=f"dense decode over {n_tok} tokens per request (page 16); tbps "
                               f"count those tokens", **extra))
        log(_fmt(rows[-1]))
        del wr
    if not peers:
        return rows, fails
    torch.cuda.empty_cache()
    mask = s.mask()
    peers = [("torch-sdpa-full-context", None, "SDPA (auto backend) over the whole context, no "
              "mask; contiguous KV; tbps count the selected bytes"),
             ("torch-sdpa-dense-mask", mask, "SDPA (auto backend) with the selection as a dense "
              "bool mask [B, H_kv, 1, ctx]; contiguous KV; tbps count the selected bytes")]
    for system, m, note in peers:
        try:
            def fn(i, m=m):
                return F.scaled_dot_product_attention(qg, k_all, v_all, attn_mask=m)

            o = fn(0)
            torch.cuda.synchronize()
            timing = _reps(fn, reps)
            err, bound, ok = check_out(o) if m is not None else (None, None, None)
            rows.append(_row(w, system, timing, nbytes=nbytes, err=err, bound=bound, ok=ok,
                             notes=note, **extra))
            log(_fmt(rows[-1]))
            del o
        except Exception as e:  # noqa: BLE001
            fails.append(_fail(w, system, e, log))
        torch.cuda.empty_cache()
    if not no_flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            sel_map = mask.view(B, hkv, -1)

            def mask_mod(b, h, qi, ki):
                return sel_map[b, h, ki]

            bm = create_block_mask(mask_mod, B, hkv, grp, w.context, device="cuda")
            flex = torch.compile(flex_attention, dynamic=False)

            def fn(i):
                return flex(qg, k_all, v_all, block_mask=bm)

            o = fn(0)
            torch.cuda.synchronize()
            timing = _reps(fn, reps)
            err, bound, ok = check_out(o)
            rows.append(_row(w, "torch-flex-attention", timing, nbytes=nbytes, err=err,
                             bound=bound, ok=ok, notes="BlockMask (default 128 blocks) from the "
                             "selection, mask_mod per token; query heads of a KV head as its "
                             "rows; contiguous KV", **extra))
            log(_fmt(rows[-1]))
            del o, bm
        except Exception as e:  # noqa: BLE001
            fails.append(_fail(w, "torch-flex-attention", e, log))
    return rows, fails


def _fail(w, system, e, log):
    text = str(e)
    msg = f"{type(e).__name__}: {text[:300]}" + (f" ... {text[-700:]}" if len(text) > 1000 else
                                                 text[300:1000])
    log(f"{w.id:8s} {'gqa-32-8':10s} f16   {system:28s} FAILED: {msg[:200]}")
    torch.cuda.empty_cache()
    return dict(workload=w.id, shape="gqa-32-8", dtype="f16", system=system, error=msg)


def _fmt(r):
    rate = (f"{r['tflops']:7.1f} TFLOP/s" if r.get("tflops") else
            f"{r['tbps']:6.2f} TB/s" if r.get("tbps") else "")
    chk = ("" if r.get("rel_err") is None else
           f"err {r['rel_err']:.2e} <= {r['rel_err_bound']:.1e} {'ok' if r['ref_ok'] else 'FAIL'}")
    return (f"{r['workload']:8s} {'gqa-32-8':10s} f16   {r['system']:28s} "
            f"{r['time_us']:10.1f} us  {rate}  {chk}")


def run(ids, reps, log, no_flex=False, peers=True):
    """Rows and failures of the sparse workloads `ids` (default all)."""
    rows, fails = [], []
    for wid in ids or list(SW.WORKLOADS):
        w = SW.WORKLOADS[wid]
        try:
            fn = run_block if isinstance(w, SW.BlockWorkload) else run_select
            r, f = fn(w, reps, log, no_flex, peers)
        except Exception as e:  # noqa: BLE001  (recorded; the run goes on)
            r, f = [], [_fail(w, "flashkv", e, log)]
        rows += r
        fails += f
        torch.cuda.empty_cache()
    return rows, fails
