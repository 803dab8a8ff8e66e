"""Without a GPU: the same wrappers on host (NumPy) arrays, which run flashkv's CPU reference, at
the small sizes `flashkv bench` uses in that case (batch decode 4 x 256 and 4 x 1024, GQA 32/8;
a causal prefill/append/verification batch, qo 256/64/300/4 on kv 256/512/300/129). Times are
host wall-clock (median of `reps`), checked against a float32 NumPy reference as the GPU rows are
(so this mode exercises the whole benchmark, JSON and plots included, on any machine). No torch
needed."""

import math
import random
import time

import numpy as np

import flashkv

from . import report
from . import sparse_workloads as SW
from . import workloads as W

SYSTEM = "flashkv-cpu-reference"
HQ, HKV, D, PAGE = 32, 8, 128, 16
WORKLOADS = [W.Workload("D-cpu256", "decode", [256] * 4),
             W.Workload("D-cpu1k", "decode", [1024] * 4),
             W.Workload("P-cpu", "prefill", [256, 512, 300, 129], [256, 64, 300, 4])]


def reference(q, k, v, rows, qo_len):
    """float32 attention of query rows `rows` (q [n, hq, d]) over k/v [kv_len, hkv, d], causal
    aligned to the end of the KV."""
    q, k, v = (np.asarray(x, np.float32) for x in (q, k, v))
    kv_len, group = k.shape[0], q.shape[1] // k.shape[1]
    kk, vv = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("nhd,khd->nhk", q, kk) / np.float32(math.sqrt(q.shape[2]))
    visible = np.arange(kv_len)[None, :] <= (kv_len - qo_len + np.asarray(rows))[:, None]
    s = np.where(visible[:, None, :], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return np.einsum("nhk,khd->nhd", p / p.sum(axis=-1, keepdims=True), vv)


def rel(a, b):
    den = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / den if den > 0 else float(np.linalg.norm(a - b))


def run_config(w: W.Workload, reps, seed):
    rng = np.random.default_rng(seed)
    indptr, last = W.page_table(w.kv_lens, PAGE)
    pages = indptr[-1]
    indices = rng.permutation(pages).astype(np.int32)
    k = rng.uniform(-1, 1, (pages, PAGE, HKV, D)).astype(np.float16)
    v = rng.uniform(-1, 1, (pages, PAGE, HKV, D)).astype(np.float16)
    qo = w.qo()
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    q = rng.uniform(-1, 1, (int(qo_indptr[-1]), HQ, D)).astype(np.float16)
    ip, lp = np.array(indptr, np.int32), np.array(last, np.int32)
    ws = np.empty(1, np.uint8)  # a host workspace: the wrappers run the CPU reference
    if w.kind == "decode":
        wr = flashkv.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        wr.plan(ip, indices, lp, HQ, HKV, D, PAGE)
    else:
        wr = flashkv.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        wr.plan(qo_indptr, ip, indices, lp, HQ, HKV, D, PAGE, causal=True)
    out = np.full(q.shape, np.nan, np.float16)
    us = []
    for _ in range(reps):
        t0 = time.perf_counter()
        wr.run(q, (k, v), out=out)
        us.append((time.perf_counter() - t0) * 1e6)
    pick = random.Random(seed)
    got, ref = [], []
    for r in range(w.batch):  # every request; sampled rows as on the GPU
        rows = sorted({x for x in [0, 1, pick.randrange(qo[r]), pick.randrange(qo[r])]
                       + list(range(qo[r] - 4, qo[r])) if 0 <= x < qo[r]})
        ids = indices[indptr[r]: indptr[r + 1]]
        kr = k[ids].reshape(-1, HKV, D)[: w.kv_lens[r]]
        vr = v[ids].reshape(-1, HKV, D)[: w.kv_lens[r]]
        ref.append(reference(q[qo_indptr[r] + np.array(rows)], kr, vr, rows, qo[r]))
        got.append(out[qo_indptr[r] + np.array(rows)].astype(np.float32))
    got, ref = np.concatenate(got), np.concatenate(ref)
    err = rel(got, ref) if np.isfinite(got).all() else math.nan
    bound = W.error_bound(rel(ref.astype(np.float16).astype(np.float32), ref), "f16")
    t = sorted(us)[len(us) // 2]
    row = dict(workload=w.id, kind=w.kind, shape="gqa-32-8", dtype="f16", system=SYSTEM,
               api="python", time_us=t, min_us=min(us), reps=reps, tbps=None, tflops=None,
               rel_err=err, rel_err_bound=bound, ref_ok=bool(err <= bound),
               ref_rows_checked=int(got.shape[0]), batch=w.batch, sum_kv=sum(w.kv_lens),
               sum_qo=sum(qo), notes="host wall-clock of the CPU reference (double accumulation)")
    if w.kind == "decode":
        row["bytes"] = W.decode_bytes(w, HQ, HKV, D, "f16")
        row["tbps"] = row["bytes"] / (t * 1e-6) / 1e12
    else:
        row["flops"] = W.prefill_flops(w, HQ, D)
        row["tflops"] = row["flops"] / (t * 1e-6) / 1e12
    return row


def run_sparse(reps, seed):
    """B-cpu: B1's construction at 1024 x 1024 in blocks of 64 (density 30 %), causal, through
    BlockSparseAttentionWrapper on host arrays, checked on every row against float32 NumPy
    attention under the dense mask."""
    w = SW.BlockWorkload("B-cpu", 1024, 64, 0.30, 2, 7)
    indptr, indices = SW.bsr_pattern(w)
    rng = np.random.default_rng(seed)
    n, mb = w.n, w.blocks_per_side
    q = rng.uniform(-1, 1, (n, HQ, D)).astype(np.float16)
    k = rng.uniform(-1, 1, (n, HKV, D)).astype(np.float16)
    v = rng.uniform(-1, 1, (n, HKV, D)).astype(np.float16)
    wr = flashkv.BlockSparseAttentionWrapper(np.empty(1, np.uint8))
    wr.plan(np.array(indptr, np.int32), np.array(indices, np.int32), n, n, w.block, w.block, HQ,
            HKV, D, causal=True)
    out = np.full(q.shape, np.nan, np.float16)
    us = []
    for _ in range(reps):
        t0 = time.perf_counter()
        wr.run(q, k, v, out=out)
        us.append((time.perf_counter() - t0) * 1e6)
    blocks = np.zeros((mb, mb), bool)
    for i in range(mb):
        blocks[i, indices[indptr[i]:indptr[i + 1]]] = True
    keys = np.arange(n)
    vis = blocks[keys[:, None] // w.block, keys[None, :] // w.block] & (keys[None, :] <= keys[:, None])
    kk, vv = (np.repeat(x.astype(np.float32), HQ // HKV, axis=1) for x in (k, v))
    s = np.einsum("nhd,khd->nhk", q.astype(np.float32), kk) / np.float32(math.sqrt(D))
    s = np.where(vis[:, None, :], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    ref = np.einsum("nhk,khd->nhd", p / p.sum(axis=-1, keepdims=True), vv)
    got = out.astype(np.float32)
    err = rel(got, ref) if np.isfinite(got).all() else math.nan
    bound = W.error_bound(rel(ref.astype(np.float16).astype(np.float32), ref), "f16")
    t = sorted(us)[len(us) // 2]
    flops = 4.0 * D * HQ * SW.causal_pairs(w, indptr, indices)
    return dict(workload=w.id, kind="sparse", shape="gqa-32-8", dtype="f16", system=SYSTEM,
                api="python", time_us=t, min_us=min(us), reps=reps, tbps=None,
                tflops=flops / (t * 1e-6) / 1e12, flops=flops, rel_err=err,
                rel_err_bound=bound, ref_ok=bool(err <= bound), ref_rows_checked=n,
                blocks=len(indices), notes="host wall-clock of the CPU reference")


def run(kinds, reps, log):
    rows = []
    for seed, w in enumerate(WORKLOADS, start=1):
        if w.kind in kinds:
            rows.append(run_config(w, reps, seed))
            log(report.fmt_row(rows[-1]))
    if "sparse" in kinds:
        rows.append(run_sparse(reps, len(WORKLOADS) + 1))
        log(report.fmt_row(rows[-1]))
    return rows
