"""One PNG per kind from a result document: grouped bars, one group per workload, one bar per
system (and dtype), one panel per head shape. Decode is drawn as % of the read ceiling, prefill
as % of the fp16 GEMM rate (both measured in the same run); without ceilings (the CPU mode) the
absolute TB/s or TFLOP/s. Each bar is labelled with its value; a flashkv bar that failed the
reference check is hatched and marked FAIL. matplotlib (Agg) is imported only here."""

import os

from . import report

WORKLOAD_ORDER = ["D1", "D2", "D3", "D4", "D5", "D6", "P1", "P2", "P3", "P4", "P5"]


def _series(rows):
    """(system, dtype) pairs: flashkv's first, then the peers, in a stable order."""
    dtype_order = {"f16": 0, "bf16": 1}
    return sorted({(r["system"], r["dtype"]) for r in rows},
                  key=lambda k: (0 if k[0].startswith("flashkv") else 1, k[0],
                                 dtype_order.get(k[1], 2), k[1]))


def _workloads(rows):
    """The standard ids in their order, then any others in the order they ran."""
    ids = list(dict.fromkeys(r["workload"] for r in rows))
    return [w for w in WORKLOAD_ORDER if w in ids] + [w for w in ids if w not in WORKLOAD_ORDER]


def _value(doc, row, kind):
    ceil, _, _ = report.ceiling_of(doc, kind)
    rate = row.get("tbps") if kind == "decode" else row.get("tflops")
    if rate is None:
        return None
    return 100 * rate / ceil if ceil else rate


def plot_kind(doc, kind, path):
    """Draws `kind`'s rows of doc into path (PNG); False when doc has none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["results"] if report.kind_of(r) == kind]
    if not rows:
        return False
    shapes = [s for s in ("gqa-32-8", "mha-32-32") if any(r["shape"] == s for r in rows)]
    shapes += sorted({r["shape"] for r in rows} - set(shapes))
    series = _series(rows)
    colors = {k: f"C{i % 10}" for i, k in enumerate(series)}
    ceil, ceil_name, unit = report.ceiling_of(doc, kind)
    ylabel = (f"% of the {ceil_name} ({ceil:{'.2f' if kind == 'decode' else '.0f'}} {unit})"
              if ceil else f"{unit} (no ceiling measured)")
    wls = _workloads(rows)
    width = max(7.0, 0.32 * len(wls) * len(series) + 2.5)
    fig, axes = plt.subplots(len(shapes), 1, figsize=(width, 4.2 * len(shapes)), squeeze=False)
    for ax, shape in zip(axes[:, 0], shapes):
        here = [k for k in series if any(r["shape"] == shape and (r["system"], r["dtype"]) == k
                                         for r in rows)]
        bar_w = 0.84 / max(1, len(here))
        top, labelled = 0.0, set()
        for j, key in enumerate(here):
            for x, wl in enumerate(wls):
                match = [r for r in rows if r["shape"] == shape and r["workload"] == wl
                         and (r["system"], r["dtype"]) == key]
                value = _value(doc, match[0], kind) if match else None
                if value is None:
                    continue
                failed = match[0].get("ref_ok") is False
                xpos = x - 0.42 + bar_w * (j + 0.5)
                ax.bar(xpos, value, width=bar_w, color=colors[key], edgecolor="black",
                       linewidth=0.4, hatch="//" if failed else None,
                       label=None if key in labelled else f"{key[0]} {key[1]}")
                labelled.add(key)
                label = f"{value:.0f}" if value >= 10 else f"{value:.2g}"
                ax.text(xpos, value, label + (" FAIL" if failed else ""), ha="center",
                        va="bottom", fontsize=7, rotation=90 if len(here) > 3 else 0,
                        color="red" if failed else "black")
                top = max(top, value)
        if ceil:
            ax.axhline(100, color="gray", linestyle="--", linewidth=0.8)
            top = max(top, 100)
        ax.set_ylim(0, top * 1.22 if top > 0 else 1)
        ax.set_xticks(range(len(wls)))
        ax.set_xticklabels(wls)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{kind}, {shape}")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    peers = any(not key[0].startswith("flashkv") for key in series)
    fig.suptitle(f"flashkv {doc.get('commit')} (Python API){' and torch peers' if peers else ''} "
                 f"on {doc.get('gpu') or 'the CPU reference'}, {doc.get('date')}"
                 + ("\npeers read padded or contiguous KV, flashkv a paged cache" if peers else ""),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_results(doc, out_dir):
    """decode.png and prefill.png (those with rows) in out_dir; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for kind in ("decode", "prefill"):
        path = os.path.join(out_dir, f"{kind}.png")
        if plot_kind(doc, kind, path):
            paths.append(path)
    return paths
