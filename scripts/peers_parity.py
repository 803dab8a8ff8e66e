#!/usr/bin/env python3
"""The in-repo peers (flashkv.bench.peers) against the script they replace, in one process on
the same inputs: scripts/peers-parity.sh runs it (see there). Not a user's tool: it exists to show
once that the rows of the two are the same within noise.

For each (workload, shape) both draw the same inputs (same seed, generator and order), so their
rel_err must agree exactly and their times within noise. Rounds alternate which goes first;
the noise of a system is the largest difference between rounds of the same implementation.
FlexAttention (GQA only: each (workload, shape) compiles) runs last, while the time lasts.
"""
import argparse
import importlib.util
import json
import os
import sys
import time
import warnings

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DENSE = ["sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "fa2-varlen"]


def load_by_path(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--shared: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", required=True, help="the old peers_torch.py")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--workloads", nargs="+", default=["D1", "D2", "D3", "D4", "P1", "P4"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--flex-until-s", type=float, default=120.0,
                    help="start no FlexAttention pair after this many seconds (0: none)")
    args = ap.parse_args()
    t0 = time.time()
    launcher = load_by_path("run_peers", os.path.join(ROOT, "bench", "run_peers.py"))
    launcher.bare_package("flashkv", launcher.SOURCES)
    launcher.bare_package("flashkv.bench", os.path.join(launcher.SOURCES, "bench"))
    from flashkv.bench import workloads as W
    from flashkv.bench.peers import batch, ceilings, registry, runner
    from flashkv.bench.peers.timing import Timer

    pt = load_by_path("peers_torch_shared", args.shared)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    warnings.filterwarnings("ignore")
    os.makedirs(args.out, exist_ok=True)
    pt.BENCH = pt.Bench(torch)
    timer = Timer(torch)
    doc = dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, samples=[],
               failures=[], ceilings={})
    doc["ceilings"]["shared"] = pt.ceilings(torch, pt.BENCH)
    doc["ceilings"]["in_repo"] = ceilings.measure(torch, timer)
    print("ceilings:", json.dumps(doc["ceilings"]), flush=True)
    backends = {"sdpa-flash": ("flash", SDPBackend.FLASH_ATTENTION),
                "sdpa-cudnn": ("cudnn", SDPBackend.CUDNN_ATTENTION),
                "sdpa-efficient": ("efficient", SDPBackend.EFFICIENT_ATTENTION)}
    wls = {w.id: w for w in runner.ALL_WORKLOADS}

    def shared_rows(w, hq, hkv, seed, peers):
        lens = w.kv_lens
        q, k, v, cu_q, cu_k, rows = pt.make_data(torch, w.kind, lens, hq, hkv, seed)
        ref = pt.reference(torch, w.kind, lens, q, k, v, cu_q, cu_k, rows, hq, hkv)
        a = (w.kind, lens, hq, hkv, q, k, v, cu_q, cu_k, rows, ref)
        for name in peers:
            if name in backends:
                bname, be = backends[name]
                yield name, lambda: pt.run_sdpa(torch, F, sdpa_kernel, be, bname, *a)
            elif name == "fa2-varlen":
                yield name, lambda: pt.run_varlen(torch, *a)
            else:
                yield name, lambda: pt.run_flex(torch, *a)

    def in_repo_rows(w, hq, hkv, seed, peers):
        b = batch.make(torch, w, hq, hkv, seed)
        for name in peers:
            peer = registry.BY_NAME[name]
            yield name, lambda: runner.time_peer(torch, peer, b, timer, seed, None)

    def measure(impl, w, shape, rnd, peers):
        hq, hkv = W.SHAPES[shape]
        make = shared_rows if impl == "shared" else in_repo_rows
        for name, fn in make(w, hq, hkv, runner.seed_of(w.id, shape), peers):
            system = registry.BY_NAME[name].system(w)
            try:
                r = fn()
            except Exception as e:  # noqa: BLE001  (both should fail alike: recorded)
                doc["failures"].append(dict(impl=impl, round=rnd, workload=w.id, shape=shape,
                                            system=system, error=f"{type(e).__name__}: {e}"[:300]))
                print(f"{impl:8s} r{rnd} {w.id} {shape} {system:28s} FAILED {str(e)[:120]}",
                      flush=True)
                continue
            doc["samples"].append(dict(impl=impl, round=rnd, workload=w.id, shape=shape,
                                       system=system, time_us=r["time_us"], p10_us=r["p10_us"],
                                       p90_us=r["p90_us"], reps=r["reps"], rel_err=r["rel_err"]))
            print(f"{impl:8s} r{rnd} {w.id} {shape} {system:28s} {r['time_us']:10.2f} us "
                  f"rel_err {r['rel_err']:.3e}", flush=True)
            torch.cuda.empty_cache()
        with open(os.path.join(args.out, "parity.json"), "w") as f:
            json.dump(doc, f, indent=1)

    for rnd in range(args.rounds):
        order = ("shared", "in_repo") if rnd % 2 == 0 else ("in_repo", "shared")
        for wid in args.workloads:
            for shape in W.SHAPES:
                for impl in order:
                    measure(impl, wls[wid], shape, rnd, DENSE)
    for wid in (x for x in args.workloads if wls[x].kind == "prefill"):
        for rnd in range(args.rounds):
            if time.time() - t0 > args.flex_until_s:
                print(f"flex {wid} round {rnd}: skipped (past --flex-until-s)", flush=True)
                continue
            order = ("shared", "in_repo") if rnd % 2 == 0 else ("in_repo", "shared")
            for impl in order:
                measure(impl, wls[wid], "gqa-32-8", rnd, ["flex"])
    doc["elapsed_s"] = time.time() - t0
    with open(os.path.join(args.out, "parity.json"), "w") as f:
        json.dump(doc, f, indent=1)
    table = summarize(doc)
    with open(os.path.join(args.out, "parity.md"), "w") as f:
        f.write(table)
    print(table)
    print(f"done in {doc['elapsed_s']:.0f} s")
    return 0


def summarize(doc):
    """One line per (workload, shape, system): each implementation's median per round, the
    ratio in-repo / shared of their means, the noise (the larger round-to-round spread of the
    two), both rel_errs, and whether the ratio is within the noise."""
    groups = {}
    for s in doc["samples"]:
        groups.setdefault((s["workload"], s["shape"], s["system"]), []).append(s)
    lines = [f"Peers parity on {doc['gpu']} (torch {doc['torch']}): the shared script's peers "
             "and flashkv.bench.peers, same inputs, rounds alternating which runs first.", ""]
    ceil_keys = ("read_tbps", "copy_tbps", "gemm_f16_tflops", "gemm_bf16_tflops")
    shared_c = doc["ceilings"]["shared"]
    shared_c = dict(read_tbps=shared_c["read_kernel_TBps"], copy_tbps=shared_c["copy_d2d_TBps"],
                    gemm_f16_tflops=shared_c["matmul_fp16_TFLOPs"],
                    gemm_bf16_tflops=shared_c["matmul_bf16_TFLOPs"])
    lines.append("| ceiling | shared | in-repo | ratio |")
    lines.append("|---|---:|---:|---:|")
    for k in ceil_keys:
        a, b = shared_c[k], doc["ceilings"]["in_repo"][k]
        lines.append(f"| {k} | {a:.3f} | {b:.3f} | {b / a:.3f} |")
    lines += ["", "| workload | shape | system | shared us (rounds) | in-repo us (rounds) | "
                  "ratio | noise | rel_err shared | rel_err in-repo | within noise |",
              "|---|---|---|---|---|---:|---:|---:|---:|---|"]
    verdicts = []
    for (wid, shape, system), ss in groups.items():
        by = {impl: [s for s in ss if s["impl"] == impl] for impl in ("shared", "in_repo")}
        if not by["shared"] or not by["in_repo"]:
            lines.append(f"| {wid} | {shape} | {system} | {len(by['shared'])} runs | "
                         f"{len(by['in_repo'])} runs | | | | | only one ran |")
            verdicts.append(False)
            continue
        mean = {k: sum(s["time_us"] for s in v) / len(v) for k, v in by.items()}
        spread = max((max(s["time_us"] for s in v) - min(s["time_us"] for s in v)) / mean[k]
                     for k, v in by.items())
        ratio = mean["in_repo"] / mean["shared"]
        # Within noise: the difference of the means is no larger than the larger round-to-round
        # spread of one implementation, with a floor of 3 % for runs that happened to agree.
        ok = abs(ratio - 1) <= max(0.03, spread)
        verdicts.append(ok)
        cell = lambda v: " / ".join(f"{s['time_us']:.1f}" for s in v)  # noqa: E731
        lines.append(f"| {wid} | {shape} | {system} | {cell(by['shared'])} | "
                     f"{cell(by['in_repo'])} | {ratio:.3f} | {spread:.3f} | "
                     f"{by['shared'][0]['rel_err']:.3e} | {by['in_repo'][0]['rel_err']:.3e} | "
                     f"{'yes' if ok else 'NO'} |")
    lines += ["", f"{sum(verdicts)} of {len(verdicts)} systems within noise; "
                  f"{len(doc['failures'])} failed runs (both implementations should fail alike)."]
    for f in doc["failures"]:
        lines.append(f"  {f['impl']} r{f['round']} {f['workload']} {f['shape']} {f['system']}: "
                     f"{f['error'].splitlines()[0][:160]}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
