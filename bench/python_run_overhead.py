"""Host time of the Python wrappers' run() per call: decode, batch 64, GQA 32/8, head_dim 128,
page 16, 512 tokens per request (the GPU work is small, so the host path is what an engine pays
per layer on top of it). The median over many calls of the CPU time one run() call takes to
return (the kernel is queued, not waited for); the GPU is drained every 64 calls so the launch
queue never fills and blocks a call. Prints one JSON line; --json PATH writes it too.

  python bench/python_run_overhead.py [--json out.json] [--label NAME]
"""

import argparse
import json
import statistics
import time

import torch

import flashkv


def measure(fn, calls=4000, drain_every=64):
    times = []
    for i in range(calls):
        if i % drain_every == 0:
            torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    torch.cuda.synchronize()
    warm = times[len(times) // 10:]  # the first calls compile and warm caches
    return statistics.median(warm), min(warm)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--label", default="")
    args = p.parse_args()
    batch, hq, hk, d, ps, kv_len = 64, 32, 8, 128, 16, 512
    pages = kv_len // ps
    g = torch.Generator(device="cuda").manual_seed(0)
    num_pages = batch * pages
    kv = (torch.rand((num_pages, 2, ps, hk, d), generator=g, device="cuda") - 0.5).half()
    indptr = torch.arange(0, num_pages + 1, pages, dtype=torch.int32)
    indices = torch.randperm(num_pages, dtype=torch.int32).cuda()
    last = torch.full((batch,), ps, dtype=torch.int32)
    q = (torch.rand((batch, hq, d), generator=g, device="cuda") - 0.5).half()
    out = torch.empty_like(q)
    lse = torch.empty(batch, hq, device="cuda")
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(indptr, indices, last, hq, hk, d, ps, q_data_type=torch.float16)
    rows = {}
    rows["run_out_us"] = measure(lambda: w.run(q, kv, out=out))
    rows["run_lse_us"] = measure(lambda: w.run(q, kv, out=out, lse=lse))
    rows["run_alloc_us"] = measure(lambda: w.run(q, kv))
    rows["plan_us"] = measure(lambda: w.plan(indptr, indices, last, hq, hk, d, ps,
                                             q_data_type=torch.float16), calls=400)
    result = {"label": args.label, "batch": batch, "heads": f"{hq}/{hk}", "head_dim": d,
              "kv_len": kv_len, "torch": torch.__version__,
              **{k: {"median": round(v[0], 2), "min": round(v[1], 2)} for k, v in rows.items()}}
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
