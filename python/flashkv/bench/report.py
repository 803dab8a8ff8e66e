"""The result document (the JSON schema of docs/benchmarks.md) and its text forms: one line per row, a
Markdown table, the JSON file."""

import json
import math
import os
import subprocess
import time

KIND_ORDER = {"decode": 0, "prefill": 1, "sparse": 2}


def commit() -> str:
    """The source checkout's short commit (+"-dirty" with uncommitted changes), or "unknown"."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "-C", here, "diff", "--quiet", "HEAD"], timeout=10)
        return rev.stdout.strip() + ("-dirty" if dirty.returncode == 1 else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def ceiling_of(doc, kind):
    """(value, unit label) that a row of `kind` is a percentage of: decode the read ceiling,
    prefill the fp16 GEMM rate (bf16 rows too, as docs/benchmarks.md does)."""
    c = doc.get("ceilings") or {}
    if kind == "decode":
        return c.get("read_tbps"), "read ceiling", "TB/s"
    return c.get("gemm_f16_tflops"), "fp16 GEMM rate", "TFLOP/s"


def kind_of(row):
    return row.get("kind") or ("decode" if str(row.get("workload", "")).startswith("D")
                               else "prefill")


def fill_pct(doc):
    """pct_of_ceiling of every row, from the document's ceilings (None where one is missing):
    a rate in TB/s of the read ceiling, one in TFLOP/s of the fp16 GEMM rate (the sparse rows
    carry one or the other)."""
    c = doc.get("ceilings") or {}
    for r in doc["results"]:
        if r.get("tbps") is not None:
            ceil, rate = c.get("read_tbps"), r["tbps"]
        else:
            ceil, rate = c.get("gemm_f16_tflops"), r.get("tflops")
        r["pct_of_ceiling"] = 100 * rate / ceil if ceil and rate is not None else None
    return doc


def _rate(x, spec):
    return format(x, spec) if x >= 0.01 else format(x, "8.2e")


def fmt_row(r, pct=None):
    rate = (f"{_rate(r['tbps'], '8.3f')} TB/s" if r.get("tbps") is not None
            else f"{_rate(r['tflops'], '8.1f')} TFLOP/s" if r.get("tflops") is not None else "")
    pc = "" if pct is None else f" {pct:6.1f}%"
    err = r.get("rel_err")
    ok = {True: " ok", False: " FAIL"}.get(r.get("ref_ok"), "")
    return (f"{r['workload']:8s} {r['shape']:10s} {r['dtype']:5s} {r['system']:28s} "
            f"{r['time_us']:10.2f} us {rate}{pc} rel_err "
            f"{'n/a' if err is None else format(err, '.2e')}{ok}")


def sorted_rows(doc):
    """By kind, workload (in the order they ran), shape, dtype; flashkv before the peers."""
    first = {}
    for i, r in enumerate(doc["results"]):
        first.setdefault(r["workload"], i)
    own = lambda r: 0 if r["system"].startswith("flashkv") else 1  # noqa: E731
    return sorted(doc["results"], key=lambda r: (KIND_ORDER.get(kind_of(r), 2),
                                                 first[r["workload"]], r["shape"], r["dtype"],
                                                 own(r), r["system"]))


def ceilings_text(doc) -> str:
    c = doc.get("ceilings") or {}
    if c.get("read_tbps") is None:
        return "no ceilings (CPU reference mode)"
    # A merged document may lack some (a peers' run measures them all, an older file not).
    num = lambda key, spec: "n/a" if c.get(key) is None else format(c[key], spec)  # noqa: E731
    return (f"read {num('read_tbps', '.2f')} TB/s, copy {num('copy_tbps', '.2f')} TB/s, GEMM fp16 "
            f"{num('gemm_f16_tflops', '.0f')} / bf16 {num('gemm_bf16_tflops', '.0f')} TFLOP/s")


def print_table(doc, log=print):
    log("")
    log(f"Summary: {doc.get('gpu') or 'CPU reference'}, flashkv {doc.get('commit')}; "
        f"{ceilings_text(doc)}; % = decode of the read ceiling, prefill of the fp16 GEMM rate")
    for r in sorted_rows(doc):
        log(fmt_row(r, r.get("pct_of_ceiling")))
    for f in doc.get("failures", []):
        log(f"{f['workload']:8s} {f.get('shape', ''):10s} {f.get('dtype', ''):5s} "
            f"{f['system']:28s} FAILED: {f['error'].splitlines()[0][:160]}")


def markdown(doc) -> str:
    num = lambda x, spec: "" if x is None else format(x, spec)  # noqa: E731
    md = [f"flashkv {doc.get('commit')} through the Python API on {doc.get('gpu') or 'the CPU'} "
          f"({doc.get('date')}); ceilings measured in the same run: {ceilings_text(doc)}. "
          f"Decode: % of the read ceiling; prefill: % of the fp16 GEMM rate. Torch peers run on "
          f"padded or contiguous KV (not paged), which favours them.", "",
          "| workload | shape | dtype | system | time_us | TB/s | TFLOP/s | % ceiling | rel_err |",
          "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in sorted_rows(doc):
        err = num(r.get("rel_err"), ".1e") + (" FAIL" if r.get("ref_ok") is False else "")
        md.append(f"| {r['workload']} | {r['shape']} | {r['dtype']} | {r['system']} | "
                  f"{num(r['time_us'], '.1f')} | {num(r.get('tbps'), '.3f')} | "
                  f"{num(r.get('tflops'), '.1f')} | {num(r.get('pct_of_ceiling'), '.1f')} | "
                  f"{err} |")
    return "\n".join(md) + "\n"


def clean(x):
    """NaN / inf -> None, so the JSON is standard."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def write_json(doc, path):
    with open(path, "w") as f:
        json.dump(clean(doc), f, indent=1)
        f.write("\n")


def flashkv_failures(doc) -> int:
    """flashkv rows that failed the reference check, plus flashkv configurations that raised."""
    bad = sum(1 for r in doc["results"] if r["system"].startswith("flashkv")
              and r.get("ref_ok") is False)
    return bad + sum(1 for f in doc.get("failures", []) if f["system"].startswith("flashkv"))
