"""Fill flashkv's kernel cache before serving: ``python -m flashkv.precompile``.

The wheel's counterpart of the C++ CLI's ``flashkv precompile`` (same options and defaults): it
compiles the kernels of the shapes named into the disk cache (``$FLASHKV_CACHE_DIR``, default
``~/.cache/flashkv``), so a server's first requests find them instead of paying NVRTC compiles.
NVRTC compiles for a named architecture, so no GPU is needed. For one model, name its shapes;
Llama-3.1-8B (head_dim 128, 32 query / 8 KV heads, page size 16)::

    python -m flashkv.precompile --ops decode prefill --head-dims 128 --group-sizes 4 \\
        --page-sizes 16 --dtypes f16 bf16

``--list`` prints the kernel ids it would compile and compiles nothing.
"""

import argparse
import json
import os
import sys
import time

from . import _C


def parse_args(argv=None):
    d = _C.precompile_defaults()
    p = argparse.ArgumentParser(prog="python -m flashkv.precompile",
                                description="compile kernels into the disk cache "
                                            "($FLASHKV_CACHE_DIR); works without a GPU")
    p.add_argument("--list", action="store_true",
                   help="print the ids of the kernels it would compile, one a line, and "
                        "compile nothing")
    p.add_argument("--json", help="also write the compiled kernels and times as JSON")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                   help="kernels compiled at once (default: all cores)")
    p.add_argument("--arch", default=d["arch"], help=f"NVRTC target architecture ({d['arch']})")
    p.add_argument("--ops", nargs="+", default=d["ops"], choices=_C.precompile_ops(),
                   help="ops to compile (kv: RoPE, KV append)")
    p.add_argument("--dtypes", nargs="+", default=d["dtypes"], choices=["f16", "bf16"],
                   help="q/kv dtypes")
    p.add_argument("--kv-dtypes", nargs="+", default=d["kv_dtypes"],
                   choices=["f16", "bf16", "e4m3", "e5m2"],
                   help="the caches' dtypes (default: each q dtype's own)")
    p.add_argument("--head-dims", nargs="+", type=int, default=d["head_dims"])
    p.add_argument("--group-sizes", nargs="+", type=int, default=d["group_sizes"],
                   help="query heads per KV head")
    p.add_argument("--page-sizes", nargs="+", type=int, default=d["page_sizes"])
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    return args


def main(argv=None):
    a = parse_args(argv)
    shape = dict(arch=a.arch, ops=a.ops, dtypes=a.dtypes, kv_dtypes=a.kv_dtypes,
                 head_dims=a.head_dims, group_sizes=a.group_sizes, page_sizes=a.page_sizes)
    if a.list:
        print("\n".join(_C.precompile_kernel_ids(**shape)))
        return 0
    # The per-compile log lines would interleave across threads; the progress lines replace them.
    os.environ.setdefault("FLASHKV_QUIET", "1")
    print(f"precompiling for {a.arch} into {_C.kernel_cache_dir() or '(memory only)'}, "
          f"{a.jobs} at a time", flush=True)

    def progress(kernel, done, total):
        kid, compiled, ms = kernel
        print(f"[{done}/{total}] {kid:<48} {'compiled' if compiled else 'cached  '} "
              f"{ms / 1000:6.1f} s", flush=True)

    t0 = time.monotonic()
    try:
        kernels = _C.precompile(**shape, jobs=a.jobs, progress=progress)
    except (RuntimeError, ValueError) as e:  # no NVRTC, a compile error: the message says it all
        print(f"python -m flashkv.precompile: {e}", file=sys.stderr)
        return 1
    wall_s = time.monotonic() - t0
    cold = sum(compiled for _, compiled, _ in kernels)
    print(f"{cold} compiled, {len(kernels) - cold} cached, {wall_s:.1f} s "
          f"({sum(ms for *_, ms in kernels) / 1000:.1f} s of compiles, {a.jobs} at a time)")
    if a.json:
        rows = [{"kernel": k, "compiled": c, "ms": ms} for k, c, ms in kernels]
        with open(a.json, "w") as f:
            json.dump({"arch": a.arch, "jobs": a.jobs, "wall_s": wall_s, "kernels": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
