"""`python -m flashkv.bench.peers` (or bench/run_peers.py from a checkout): the peers alone, and
the merge of result files into one table.

  run:   --peers torch,flashinfer [--kinds decode prefill append] [--workloads D1 P4 ...]
         [--shapes ...] [--prefill-shapes ...] [--kv-dtype e4m3] [--no-ceilings] --out FILE.json
  merge: --merge A.json B.json ... [--json FILE] [--md FILE] [--plots DIR]
  emit:  --emit-workloads FILE (D1-D6 and P1-P5 as "NAME KIND BATCH lens..." lines, the format
         `flashkv bench --workloads-file` reads)
"""

import argparse
import os
import sys
import time

from .. import outputs, report
from .. import workloads as W
from . import registry

KINDS = ("decode", "prefill", "append")
METHOD = ("flashkv.bench.peers: median of >= 30 reps after warm-up, CUDA events around the call "
          "only (plan / padding / block-mask creation excluded, FlashInfer's merge included), L2 "
          "flushed by a 1 GiB read before each rep, GPU spin before the start event; bytes/FLOPs "
          "on real tokens only; rel_err against float32 math attention on sampled rows")


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="python -m flashkv.bench.peers",
        description="The peers of flashkv's benchmark (docs/benchmarks.md) on its standard "
                    "workloads, with the GPU's ceilings measured in the same run; or, with "
                    "--merge, several result files in one table.")
    ap.add_argument("--peers", default="torch",
                    help="comma-separated peers or groups: " + ", ".join(registry.names())
                         + " (default: torch)")
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                    help="decode: D1-D6; prefill: P1-P5; append: A1, S1 (default: all)")
    ap.add_argument("--workloads", nargs="+", metavar="ID", help="e.g. D1 D4 P1 (default: all)")
    ap.add_argument("--shapes", nargs="+", choices=list(W.SHAPES), default=list(W.SHAPES),
                    help="decode head shapes (default: both)")
    ap.add_argument("--prefill-shapes", nargs="+", choices=list(W.SHAPES),
                    default=list(W.SHAPES), help="prefill and append head shapes (default: both)")
    ap.add_argument("--kv-dtype", choices=["e4m3"],
                    help="an fp8 KV cache for the FlashInfer peers (the torch peers are skipped)")
    ap.add_argument("--no-ceilings", action="store_true", help="do not measure the ceilings")
    ap.add_argument("--budget-s", type=float, default=900.0,
                    help="start no peer after this many seconds (default 900)")
    ap.add_argument("--out", metavar="FILE", help="the run's results (JSON)")
    ap.add_argument("--merge", nargs="+", metavar="FILE",
                    help="merge these result files (flashkv's and the peers') instead of running")
    ap.add_argument("--json", metavar="FILE", help="--merge: the merged document")
    ap.add_argument("--md", metavar="FILE", help="--merge: a Markdown table")
    ap.add_argument("--plots", metavar="DIR", help="--merge: decode.png and prefill.png")
    ap.add_argument("--emit-workloads", metavar="FILE",
                    help="write D1-D6 and P1-P5 as 'NAME KIND BATCH lens...' lines and exit")
    args = ap.parse_args(argv)
    if args.emit_workloads:
        return args
    if args.merge:
        if not (args.json or args.md or args.plots):
            ap.error("--merge: give --json, --md or --plots for the merged result")
        return args
    try:
        args.selected = registry.select(args.peers)
    except ValueError as e:
        ap.error(str(e))
    if not args.out:
        ap.error("--out FILE is required (or --merge FILES)")
    if args.budget_s <= 0:
        ap.error(f"--budget-s: expected a positive number of seconds, got {args.budget_s}")
    known = {w.id: w for w in all_workloads()}
    for wl in args.workloads or []:
        if wl not in known:
            ap.error(f"--workloads: unknown id {wl!r} (expected some of {sorted(known)})")
    return args


def all_workloads():
    return W.standard_workloads() + W.append_workloads()


def chosen_workloads(kinds, ids=None):
    """The workloads of `kinds` (decode, prefill, append), restricted to `ids` when given."""
    def kind(w):
        if w.kind == "decode":
            return "decode"
        return "prefill" if w.qo() == list(w.kv_lens) else "append"

    return [w for w in all_workloads() if kind(w) in kinds and (not ids or w.id in ids)]


def run(args, log):
    try:
        import torch
    except ImportError:
        log("flashkv.bench.peers: PyTorch is not installed; the peers are torch code")
        return 2
    if not torch.cuda.is_available():
        log("flashkv.bench.peers: torch.cuda.is_available() is False; the peers need a GPU")
        return 2
    from . import ceilings, runner
    from .timing import Timer

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    import warnings

    warnings.filterwarnings("ignore")
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    doc = dict(gpu=torch.cuda.get_device_name(0), commit=report.commit(), date=report.now_iso(),
               source="flashkv.bench.peers", peers=[p.name for p in args.selected],
               env=dict(torch=torch.__version__, cuda=torch.version.cuda,
                        cudnn=torch.backends.cudnn.version(), sms=props.multi_processor_count,
                        python=sys.version.split()[0]),
               method=METHOD, ceilings=None, results=[], failures=[])

    def save(rows=None, failures=None):
        if rows is not None:
            doc["results"], doc["failures"] = rows, failures
        report.write_json(report.fill_pct(doc), args.out)

    log(f"GPU: {doc['gpu']}, torch {torch.__version__}; peers: {', '.join(doc['peers'])}")
    timer = Timer(torch)
    if not args.no_ceilings:
        doc["ceilings"] = ceilings.measure(torch, timer)
        log(f"ceilings: {report.ceilings_text(doc)}")
        save()
    shapes_of = lambda kind: args.shapes if kind == "decode" else args.prefill_shapes  # noqa
    wls = chosen_workloads(args.kinds, args.workloads)
    rows, failures = runner.run(torch, args.selected, wls, shapes_of, timer, args.budget_s, log,
                                args.kv_dtype, saved=save)
    doc["elapsed_s"] = time.time() - t0
    save(rows, failures)
    report.print_table(doc, log)
    log(f"wrote {args.out} ({len(rows)} rows, {len(failures)} failures) in "
        f"{doc['elapsed_s']:.0f} s")
    return 0


def merge(args, log):
    from . import merge as merging

    doc = merging.merge_files(args.merge)
    report.print_table(doc, log)
    outputs.write_outputs(doc, args.json, args.md, args.plots, log)
    return 0


def emit_workloads(path):
    """The standard workloads in the text form `flashkv bench --workloads-file` reads."""
    with open(path, "w") as f:
        f.write("# NAME KIND BATCH lens...\n")
        for w in W.standard_workloads():
            f.write(f"{w.id} {w.kind} {w.batch} {' '.join(map(str, w.kv_lens))}\n")


def main(argv=None, log=None):
    log = log or (lambda s: print(s, flush=True))
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.emit_workloads:
        emit_workloads(args.emit_workloads)
        log(f"wrote {args.emit_workloads}")
        return 0
    if args.merge:
        return merge(args, log)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    return run(args, log)
