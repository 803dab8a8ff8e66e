"""The torch peers of ../shared/bench/peers_torch.py, run in this process on the workloads flashkv
just ran (its functions, imported from the file --peers names, so method, data and counting are
that script's: bench/decode_peers.py and bench/prefill_peers.py do the same).

Peers: SDPA flash / cuDNN / memory-efficient on padded dense tensors, FA2 varlen on contiguous
ragged KV, FlexAttention (torch.compile'd, prefill only; --no-flex skips its minutes of
compiling). None reads a paged cache: they run on contiguous or padded KV, which favours them.
The script's data is fp16 with head_dim 128, so peers run for f16 only. Its timing flushes the L2
with a 1 GiB read before every rep (flashkv's rotates input copies instead); its reference check
reports rel_err without a bound (a peer with a wrong mask shows a large one, see its notes).
"""

import importlib.util
import time
import traceback

import torch

from . import report
from . import workloads as W

SDPA_BACKENDS = ("flash", "cudnn", "efficient")


def load(path):
    """peers_torch.py as a module."""
    spec = importlib.util.spec_from_file_location("peers_torch", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"--peers: cannot load {path}")
    pt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pt)
    return pt


def same_workloads(pt, wls):
    """The ids whose lengths differ between peers_torch.py's workloads() and ours (expected:
    none; the rows of such a workload would not compare)."""
    theirs = {name: lens for name, _kind, lens in pt.workloads()}
    return [w.id for w in wls if theirs.get(w.id) != w.kv_lens]


def run(pt, wls, shapes_of, no_flex, budget_s, log):
    """Rows and failures (schema keys) of every peer on workloads `wls`; shapes_of(kind) gives
    the shapes to run for a kind. Stops starting new runs after budget_s seconds."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    pt.BENCH = pt.Bench(torch)
    rows, failures = [], []
    deadline = time.time() + budget_s
    seed = 1000
    for w in wls:
        for shape in shapes_of(w.kind):
            hq, hkv = W.SHAPES[shape]
            seed += 1
            runs = [(f"torch_sdpa_{b}_padded", "sdpa", b) for b in SDPA_BACKENDS]
            runs.append(("torch_fa2_varlen", "varlen", None))
            if w.kind == "prefill" and not no_flex:
                runs.append(("torch_flex_attention", "flex", None))
            if time.time() > deadline:
                failures += [failure(w, shape, pt.SCHEMA_NAME.get(s, s),
                                     "skipped: --peers-budget-s exhausted") for s, _, _ in runs]
                continue
            q, k, v, cu_q, cu_k, sample = pt.make_data(torch, w.kind, w.kv_lens, hq, hkv, seed)
            ref = pt.reference(torch, w.kind, w.kv_lens, q, k, v, cu_q, cu_k, sample, hq, hkv)
            args = (w.kind, w.kv_lens, hq, hkv, q, k, v, cu_q, cu_k, sample, ref)
            nbytes, flops = pt.counts(w.kind, w.kv_lens, hq, hkv)
            for system, how, backend in runs:
                name = pt.SCHEMA_NAME.get(system, system)
                try:
                    if how == "sdpa":
                        r = pt.run_sdpa(torch, F, sdpa_kernel, backends[backend], backend, *args)
                    elif how == "varlen":
                        r = pt.run_varlen(torch, *args)
                    else:
                        r = pt.run_flex(torch, *args)
                except Exception as e:  # noqa: BLE001  (a peer that cannot run is a result)
                    msg = f"{type(e).__name__}: {str(e)[:300]}"
                    failures.append(failure(w, shape, name,
                                            msg + "\n" + traceback.format_exc()[-300:]))
                    log(f"{w.id:8s} {shape:10s} f16   {name:28s} FAILED: {msg[:160]}")
                    torch.cuda.empty_cache()
                    continue
                seconds = r["time_us"] * 1e-6
                row = dict(workload=w.id, kind=w.kind, shape=shape, dtype="f16", system=name,
                           time_us=r["time_us"], min_us=None, reps=r.get("reps"),
                           p10_us=r.get("p10_us"), p90_us=r.get("p90_us"),
                           tbps=nbytes / seconds / 1e12 if w.kind == "decode" else None,
                           tflops=flops / seconds / 1e12 if w.kind == "prefill" else None,
                           rel_err=r.get("rel_err"), batch=w.batch, sum_kv=sum(w.kv_lens),
                           notes=r.get("notes", ""))
                row["bytes" if w.kind == "decode" else "flops"] = (
                    nbytes if w.kind == "decode" else flops)
                rows.append(row)
                log(report.fmt_row(row))
                torch.cuda.empty_cache()
            del q, k, v, ref, args
            torch.cuda.empty_cache()
    return rows, failures


def failure(w, shape, system, error):
    """A failures entry (heads: the key peers_torch.py --summarize reads)."""
    return dict(workload=w.id, shape=shape, dtype="f16", system=system, heads=shape[:3].upper(),
                error=error)
