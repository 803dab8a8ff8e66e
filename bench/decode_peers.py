#!/usr/bin/env python3
"""The decode half of ../shared/bench/peers_torch.py: ceilings + D1-D6 peers only.

The shared script also times every prefill workload, which costs minutes of GPU time that the
decode issue does not need. This runs the same functions (imported from that script, so the
method and counting are identical) on the decode workloads alone and writes the same JSON.
  python3 bench/decode_peers.py --peers PATH/peers_torch.py --out peers-decode.json
"""
import argparse
import importlib.util
import json
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", required=True, help="path to shared/bench/peers_torch.py")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("peers_torch", args.peers)
    pt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pt)

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.backends.cuda.matmul.allow_tf32 = False
    bench = pt.Bench(torch)
    pt.BENCH = bench
    result = dict(source="bench/decode_peers.py (functions of shared/bench/peers_torch.py)",
                  env=dict(torch=torch.__version__, device=torch.cuda.get_device_name(0)),
                  results=[], failures=[])
    t0 = time.time()
    result["ceilings"] = pt.ceilings(torch, bench)
    print("ceilings:", json.dumps(result["ceilings"]), flush=True)
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    seed = 1000
    for hname, hq, hkv in pt.HEADS:
        for wl, kind, lens in pt.workloads():
            seed += 1
            if kind != "decode":
                continue
            q, k, v, cu_q, cu_k, rows = pt.make_data(torch, kind, lens, hq, hkv, seed)
            ref = pt.reference(torch, kind, lens, q, k, v, cu_q, cu_k, rows, hq, hkv)
            runs = [(f"torch_sdpa_{b}_padded",
                     lambda b=b, be=be: pt.run_sdpa(torch, F, sdpa_kernel, be, b, kind, lens, hq, hkv, q, k, v,
                                                    cu_q, cu_k, rows, ref)) for b, be in backends]
            runs.append(("torch_fa2_varlen",
                         lambda: pt.run_varlen(torch, kind, lens, hq, hkv, q, k, v, cu_q, cu_k, rows, ref)))
            for system, fn in runs:
                try:
                    r = fn()
                    nbytes, flops = pt.counts(kind, lens, hq, hkv)
                    row = dict(workload=wl, kind=kind, heads=hname, system=system, batch=len(lens),
                               sum_len=sum(lens), bytes=nbytes, flops=flops, **r)
                    row["TBps"] = nbytes / (r["time_us"] * 1e-6) / 1e12
                    result["results"].append(row)
                    print(f"{wl} {hname} {system:28s} {r['time_us']:9.2f} us {row['TBps']:6.3f} TB/s "
                          f"err {r['rel_err']:.2e}", flush=True)
                except Exception as e:  # noqa: BLE001
                    result["failures"].append(dict(workload=wl, heads=hname, system=system, error=str(e)[:300]))
                    print(f"{wl} {hname} {system} FAILED: {str(e)[:200]}", flush=True)
                torch.cuda.empty_cache()
            del q, k, v, ref
            torch.cuda.empty_cache()
    result["elapsed_s"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"done in {result['elapsed_s']:.1f}s -> {args.out}")


if __name__ == "__main__":
    main()
