#!/usr/bin/env python3
"""The prefill half of ../shared/bench/peers_torch.py: ceilings + P1-P5 peers, then A1 and S1.

P1-P5 run that script's own functions (imported, so method, data, seeds and counting are
identical to its main run): SDPA flash / cuDNN / memory-efficient on padded dense batches and FA2
varlen, then FlexAttention (torch.compile'd; --no-flex skips it, it costs minutes of compiling).

A1 (16 requests, 512 new queries on 4096 cached keys: qo_len 512, kv_len 4608) and S1 (64
requests, qo_len 4, kv_len 4096) are flashkv's append and speculative-verification workloads. Their
causal mask is aligned to the END of the KV (query i sees keys <= kv_len - qo_len + i), which that
script's make_data / reference / run_varlen cannot express (they assume qo_len == kv_len), so the
few functions below do it, with its Bench (timing, L2 flush), gather_rows and rel_err:
  * FA2 varlen: aten._flash_attention_forward with causal=True (FA2 >= 2.1 aligns it bottom-right);
  * SDPA on dense [B, H, L, d] views (every request has the same lengths, so nothing is padded):
    flash / cuDNN / efficient one at a time with the mask as a boolean tensor (flash takes no
    mask, so it fails: recorded), and torch.nn.attention.bias.causal_lower_right, which dispatches
    to flash or efficient itself (so it gets no backend name).
The fp32 reference checks 48 sampled rows per request (fewer when qo_len < 48), so a peer that
aligned the mask to the start of the KV shows up as a large rel_err, not as a fast time.
  python3 bench/prefill_peers.py --peers PATH/peers_torch.py --out peers-prefill.json
"""
import argparse
import importlib.util
import json
import math
import random
import time
import traceback
import warnings

APPEND = [("A1", [512] * 16, [4096 + 512] * 16), ("S1", [4] * 64, [4096] * 64)]  # (id, qo, kv)


def append_counts(d, qo, kv, hq, hkv):
    """bytes = q + o + K,V (real tokens); flops = 4*d*Hq*unmasked pairs (end-aligned causal)."""
    pairs = sum(max(0, min(k, k - q + i + 1)) for q, k in zip(qo, kv) for i in range(q))
    return 2 * sum(qo) * hq * d * 2 + sum(kv) * hkv * d * 2 * 2, 4.0 * d * hq * pairs


def append_data(torch, d, qo, kv, hq, hkv, seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    q = torch.randn(sum(qo), hq, d, device="cuda", dtype=torch.float16, generator=g)
    k = torch.randn(sum(kv), hkv, d, device="cuda", dtype=torch.float16, generator=g)
    v = torch.randn(sum(kv), hkv, d, device="cuda", dtype=torch.float16, generator=g)
    cu_q, cu_k = [0], [0]
    for a, b in zip(qo, kv):
        cu_q.append(cu_q[-1] + a)
        cu_k.append(cu_k[-1] + b)
    rs = random.Random(seed)
    rows = [[0, n - 1] + [rs.randint(0, n - 1) for _ in range(min(n, 48) - 2)] for n in qo]
    return q, k, v, cu_q, cu_k, rows


def append_reference(torch, d, qo, kv, q, k, v, cu_q, cu_k, rows, hq, hkv):
    """fp32 math attention on the sampled rows, causal mask aligned to the end of the KV."""
    grp = hq // hkv
    outs = []
    for b, (lq, lk) in enumerate(zip(qo, kv)):
        r = torch.tensor(rows[b], device="cuda")
        qb = q[cu_q[b] + r].float()
        kb = k[cu_k[b]:cu_k[b + 1]].float().repeat_interleave(grp, dim=1)
        vb = v[cu_k[b]:cu_k[b + 1]].float().repeat_interleave(grp, dim=1)
        s = torch.einsum("nhd,lhd->hnl", qb, kb) / math.sqrt(d)
        mask = torch.arange(lk, device="cuda")[None, :] > (lk - lq + r)[:, None]
        p = torch.softmax(s.masked_fill(mask[None], float("-inf")), dim=-1)
        outs.append(torch.einsum("hnl,lhd->nhd", p, vb))
    return torch.cat(outs, 0)


def append_varlen(torch, pt, qo, kv, hq, hkv, q, k, v, cu_q, cu_k, rows, ref):
    cq = torch.tensor(cu_q, dtype=torch.int32, device="cuda")
    ck = torch.tensor(cu_k, dtype=torch.int32, device="cuda")
    op = torch.ops.aten._flash_attention_forward
    scale = 1.0 / math.sqrt(pt.HEAD_DIM)

    def fn():
        return op(q, k, v, cq, ck, max(qo), max(kv), 0.0, True, False, scale=scale)

    err = pt.rel_err(torch, pt.gather_rows(torch, fn()[0], cu_q, rows), ref)
    med, p10, p90, reps = pt.BENCH.auto(fn)
    return dict(time_us=med, p10_us=p10, p90_us=p90, reps=reps, rel_err=err,
                notes="aten._flash_attention_forward varlen (cu_seqlens), causal=True, packed "
                      "contiguous NHD q/k/v" + (", native GQA" if hkv != hq else ""))


def append_sdpa(torch, pt, F, sdpa_kernel, backend, qo, kv, hq, hkv, q, k, v, cu_q, cu_k, rows, ref):
    """backend None: the causal_lower_right bias, which picks flash or efficient itself; else that
    one backend with the end-aligned mask as a boolean tensor."""
    from torch.nn.attention.bias import causal_lower_right
    d, B, lq, lk = pt.HEAD_DIM, len(qo), qo[0], kv[0]
    assert all(x == lq for x in qo) and all(x == lk for x in kv), "dense views need equal lengths"
    qt = q.view(B, lq, hq, d).transpose(1, 2)  # [B, H, L, d] views of the packed NHD tensors
    kt0, vt0 = k.view(B, lk, hkv, d).transpose(1, 2), v.view(B, lk, hkv, d).transpose(1, 2)
    if backend is None:
        mname, mask = "causal_lower_right", causal_lower_right(lq, lk)
    else:
        mname, mask = "bool", torch.ones(lq, lk, dtype=torch.bool, device="cuda").tril(diagonal=lk - lq)
    gqa_modes = [("enable_gqa", True), ("kv_repeated", False)] if hkv != hq else [("mha", False)]
    errors = []
    for gname, gflag in gqa_modes:
        try:
            kt = kt0 if gname != "kv_repeated" else kt0.repeat_interleave(hq // hkv, dim=1)
            vt = vt0 if gname != "kv_repeated" else vt0.repeat_interleave(hq // hkv, dim=1)
            kw = dict(attn_mask=mask, enable_gqa=True) if gflag else dict(attn_mask=mask)

            def fn():
                if backend is None:
                    return F.scaled_dot_product_attention(qt, kt, vt, **kw)
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(qt, kt, vt, **kw)

            out = fn()
            torch.cuda.synchronize()
            o_packed = out.transpose(1, 2).reshape(B * lq, hq, d)
            err = pt.rel_err(torch, pt.gather_rows(torch, o_packed, cu_q, rows), ref)
            del out, o_packed
            med, p10, p90, reps = pt.BENCH.auto(fn)
            notes = [f"dense [B,H,L,d] views (equal lengths, no padding), mask {mname}", f"gqa: {gname}"]
            if gname == "kv_repeated":
                notes.append("KV heads materialised x%d before timing" % (hq // hkv))
            if errors:
                notes.append("earlier attempts failed: " + " | ".join(errors)[:400])
            return dict(time_us=med, p10_us=p10, p90_us=p90, reps=reps, rel_err=err, notes="; ".join(notes))
        except Exception as e:  # noqa: BLE001
            errors.append(f"{gname}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
            torch.cuda.synchronize()
    raise RuntimeError(" || ".join(errors)[:1500])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", required=True, help="path to shared/bench/peers_torch.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--heads", default="all", choices=["all", "gqa", "mha"])
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (torch.compile)")
    ap.add_argument("--no-append", action="store_true", help="skip A1 and S1")
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip what would start later")
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("peers_torch", args.peers)
    pt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pt)

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    warnings.filterwarnings("ignore")
    t0 = time.time()
    bench = pt.Bench(torch)
    pt.BENCH = bench
    result = dict(source="bench/prefill_peers.py (functions of shared/bench/peers_torch.py)",
                  env=dict(torch=torch.__version__, cuda=torch.version.cuda,
                           cudnn=torch.backends.cudnn.version(), device=torch.cuda.get_device_name(0)),
                  results=[], failures=[])

    def save():
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    def record(wl, hname, system, lens, nbytes, flops, r):
        row = dict(workload=wl, kind="prefill", heads=hname, system=system, batch=len(lens),
                   sum_len=sum(lens), bytes=nbytes, flops=flops, **r)
        row["TBps"] = nbytes / (r["time_us"] * 1e-6) / 1e12
        row["TFLOPs"] = flops / (r["time_us"] * 1e-6) / 1e12
        result["results"].append(row)
        print(f"{wl} {hname} {system:28s} {r['time_us']:10.1f} us {row['TFLOPs']:7.1f} TFLOP/s "
              f"err {r['rel_err']:.2e}", flush=True)
        save()

    def fail(wl, hname, system, msg):
        result["failures"].append(dict(workload=wl, heads=hname, system=system, error=msg[:600]))
        print(f"{wl} {hname} {system} FAILED: {msg[:200]}", flush=True)
        save()

    result["ceilings"] = pt.ceilings(torch, bench)
    print("ceilings:", json.dumps(result["ceilings"]), flush=True)
    save()
    deadline = t0 + args.budget_s
    heads = [h for h in pt.HEADS if args.heads in ("all", h[0].lower())]
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    # P1-P5: the phases and seeds of peers_torch.py's main run (every workload advances the seed).
    phases = [("dense", h) for h in heads] + ([("flex", h) for h in heads] if not args.no_flex else [])
    seed = 1000
    for phase, (hname, hq, hkv) in phases:
        for wl, kind, lens in pt.workloads():
            seed += 1
            if kind != "prefill":
                continue
            if time.time() > deadline:
                fail(wl, hname, phase, "skipped: time budget of this run exhausted")
                continue
            q, k, v, cu_q, cu_k, rows = pt.make_data(torch, kind, lens, hq, hkv, seed)
            ref = pt.reference(torch, kind, lens, q, k, v, cu_q, cu_k, rows, hq, hkv)
            a = (kind, lens, hq, hkv, q, k, v, cu_q, cu_k, rows, ref)
            if phase == "dense":
                runs = [(f"torch_sdpa_{b}_padded",
                         lambda b=b, be=be: pt.run_sdpa(torch, F, sdpa_kernel, be, b, *a)) for b, be in backends]
                runs.append(("torch_fa2_varlen", lambda: pt.run_varlen(torch, *a)))
            else:
                runs = [("torch_flex_attention", lambda: pt.run_flex(torch, *a))]
            for system, fn in runs:
                try:
                    nbytes, flops = pt.counts(kind, lens, hq, hkv)
                    record(wl, hname, system, lens, nbytes, flops, fn())
                except Exception as e:  # noqa: BLE001
                    fail(wl, hname, system, f"{type(e).__name__}: {str(e)[:300]}\n" + traceback.format_exc()[-300:])
                torch.cuda.empty_cache()
            del q, k, v, ref, a
            torch.cuda.empty_cache()
    # A1, S1: end-aligned causal masks (qo_len < kv_len).
    seed = 5000
    for hname, hq, hkv in ([] if args.no_append else heads):
        for wl, qo, kv in APPEND:
            seed += 1
            if time.time() > deadline:
                fail(wl, hname, "append", "skipped: time budget of this run exhausted")
                continue
            q, k, v, cu_q, cu_k, rows = append_data(torch, pt.HEAD_DIM, qo, kv, hq, hkv, seed)
            ref = append_reference(torch, pt.HEAD_DIM, qo, kv, q, k, v, cu_q, cu_k, rows, hq, hkv)
            a = (qo, kv, hq, hkv, q, k, v, cu_q, cu_k, rows, ref)
            runs = [(f"torch_sdpa_{b}_boolmask", lambda be=be: append_sdpa(torch, pt, F, sdpa_kernel, be, *a))
                    for b, be in backends]
            runs.append(("torch_sdpa_lower_right", lambda: append_sdpa(torch, pt, F, sdpa_kernel, None, *a)))
            runs.append(("torch_fa2_varlen", lambda: append_varlen(torch, pt, *a)))
            nbytes, flops = append_counts(pt.HEAD_DIM, qo, kv, hq, hkv)
            for system, fn in runs:
                try:
                    record(wl, hname, system, kv, nbytes, flops, fn())
                except Exception as e:  # noqa: BLE001
                    fail(wl, hname, system, f"{type(e).__name__}: {str(e)[:300]}")
                torch.cuda.empty_cache()
            del q, k, v, ref, a
            torch.cuda.empty_cache()
    result["elapsed_s"] = time.time() - t0
    save()
    print(f"done in {result['elapsed_s']:.1f}s -> {args.out}")


if __name__ == "__main__":
    main()
