"""Runs the selected peers on workloads and turns their timings into result rows.

Order (fixed, so a run's power and clock history is the same every time): workload by workload,
each head shape, the peers in registry order; the inputs are drawn once per (workload, shape)
with seed 1000 + 100 * shape index + workload index and shared by the peers. A peer that raises
is a recorded failure, not the end of the run; past the time budget nothing new starts and what
is left is recorded as skipped.
"""

import time
import traceback

from .. import report
from .. import workloads as W
from . import batch as batches
from . import flashinfer_paged, torch_flex, torch_sdpa, torch_varlen

ALL_WORKLOADS = W.standard_workloads() + W.append_workloads()
WORKLOAD_INDEX = {w.id: i for i, w in enumerate(ALL_WORKLOADS)}
SHAPE_INDEX = {s: i for i, s in enumerate(W.SHAPES)}


def seed_of(workload_id, shape):
    return 1000 + 100 * SHAPE_INDEX[shape] + WORKLOAD_INDEX[workload_id]


def time_peer(torch, peer, b, timer, seed, kv_dtype):
    """The peer's timing dict on batch b (time_us, p10_us, p90_us, reps, rel_err, notes, ...)."""
    if peer.how == "sdpa":
        if b.kind == "decode" or b.square:
            return torch_sdpa.padded(torch, b, peer.variant, timer)
        return torch_sdpa.end_aligned(torch, b, peer.variant, timer)
    if peer.how == "sdpa-lower-right":
        return torch_sdpa.end_aligned(torch, b, None, timer)
    if peer.how == "varlen":
        return torch_varlen.run(torch, b, timer)
    if peer.how == "flex":
        return torch_flex.run(torch, b, timer)
    if peer.how == "flashinfer":
        return flashinfer_paged.run(torch, b, timer, peer.variant, seed, kv_dtype)
    raise AssertionError(f"peer {peer.name}: no runner for {peer.how!r}")


def make_row(w, shape, system, timing, kv_dtype=None, peer_name=None):
    """A result row in the schema of docs/benchmarks.md from one peer's timing: decode rows carry
    bytes and TB/s, prefill rows FLOPs and TFLOP/s, both on real tokens only (f16 queries and
    outputs, head_dim 128; the cache in kv_dtype, default f16)."""
    hq, hkv = W.SHAPES[shape]
    seconds = timing["time_us"] * 1e-6
    decode = w.kind == "decode"
    row = dict(workload=w.id, kind=w.kind, shape=shape, dtype="f16", system=system,
               time_us=timing["time_us"], min_us=None, reps=timing.get("reps"),
               p10_us=timing.get("p10_us"), p90_us=timing.get("p90_us"), tbps=None, tflops=None,
               rel_err=timing.get("rel_err"), batch=w.batch, sum_kv=sum(w.kv_lens),
               sum_qo=sum(w.qo()), notes=timing.get("notes", ""))
    if kv_dtype:
        row["kv_dtype"] = kv_dtype
    if peer_name:
        row["peer"] = peer_name
    for key in ("nonfinite_outputs", "plan", "flashinfer"):
        if key in timing:
            row[key] = timing[key]
    if decode:
        row["bytes"] = W.decode_bytes(w, hq, hkv, batches.HEAD_DIM, "f16", kv_dtype)
        row["tbps"] = row["bytes"] / seconds / 1e12
    else:
        row["flops"] = W.prefill_flops(w, hq, batches.HEAD_DIM)
        row["tflops"] = row["flops"] / seconds / 1e12
    return row


def failure(w, shape, system, error, kv_dtype=None):
    """A failures entry (heads: the key older summaries read)."""
    f = dict(workload=w.id, shape=shape, dtype="f16", system=system, heads=shape[:3].upper(),
             error=error)
    if kv_dtype:
        f["kv_dtype"] = kv_dtype
    return f


def run(torch, peers, workloads, shapes_of, timer, budget_s, log, kv_dtype=None, saved=None):
    """(rows, failures) of `peers` on `workloads`; shapes_of(kind) lists the head shapes of a
    kind. kv_dtype "e4m3": an fp8 cache for the FlashInfer peers (the torch peers read f16 only
    and are skipped). saved(rows, failures) is called after every row (to write partial results)."""
    rows, failures = [], []
    deadline = time.time() + budget_s
    if kv_dtype:
        skipped = [p.name for p in peers if p.group != "flashinfer"]
        if skipped:
            log(f"peers: {', '.join(skipped)} read f16 caches only; skipped with --kv-dtype")
        peers = [p for p in peers if p.group == "flashinfer"]
    for w in workloads:
        for shape in shapes_of(w.kind):
            here = [p for p in peers if p.runs_on(w)]
            if not here:
                continue
            if time.time() > deadline:
                failures += [failure(w, shape, p.system(w, kv_dtype),
                                     "skipped: time budget of this run exhausted", kv_dtype)
                             for p in here]
                continue
            hq, hkv = W.SHAPES[shape]
            seed = seed_of(w.id, shape)
            kv_round = torch.float8_e4m3fn if kv_dtype == "e4m3" else None
            b = batches.make(torch, w, hq, hkv, seed, kv_round)
            for peer in here:
                system = peer.system(w, kv_dtype)
                try:
                    timing = time_peer(torch, peer, b, timer, seed, kv_dtype)
                except Exception as e:  # noqa: BLE001  (a peer that cannot run is a result)
                    msg = f"{type(e).__name__}: {str(e)[:400]}"
                    failures.append(failure(w, shape, system,
                                            msg + "\n" + traceback.format_exc()[-600:], kv_dtype))
                    log(f"{w.id:8s} {shape:10s} f16   {system:28s} FAILED: {msg[:200]}")
                    torch.cuda.synchronize()
                else:
                    rows.append(make_row(w, shape, system, timing, kv_dtype, peer.name))
                    log(report.fmt_row(rows[-1]))
                if saved:
                    saved(rows, failures)
                torch.cuda.empty_cache()
            del b
            torch.cuda.empty_cache()
    return rows, failures

