"""`python -m flashkv.bench`: the options, the GPU and CPU runs, and the outputs."""

import argparse
import platform
import sys

import flashkv

from . import cpu, outputs, report
from . import sparse_workloads as SW
from . import workloads as W
from .peers import registry as peer_registry

SHAPES = list(W.SHAPES)
METHOD = ("flashkv through its Python API (FlashInfer-shaped wrappers on torch CUDA tensors, "
          "run() through the flashkv torch custom ops): plan once, then CUDA events around run() "
          "only, median of --reps after 5 warm-ups, a GPU spin before each start event, inputs "
          "rotated over copies spanning 200 MB; checked against a float32 torch reference on "
          "sampled requests. Order (fixed): ceilings, flashkv decode, flashkv prefill, torch "
          "peers (decode, prefill). Decode % is of the read ceiling, prefill % of the fp16 GEMM "
          "rate. Bytes/FLOPs count real tokens only.")


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="python -m flashkv.bench",
        description="flashkv's standard workloads (docs/benchmarks.md: decode D1-D6, prefill "
                    "P1-P5) through the Python API, with the ceilings and, optionally, the peers "
                    "(--peers torch,flashinfer) measured in the same process. Without a GPU (or "
                    "with --cpu) it runs the CPU reference at a small size instead.")
    ap.add_argument("--kinds", nargs="+", choices=["decode", "prefill", "sparse"],
                    default=["decode", "prefill"],
                    help="sparse: B1-B4 (block-sparse prefill, sparse-KV decode) with their "
                         "peers (dense flashkv, FlexAttention, SDPA with a dense mask)")
    ap.add_argument("--workloads", nargs="+", metavar="ID",
                    help="e.g. D1 D4 P2 B3 (default: all of each kind)")
    ap.add_argument("--shapes", nargs="+", choices=SHAPES, default=SHAPES,
                    help="decode head shapes (default: both)")
    ap.add_argument("--prefill-shapes", nargs="+", choices=SHAPES, default=["gqa-32-8"],
                    help="prefill head shapes (default: gqa-32-8)")
    ap.add_argument("--dtypes", nargs="+", choices=["f16", "bf16"], default=["f16"])
    ap.add_argument("--kv-dtype", choices=["e4m3", "e5m2"],
                    help="an fp8 KV cache (scale 1) under each --dtypes query dtype (GPU mode)")
    ap.add_argument("--reps", type=int, default=30, help="timed repetitions (median reported)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--json", metavar="FILE",
                    help="results in the JSON schema of docs/benchmarks.md")
    ap.add_argument("--md", metavar="FILE", help="results as a Markdown table")
    ap.add_argument("--plots", metavar="DIR", help="decode.png and prefill.png (matplotlib)")
    ap.add_argument("--peers", metavar="NAMES",
                    help="peers run in this process on the same workloads (f16), comma-separated "
                         "groups or names: " + ", ".join(peer_registry.names())
                         + " (flashkv.bench.peers); without it no peer runs")
    ap.add_argument("--no-flex", action="store_true",
                    help="skip the FlexAttention peer (minutes of torch.compile)")
    ap.add_argument("--peers-budget-s", type=float, default=900.0,
                    help="start no peer run after this many seconds of peers")
    ap.add_argument("--cpu", action="store_true",
                    help="the CPU reference mode even where a GPU is present")
    ap.add_argument("--cpu-reps", type=int, default=3, help="repetitions in the CPU mode")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.cpu_reps < 1:
        ap.error("--reps and --cpu-reps must be >= 1")
    if args.peers:
        try:
            args.selected_peers = peer_registry.select(args.peers)
        except ValueError as e:
            ap.error(str(e))
    known = {w.id for w in W.standard_workloads()} | set(SW.WORKLOADS)
    for wl in args.workloads or []:
        if wl not in known:
            ap.error(f"--workloads: unknown id {wl!r} (expected some of {sorted(known)})")
    return args


def gpu_unavailable():
    """Why the GPU benchmark cannot run here, or None."""
    if not flashkv.cuda_available():
        return f"no CUDA GPU ({flashkv._C.cuda_unavailable_reason()})"
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (the benchmark runs the wrappers on torch CUDA tensors)"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    return None


def env_info(torch=None):
    env = dict(flashkv=flashkv.__version__, python=platform.python_version(),
               numpy=__import__("numpy").__version__)
    if torch is not None:
        props = torch.cuda.get_device_properties(0)
        env.update(torch=torch.__version__, cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version(), sms=props.multi_processor_count)
    return env


def run_gpu(args, log):
    import torch

    from . import gpu
    from .peers import ceilings as peer_ceilings
    from .peers import runner as peer_runner
    from .peers.timing import Timer

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    timer = Timer(torch) if args.peers else None
    doc = dict(gpu=torch.cuda.get_device_name(0), commit=report.commit(), date=report.now_iso(),
               api="python", env=env_info(torch), method=METHOD, ceilings=None, results=[],
               failures=[])
    log(f"GPU: {doc['gpu']}, torch {torch.__version__}, flashkv {flashkv.__version__} "
        f"({doc['commit']})")
    # With peers, the ceilings are measured as the peers' runs measure them, so that the
    # percentages of both compare.
    doc["ceilings"] = peer_ceilings.measure(torch, timer) if timer else gpu.own_ceilings()
    c = doc["ceilings"]
    log(f"ceilings: read {c['read_tbps']:.2f} TB/s, copy {c['copy_tbps']:.2f} TB/s, GEMM f16 "
        f"{c['gemm_f16_tflops']:.0f} TFLOP/s, bf16 {c['gemm_bf16_tflops']:.0f} TFLOP/s")
    shapes_of = lambda kind: args.shapes if kind == "decode" else args.prefill_shapes  # noqa
    wls = [w for kind in ("decode", "prefill") if kind in args.kinds
           for w in W.select(kind, args.workloads)]
    seed = 0
    for w in wls:
        for shape in shapes_of(w.kind):
            for dtype in args.dtypes:
                seed += 1
                try:
                    row = gpu.run_config(w, shape, dtype, args.page_size, args.head_dim,
                                         args.reps, seed, args.kv_dtype)
                except Exception as e:  # noqa: BLE001  (recorded; the run goes on)
                    torch.cuda.empty_cache()
                    msg = f"{type(e).__name__}: {e}"
                    doc["failures"].append(dict(workload=w.id, shape=shape, dtype=dtype,
                                                system="flashkv", heads=shape[:3].upper(),
                                                error=msg))
                    log(f"{w.id:8s} {shape:10s} {dtype:5s} {'flashkv':28s} FAILED: {msg[:300]}")
                    continue
                doc["results"].append(row)
                report.fill_pct(doc)
                log(report.fmt_row(row, row["pct_of_ceiling"]))
    if timer is not None:
        if "f16" not in args.dtypes or args.head_dim != 128:
            log("--peers: the peers run f16 with head_dim 128 only; peers skipped")
        else:
            chosen = [p for p in args.selected_peers if not (args.no_flex and p.name == "flex")]
            rows, fails = peer_runner.run(torch, chosen, wls, shapes_of, timer,
                                          args.peers_budget_s, log)
            doc["results"] += rows
            doc["failures"] += fails
            doc["env"]["peers"] = [p.name for p in chosen]
    if "sparse" in args.kinds:
        from . import sparse_gpu

        ids = [i for i in args.workloads or [] if i in SW.WORKLOADS] or list(SW.WORKLOADS)
        if "f16" not in args.dtypes or args.head_dim != 128:
            log("sparse: B1-B4 are f16 with head_dim 128 (docs/benchmarks.md); they run so")
        rows, fails = sparse_gpu.run(ids, args.reps, log, args.no_flex)
        doc["results"] += rows
        doc["failures"] += fails
    return report.fill_pct(doc)


def run_cpu(args, why, log):
    log(f"No GPU benchmark here: {why}.")
    log("Running the CPU reference backend at a small size instead (the same wrappers on NumPy "
        "arrays; GQA 32/8, head_dim 128, f16). Times are host wall-clock, not GPU numbers.")
    if args.peers:
        log("--peers: the torch peers need a GPU; skipped")
    doc = dict(gpu=None, commit=report.commit(), date=report.now_iso(), api="python",
               mode="cpu-reference", env=env_info(),
               method="CPU reference (flashkv's host backend) through the Python wrappers, "
                      "host wall-clock, median of --cpu-reps; float32 NumPy reference check",
               ceilings=dict(read_tbps=None, copy_tbps=None, gemm_f16_tflops=None,
                             gemm_bf16_tflops=None),
               results=cpu.run(args.kinds, args.cpu_reps, log), failures=[])
    return report.fill_pct(doc)


def main(argv=None, log=None):
    log = log or (lambda s: print(s, flush=True))
    args = parse_args(sys.argv[1:] if argv is None else argv)
    why = "--cpu given" if args.cpu else gpu_unavailable()
    doc = run_cpu(args, why, log) if why else run_gpu(args, log)
    report.print_table(doc, log)
    outputs.write_outputs(doc, args.json, args.md, args.plots, log)
    failed = report.flashkv_failures(doc)
    if failed:
        log(f"{failed} flashkv configurations failed the reference check or did not run")
    return 1 if failed else 0
