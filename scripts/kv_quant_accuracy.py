#!/usr/bin/env python3
"""The accuracy table of issue 42: each quantized KV format's error against fp16 attention, on keys
with outlier channels (a few channels 10-50x larger, as real models have), computed on the CPU
through flashkv's Python host path (the CPU reference dequantizes every format exactly, so the
error is the quantization's alone).

    PYTHONPATH=python:build/python build/pyenv/bin/python scripts/kv_quant_accuracy.py \\
        --out-dir bench/results            # -> kv-quant-accuracy-<date>.{md,json}

Data (seeded): batch decode, B requests of L tokens, H_qo / H_kv heads of head_dim D, pages of 16.
Keys N(0, 1) with C outlier channels per KV head scaled by 10-50 (drawn per channel) and a few
outlier tokens (the first token of each request, as attention sinks are, and 0.5 % of the rest)
scaled by 8; values and queries N(0, 1). Everything is rounded to fp16 first: the baseline is
decode attention over the fp16 cache. Each format quantizes the fp16 keys and values:

* e4m3 / e5m2 per-tensor: one scale per tensor, absmax / max code (the best per-tensor scale:
  nothing clips); the "scale 1" rows are an uncalibrated cache (k_scale = 1, vLLM's default),
  where outliers saturate;
* per-head: one scale per KV head (absmax of that head);
* per-token-head: one f32 scale per (token, KV head) (flashkv.quantize_kv);
* int4-g32 / g64 / g128: asymmetric, f16 scale and offset per group; nvfp4: e4m3 per-16 scales and
  the per-tensor f32 scale.

Columns: bits per element read (values + scales), bytes against fp16, the keys' relative L2 error,
the decode output's relative L2 error and largest absolute error against the fp16 baseline.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

import numpy as np

try:
    import ml_dtypes
except ImportError:
    sys.exit("kv_quant_accuracy: needs ml_dtypes (NumPy float8 arrays): pip install ml_dtypes")

import flashkv
from flashkv import _C
from flashkv import _array_core as A

PAGE = 16
FP8 = {"e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "e5m2": (ml_dtypes.float8_e5m2, 57344.0)}


def make_data(args, rng):
    """fp16 q [B, H_qo, D] and paged k, v [pages, PAGE, H_kv, D] (NHD), pages in order."""
    tokens = args.batch * args.kv_len
    k = rng.standard_normal((tokens, args.kv_heads, args.head_dim))
    chan = np.ones((args.kv_heads, args.head_dim))
    for h in range(args.kv_heads):
        idx = rng.choice(args.head_dim, args.outlier_channels, replace=False)
        chan[h, idx] = rng.uniform(10.0, 50.0, args.outlier_channels)
    tok = np.ones(tokens)
    if args.outlier_tokens:
        tok[rng.random(tokens) < 0.005] = 8.0
        tok[:: args.kv_len] = 8.0  # each request's first token
    k = k * chan[None] * tok[:, None, None]
    v = rng.standard_normal((tokens, args.kv_heads, args.head_dim))
    q = rng.standard_normal((args.batch, args.q_heads, args.head_dim))
    pages = tokens // PAGE
    shape = (pages, PAGE, args.kv_heads, args.head_dim)
    return (q.astype(np.float16), k.reshape(shape).astype(np.float16),
            v.reshape(shape).astype(np.float16))


def page_table(args):
    per = args.kv_len // PAGE
    indptr = (np.arange(args.batch + 1) * per).astype(np.int32)
    indices = np.arange(args.batch * per, dtype=np.int32)
    last = np.full(args.batch, PAGE, np.int32)
    return indptr, indices, last


def decode(args, q, k, v, **scales):
    """Batch decode on the CPU reference (flashkv._C, the host path's op) with an f32 output, so
    the output's own rounding stays far below every format's error. `scales`: _C's keyword
    arguments (k_scale / k_scale_tensor, kv_format, k_group_scale, ...)."""
    indptr, indices, last = page_table(args)
    out = np.empty(q.shape, np.float32)
    A.call(_C.reference_batch_decode, q, k, v, "NHD", indptr, indices, last, out, None, 0.0,
           **scales)
    return out


def fp8_cast(x, dtype, scale):
    """x / scale rounded to nearest even and saturated, as flashkv's quantizing append does."""
    t, mx = FP8[dtype]
    return np.clip(x.astype(np.float32) / scale, -mx, mx).astype(t)


def fp8_coarse(kind, dtype, k, v):
    """A per-tensor ("tensor", "unit") or per-head fp8 cache: (k8, v8, _C scale kwargs, the
    dequantized keys)."""
    _, mx = FP8[dtype]
    out = []
    for x in (k, v):
        x32 = x.astype(np.float32)
        if kind == "unit":
            s = np.float32(1.0)
        elif kind == "tensor":
            s = np.float32(np.abs(x32).max() / mx)
        else:  # per KV head
            s = (np.abs(x32).max(axis=(0, 1, 3)) / mx).astype(np.float32)
        x8 = fp8_cast(x32, dtype, s if np.ndim(s) == 0 else s[None, None, :, None])
        deq = x8.astype(np.float32) * (s if np.ndim(s) == 0 else s[None, None, :, None])
        out.append((x8, s, deq))
    (k8, ks, kd), (v8, vs, vd) = out
    if np.ndim(ks) == 0:
        scales = dict(k_scale=float(ks), v_scale=float(vs))
    else:
        scales = dict(k_scale_tensor=ks, v_scale_tensor=vs)
    return k8, v8, scales, kd


def bits_per_element(fmt, head_dim):
    if fmt in ("e4m3", "e5m2"):
        return 8.0  # a per-tensor / per-head scale is a few bytes per layer
    if fmt.endswith("per-token"):
        return 8.0 + 32.0 / head_dim
    if fmt == "nvfp4":
        return 4.0 + 8.0 / 16
    group = int(fmt.split("-g")[1])
    return 4.0 + 2 * 16.0 / group  # f16 scale + f16 offset per group


def rel(a, b):
    return float(np.linalg.norm((a - b).ravel()) / np.linalg.norm(b.ravel()))


def run(args):
    rng = np.random.default_rng(args.seed)
    q, k, v = make_data(args, rng)
    base = decode(args, q, k, v)  # fp16 cache, attention in double
    k32 = k.astype(np.float32)
    rows = []

    def add(name, fmt, kd, out, note=""):
        bits = bits_per_element(fmt, args.head_dim)
        rows.append(dict(format=name, bits_per_element=bits, bytes_vs_fp16=bits / 16.0,
                         key_rel_err=rel(kd, k32), out_rel_err=rel(out, base),
                         out_max_abs_err=float(np.abs(out - base).max()), note=note))

    for dtype in ("e4m3", "e5m2"):
        for kind, label in (("unit", f"{dtype} scale 1 (uncalibrated)"),
                            ("tensor", f"{dtype} per-tensor"), ("head", f"{dtype} per-head")):
            k8, v8, scales, kd = fp8_coarse(kind, dtype, k, v)
            out = decode(args, q, k8, v8, **scales)
            add(label, dtype, kd, out, "absmax scale" if kind != "unit" else "outliers clip")
        fmt = f"{dtype}-per-token"
        qk, qv = flashkv.quantize_kv(k, fmt), flashkv.quantize_kv(v, fmt)
        kd = flashkv.dequantize_kv(qk.values, qk.scales, None, fmt)
        out = decode(args, q, qk.values, qv.values, kv_format=fmt, k_group_scale=qk.scales,
                     v_group_scale=qv.scales)
        add(f"{dtype} per-token-head", fmt, kd, out, "f32 scale per (token, head)")
    for fmt in ("int4-g32", "int4-g64", "int4-g128", "nvfp4"):
        sdt = None if fmt == "nvfp4" else "f16"
        qk = flashkv.quantize_kv(k, fmt, scale_dtype=sdt)
        qv = flashkv.quantize_kv(v, fmt, scale_dtype=sdt)
        kd = flashkv.dequantize_kv(qk.values, qk.scales, qk.zeros, fmt, qk.tensor_scale)
        out = decode(args, q, qk.values, qv.values, kv_format=fmt, k_scale=qk.tensor_scale,
                     v_scale=qv.tensor_scale, k_group_scale=qk.scales, v_group_scale=qv.scales,
                     k_zero=qk.zeros, v_zero=qv.zeros)
        note = ("f16 scale + offset per group" if fmt != "nvfp4"
                else "e4m3 per-16 scale, f32 per-tensor scale")
        add(fmt, fmt, kd, out, note)
    return rows


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def markdown(args, rows, when, rev):
    lines = [
        f"## KV quantization accuracy (issue 42), "
        f"{'outlier channels and tokens' if args.outlier_tokens else 'outlier channels'}, "
        f"{when}, commit {rev}",
        "",
        f"scripts/kv_quant_accuracy.py --seed {args.seed} --outlier-tokens "
        f"{args.outlier_tokens}: batch decode, {args.batch} requests x {args.kv_len} tokens, "
        f"{args.q_heads}/{args.kv_heads} heads, head_dim {args.head_dim}, pages of {PAGE}; keys "
        f"N(0,1) with {args.outlier_channels} outlier channels per KV head (x10-50)"
        + (" and outlier tokens (each request's first, 0.5 % of the rest; x8)"
           if args.outlier_tokens else ", no outlier tokens")
        + "; values and queries N(0,1); all fp16. Error of the decode output against attention "
        "over the fp16 cache (CPU reference, double), keys and values both quantized.",
        "",
        "| format | bits / element | bytes vs fp16 | key rel. L2 err | output rel. L2 err | "
        "output max abs err | scales |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['format']} | {r['bits_per_element']:.2f} | {r['bytes_vs_fp16']:.3f} | "
                     f"{r['key_rel_err']:.2e} | {r['out_rel_err']:.2e} | "
                     f"{r['out_max_abs_err']:.2e} | {r['note']} |")
    by = {r["format"]: r for r in rows}
    lines.append("")
    for dtype in ("e4m3", "e5m2"):
        tok, ten = by[f"{dtype} per-token-head"], by[f"{dtype} per-tensor"]
        verdict = "beats" if tok["out_rel_err"] < ten["out_rel_err"] else "does NOT beat"
        lines.append(f"- {dtype} per-token-head {verdict} per-tensor on the outlier keys: output "
                     f"error {tok['out_rel_err']:.2e} vs {ten['out_rel_err']:.2e} "
                     f"({ten['out_rel_err'] / tok['out_rel_err']:.2f}x), against the uncalibrated "
                     f"scale-1 cache {by[f'{dtype} scale 1 (uncalibrated)']['out_rel_err']:.2e}.")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default=None, help="write kv-quant-accuracy-<date>.{md,json} here")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--kv-len", type=int, default=2048)
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--outlier-channels", type=int, default=4)
    p.add_argument("--outlier-tokens", type=int, choices=(0, 1), default=None,
                   help="1: also outlier tokens (x8); 0: outlier channels only; default: both "
                        "tables")
    args = p.parse_args()
    if args.kv_len % PAGE or args.kv_len <= 0:
        p.error(f"--kv-len: expected a positive multiple of {PAGE}, got {args.kv_len}")
    when = datetime.date.today().isoformat()
    rev = commit()
    tables, md = [], ""
    for outliers in ((0, 1) if args.outlier_tokens is None else (args.outlier_tokens,)):
        a = argparse.Namespace(**dict(vars(args), outlier_tokens=outliers))
        rows = run(a)
        tables.append(dict(config=vars(a), rows=rows))
        md += markdown(a, rows, when, rev) + "\n"
    sys.stdout.write(md)
    if args.out_dir:
        stem = os.path.join(args.out_dir, f"kv-quant-accuracy-{when}")
        with open(stem + ".md", "w") as f:
            f.write(md)
        with open(stem + ".json", "w") as f:
            json.dump(dict(date=when, commit=rev, tables=tables), f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
