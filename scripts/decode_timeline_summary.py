#!/usr/bin/env python3
"""Summarizes `flashkv bench decode --decode-timeline FILE`: per configuration, the spread over CTAs
(p0/p50/p90/max, microseconds) of each phase of the decode kernel (kernels/attention/work_timeline.cuh):
CTA start and end, start -> first item read, item read -> first KV tile in shared memory (the ramp),
the tile loop, the epilogue (warps merged, output or partial state written), the arrival of a split
tile's partial state (fence + atomic) and the merge run by the tile's last CTA."""
import json
import sys

EVENTS = 6  # per work item (work_timeline.cuh); a CTA row is 1 + EVENTS * items long


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def spread(xs):
    if not xs:
        return "-"
    return "p0 %7.2f p50 %7.2f p90 %7.2f max %7.2f" % (
        min(xs) / 1e3, pct(xs, .5) / 1e3, pct(xs, .9) / 1e3, max(xs) / 1e3)


def main(path):
    for t in json.load(open(path)):
        ctas = [c for c in t["ctas"] if c[0] >= 0]
        start, end, first, ramp, loop, epi, arrive, merge, counts = [], [], [], [], [], [], [], [], []
        for c in ctas:
            items = [c[1 + EVENTS * i:1 + EVENTS * (i + 1)] for i in range((len(c) - 1) // EVENTS) if c[1 + EVENTS * i] >= 0]
            counts.append(len(items))
            start.append(c[0])
            if not items:
                end.append(c[0])
                continue
            end.append(items[-1][5])
            first.append(items[0][0] - c[0])
            for it in items:
                if it[1] >= 0:
                    ramp.append(it[1] - it[0])
                if it[2] >= 0 and it[1] >= 0:
                    loop.append(it[2] - it[1])
                if it[3] >= 0 and it[2] >= 0:
                    epi.append(it[3] - it[2])
                if it[4] >= 0 and it[3] >= 0:
                    arrive.append(it[4] - it[3])
                if it[5] >= 0 and it[4] >= 0 and it[5] - it[4] > 100:  # the last CTA merged
                    merge.append(it[5] - it[4])
        print(f"{t['workload']} {t['shape']} {t['dtype']} {t['kernel']}: {len(ctas)} CTAs, "
              f"{min(counts)}-{max(counts)} items per CTA (us)")
        for name, xs in [("CTA start", start), ("CTA end", end), ("start->item", first),
                         ("item->tile0", ramp), ("tile loop", loop), ("epilogue", epi),
                         ("arrival", arrive), ("merge", merge)]:
            print(f"  {name:12s} {spread(xs)}")


if __name__ == "__main__":
    main(sys.argv[1])
