"""Several result documents (flashkv's C++ or Python benchmark, the peers) merged into one, so
that one table and one plot show flashkv beside its peers.

Rows and failures are concatenated; each ceiling is the best (largest) measurement of it among
the files, since every file measured it in the same session; gpu, commit and date are the first
file's that has them. Rows must be in the result schema (workload, shape, dtype, system, time_us,
tbps or tflops).
"""

import json

from .. import report

CEILINGS = ("read_tbps", "copy_tbps", "gemm_f16_tflops", "gemm_bf16_tflops")
ROW_KEYS = ("workload", "shape", "dtype", "system", "time_us")


def merge_docs(docs, names=None):
    names = names or [f"document {i}" for i in range(len(docs))]
    out = dict(gpu=None, commit=None, date=None, merged_from=list(names),
               ceilings={k: None for k in CEILINGS}, results=[], failures=[])
    for name, doc in zip(names, docs):
        for key in ("gpu", "commit", "date"):
            out[key] = out[key] or doc.get(key)
        for key in CEILINGS:
            value = (doc.get("ceilings") or {}).get(key)
            if isinstance(value, (int, float)):
                out["ceilings"][key] = max(value, out["ceilings"][key] or 0.0)
        for row in doc.get("results", []):
            missing = [k for k in ROW_KEYS if k not in row]
            if missing:
                raise ValueError(f"{name}: a row lacks {', '.join(missing)} (expected rows in the "
                                 f"result schema of docs/benchmarks.md): {row}")
            out["results"].append(row)
        out["failures"] += doc.get("failures", [])
    return report.fill_pct(out)


def merge_files(paths):
    docs = []
    for path in paths:
        with open(path) as f:
            docs.append(json.load(f))
    return merge_docs(docs, paths)
