"""End-to-end serving benchmark: transformers' continuous batching with each attention
implementation, the paper's experiment (TTFT / ITL under Poisson arrivals) on one GPU.

    python -m flashkv.bench.serve --workloads variable sharegpt --json serve.json --md serve.md

Model: Llama-3.1-8B's architecture (32 layers, 32 / 8 heads, d128, hidden 4096, MLP 14336, vocab
128256), bf16, random weights (none can be downloaded on our machines). Requests arrive as a
Poisson process (seeded: every implementation sees the same requests at the same times) at each
``--rates`` value (req/s; ``inf``: all at once, the saturated case). Outputs have fixed
per-request lengths: random weights never emit EOS, so EOS is off.

Workloads: ``variable`` (prompts uniform in 512-2048 tokens, the paper's; ``--variable-output``
new tokens each) and ``sharegpt`` (prompt and output lengths drawn from
``sharegpt_lengths.json``; see its ``source``; outputs capped at ``--max-output``).

Implementations (``--impls``): ``paged|fkv`` (flashkv), ``paged|fkv-fp8`` (flashkv over an e4m3
cache), the engine's ``paged|sdpa`` and ``paged|eager``, ``paged|fi`` (FlashInfer through the
same adapter), and ``paged|flash_attention_2`` / ``_3`` where the flash-attn package exists. One
that cannot run is recorded with its error, never skipped silently.

Per implementation and rate: TTFT and ITL median / p99 (ms), output tokens/s, the adapter's host
time (plan per step, per reused-plan layer call) and, from one profiled run at the highest rate,
the share of GPU kernel time in attention kernels and in KV-cache reads / writes.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import sys
import threading
import time
from pathlib import Path

LLAMA31_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                  num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=128, max_position_embeddings=131072, rope_theta=500000.0,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192})
IMPLS = ("paged|fkv", "paged|fkv-fp8", "paged|sdpa", "paged|eager", "paged|fi",
         "paged|flash_attention_2")
LENGTHS_FILE = Path(__file__).with_name("sharegpt_lengths.json")
# Kernel names by category (torch.profiler device events): attention kernels of every
# implementation, and the KV-cache reads / writes around them (the engine's gather and write,
# flashkv's and FlashInfer's append).
ATTENTION_KERNELS = re.compile(
    r"batch_(prefill|decode)|BatchPrefill|BatchDecode|PrefillWith|flash|fmha|attention|"
    r"cudnn|merge_state|softmax", re.I)
KV_KERNELS = re.compile(r"index_copy|index_select|indexSelect|masked_scatter|append|"
                        r"AppendPaged|scatter_gather|indexFunc", re.I)


def percentile(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def make_requests(workload, n, rate, seed, vocab, *, variable_output, max_output):
    """[(arrival_s, prompt_ids, output_len)], the same for every implementation."""
    import random

    rng = random.Random(seed)
    if workload == "variable":
        lens = [(rng.randint(512, 2048), variable_output) for _ in range(n)]
    elif workload == "sharegpt":
        table = json.loads(LENGTHS_FILE.read_text())
        pairs = table["pairs"]
        lens = [tuple(pairs[rng.randrange(len(pairs))]) for _ in range(n)]
        lens = [(max(p, 4), max(1, min(o, max_output))) for p, o in lens]
    else:
        raise ValueError(f"workload: expected 'variable' or 'sharegpt', got {workload!r}")
    t, reqs = 0.0, []
    for p, o in lens:
        if rate != math.inf:
            t += rng.expovariate(rate)
        reqs.append((t, [rng.randrange(1, vocab) for _ in range(p)], o))
    return reqs


def run_requests(manager, reqs, timeout_s):
    """Submit on schedule, wait for every result; per-request (arrival, timestamps, n_out)."""
    results, done = {}, threading.Event()

    def collect():
        while len(results) < len(reqs):
            r = manager.get_result(timeout=0.5)
            if r is None:
                if not manager.is_running():
                    break
                continue
            if r.is_finished():
                results[r.request_id] = r
        done.set()

    th = threading.Thread(target=collect, daemon=True)
    th.start()
    t0 = time.perf_counter()
    arrivals = {}
    for i, (t, prompt, n_out) in enumerate(reqs):
        delay = t0 + t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        rid = f"r{i}"
        arrivals[rid] = time.perf_counter()
        manager.add_request(prompt, request_id=rid, max_new_tokens=n_out, record_timestamps=True)
    done.wait(timeout=timeout_s)
    return t0, arrivals, results


def summarize(t0, arrivals, results, expected):
    ttft, itl, n_tok, last = [], [], 0, t0
    for rid, r in results.items():
        ts = r.timestamps or []
        if not ts:
            continue
        ttft.append(ts[0] - arrivals[rid])
        itl.extend(b - a for a, b in zip(ts, ts[1:]))
        n_tok += len(r.generated_tokens)
        last = max(last, ts[-1])
    wall = last - t0
    return dict(completed=len(results), requests=expected,
                ttft_p50_ms=1e3 * percentile(ttft, 50), ttft_p99_ms=1e3 * percentile(ttft, 99),
                itl_p50_ms=1e3 * percentile(itl, 50), itl_p99_ms=1e3 * percentile(itl, 99),
                output_tok_per_s=n_tok / wall if wall > 0 else float("nan"),
                output_tokens=n_tok, wall_s=wall)


def kernel_shares(prof):
    """(attention share, KV-cache share, total kernel ms) of a torch.profiler run."""
    import torch

    tot = att = kv = 0.0
    for e in prof.key_averages():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        t = e.self_device_time_total
        tot += t
        if ATTENTION_KERNELS.search(e.key):
            att += t
        elif KV_KERNELS.search(e.key):
            kv += t
    return (att / tot if tot else float("nan"), kv / tot if tot else float("nan"), tot / 1e3)


def build_model(device):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(**LLAMA31_8B)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16,
                                                 attn_implementation="paged|sdpa")
    return model.eval()


def impl_setup(impl, adapters):
    """The registered name to load for ``impl`` and its adapter state (None for the engine's
    own implementations)."""
    if impl == "paged|fkv":
        return "paged|fkv", adapters.setdefault("fkv", _register("fkv"))
    if impl == "paged|fkv-fp8":
        return "paged|fkv8", adapters.setdefault("fkv8", _register("fkv8",
                                                                   kv_cache_dtype="e4m3"))
    if impl == "paged|fi":
        return "paged|fi", adapters.setdefault("fi", _register("fi", backend="flashinfer"))
    return impl, None


def _register(name, **kw):
    import flashkv.integrations.transformers as fkv_tf

    return fkv_tf.register(name, **kw)


def bench_impl(model, impl, workloads, rates, args, adapters, emit):
    import torch
    from transformers import ContinuousBatchingConfig, GenerationConfig

    try:
        name, adapter = impl_setup(impl, adapters)
        model.set_attn_implementation(name)
    except Exception as e:  # noqa: BLE001 (recorded, the run goes on)
        for w in workloads:
            for rate in rates:
                emit(dict(impl=impl, workload=w, rate=rate, error=f"{type(e).__name__}: {e}"))
        return
    gcfg = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0, max_new_tokens=16)
    cb = ContinuousBatchingConfig(use_cuda_graph=False, max_memory_percent=args.memory_percent)
    manager = None
    try:
        manager = model.init_continuous_batching(gcfg, cb)
        manager.start()
        # Warm-up: compiles (NVRTC / FlashInfer JIT), caches, every path (prefill, chunked
        # prefill beside decode, decode): a small Poisson burst of the first workload.
        warm = make_requests(workloads[0], args.warmup_requests, 8.0, 999, LLAMA31_8B["vocab_size"],
                             variable_output=8, max_output=8)
        run_requests(manager, warm, args.timeout_s)
        for w in workloads:
            for rate in rates:
                reqs = make_requests(w, args.requests, rate, args.seed, LLAMA31_8B["vocab_size"],
                                     variable_output=args.variable_output,
                                     max_output=args.max_output)
                if adapter is not None:
                    adapter.stats.reset()
                torch.cuda.synchronize()
                t0, arr, res = run_requests(manager, reqs, args.timeout_s)
                row = dict(impl=impl, workload=w, rate=rate, **summarize(t0, arr, res, len(reqs)))
                if adapter is not None:
                    st = adapter.stats
                    row.update(adapter_plans=st.plans, adapter_calls=st.calls,
                               adapter_plan_us_per_step=1e6 * st.plan_s / max(st.plans, 1),
                               adapter_call_us_per_layer=st.per_call_us(),
                               adapter_paths=dict(st.paths),
                               # per path: host µs per reused-plan call and per plan
                               adapter_us_by_path={
                                   p: dict(call=round(st.per_call_us(p), 1),
                                           plan=round(st.plan_us(p), 1))
                                   for p in sorted(st.paths)})
                emit(row)
        if args.profile:
            w = workloads[0]
            reqs = make_requests(w, args.profile_requests, math.inf, args.seed + 1,
                                 LLAMA31_8B["vocab_size"], variable_output=args.variable_output,
                                 max_output=args.max_output)
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                run_requests(manager, reqs, args.timeout_s)
                torch.cuda.synchronize()
            att, kv, ms = kernel_shares(prof)
            emit(dict(impl=impl, workload=w, rate="profile", attention_share=att,
                      kv_cache_share=kv, kernel_ms=ms))
    except Exception as e:  # noqa: BLE001
        emit(dict(impl=impl, workload=workloads[0], rate=None,
                  error=f"{type(e).__name__}: {str(e)[:400]}"))
    finally:
        if manager is not None:
            try:
                manager.stop(block=True, timeout=60)
            except Exception:  # noqa: BLE001
                pass
        del manager
        gc.collect()
        torch.cuda.empty_cache()


def markdown(rows):
    lines = ["| workload | rate (req/s) | impl | TTFT p50 / p99 ms | ITL p50 / p99 ms | "
             "out tok/s | done | host plan µs/step, call µs/layer |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("rate") == "profile" or "error" in r:
            continue
        host = ("" if "adapter_plans" not in r else
                f"{r['adapter_plan_us_per_step']:.0f}, {r['adapter_call_us_per_layer']:.0f}")
        lines.append(f"| {r['workload']} | {r['rate']} | {r['impl']} | {r['ttft_p50_ms']:.0f} / "
                     f"{r['ttft_p99_ms']:.0f} | {r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f} | "
                     f"{r['output_tok_per_s']:.0f} | {r['completed']}/{r['requests']} | {host} |")
    prof = [r for r in rows if r.get("rate") == "profile"]
    if prof:
        lines += ["", "| impl | attention share of GPU kernel time | KV-cache reads/writes | "
                  "kernel ms |", "|---|---|---|---|"]
        lines += [f"| {r['impl']} | {100 * r['attention_share']:.1f} % | "
                  f"{100 * r['kv_cache_share']:.1f} % | {r['kernel_ms']:.0f} |" for r in prof]
    errs = [r for r in rows if "error" in r]
    if errs:
        lines += ["", "Did not run:"] + [f"- {r['impl']} ({r['workload']}, rate {r['rate']}): "
                                         f"{r['error']}" for r in errs]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impls", nargs="*", default=list(IMPLS))
    ap.add_argument("--workloads", nargs="*", default=["variable", "sharegpt"],
                    choices=["variable", "sharegpt"])
    ap.add_argument("--rates", nargs="*", default=["2", "6", "inf"])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--variable-output", type=int, default=64)
    ap.add_argument("--max-output", type=int, default=256)
    ap.add_argument("--warmup-requests", type=int, default=6)
    ap.add_argument("--profile", action="store_true", help="one profiled saturated run per impl")
    ap.add_argument("--profile-requests", type=int, default=8)
    ap.add_argument("--memory-percent", type=float, default=0.8)
    ap.add_argument("--timeout-s", type=float, default=180.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    args = ap.parse_args(argv)
    rates = [math.inf if r == "inf" else float(r) for r in args.rates]
    if any(r <= 0 for r in rates):
        ap.error("--rates: expected positive numbers or 'inf'")
    bad = sorted(set(args.impls) - set(IMPLS) - {"paged|flash_attention_3"})
    if bad:
        ap.error(f"--impls: unknown {bad}; expected some of {list(IMPLS)}")
    import torch

    if not torch.cuda.is_available():
        print("flashkv.bench.serve: needs a CUDA GPU (an 8B model with the engine's paged cache); "
              "on a machine without one, run the CPU tests "
              "(python/tests/test_transformers_integration.py)")
        return 2
    import transformers

    rows = []
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                transformers=transformers.__version__, commit=os.environ.get("FLASHKV_COMMIT"),
                args=vars(args))
    print(json.dumps(meta), flush=True)

    def emit(row):
        row = {k: (str(v) if isinstance(v, float) and math.isinf(v) else v)
               for k, v in row.items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:  # rewritten after every row: a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))

    model = build_model("cuda")
    adapters = {}
    for impl in args.impls:
        t = time.time()
        bench_impl(model, impl, args.workloads, rates, args, adapters, emit)
        print(f"== {impl}: {time.time() - t:.0f} s", flush=True)
    md = markdown(rows)
    print(md)
    if args.md:
        Path(args.md).write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
