#!/usr/bin/env python3
"""A/B of two flashkv builds from `flashkv bench ... --json` files run alternately in one command
(A, B, A, B, ...): per (workload, variant, head_dim, shape, dtype, kernel options) row, the median time of each side,
B / A, and whether both met the reference tolerance. Markdown on stdout.

    scripts/ab_summary.py --label-a base --label-b new --a a1.json a2.json --b b1.json b2.json
"""
import argparse
import json
import statistics
import sys


def rows(paths):
    out = {}
    for p in paths:
        doc = json.load(open(p))
        if "results" not in doc:
            sys.exit(f"ab_summary: {p} has no GPU results (a run without a GPU writes the CPU "
                     f"reference's timings, which are not an A/B)")
        for r in doc["results"]:
            if r.get("system", "flashkv") != "flashkv":
                continue
            # The workload column names a row's variant (bench variants) and head_dim beside it.
            name = " ".join(str(x) for x in (r.get("workload"), r.get("variant", ""),
                                              f"d{r['head_dim']}" if "head_dim" in r else "") if x)
            key = (name, r.get("shape"), r.get("dtype"), r.get("layout", ""),
                   r.get("workspace_mb", 0), r.get("kind", ""))
            out.setdefault(key, []).append(r)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", nargs="+", required=True)
    ap.add_argument("--b", nargs="+", required=True)
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    args = ap.parse_args()
    a, b = rows(args.a), rows(args.b)
    print(f"| workload | shape | dtype | {args.label_a} µs | {args.label_b} µs | "
          f"{args.label_b}/{args.label_a} | runs | ref ok |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for key in sorted(set(a) & set(b), key=str):
        ta = statistics.median(r["time_us"] for r in a[key])
        tb = statistics.median(r["time_us"] for r in b[key])
        ok = all(r.get("ref_ok", True) for r in a[key] + b[key])
        ratios.append(tb / ta)
        print(f"| {key[0]} | {key[1]} | {key[2]} | {ta:.1f} | {tb:.1f} | {tb / ta:.3f} | "
              f"{len(a[key])}+{len(b[key])} | {'yes' if ok else 'NO'} |")
    only = sorted(set(a) ^ set(b), key=str)
    if only:
        print(f"\nrows on one side only: {only}")
    if ratios:
        print(f"\n{len(ratios)} rows: {args.label_b}/{args.label_a} median "
              f"{statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")


if __name__ == "__main__":
    main()
