#!/usr/bin/env python3
"""FlashInfer 0.7 with an fp8 (e4m3) KV cache as a peer: the shared peer script
(../shared/bench/flashinfer_peer/fi_peer_bench.py, copied to .peers/ as its README says) with its
systems, JIT modules, data and byte counts switched to fp8 KV; same timing method and JSON schema,
rows tagged "kv_dtype": "e4m3".

    sed 's#"$HERE/fi_peer_bench.py"#bench/peers/fi_peer_fp8.py --peers .peers#' \
        .peers/flashinfer_peer/run_fi_peer.sh > /tmp/run_fi_fp8.sh      # the shared runner's setup
    FI_WHEELS=.whl bash /tmp/run_fi_fp8.sh --workloads D1,P4 --shapes gqa-32-8

(it writes $OUT/fi_peer.json and fi_peer.log, as the shared runner does). Systems (queries and outputs f16, KV e4m3 with k_scale = v_scale = 1, head_dim 128, page
16, NHD, random page order):
  flashinfer-0.7-e4m3 decode       BatchDecode(use_tensor_cores=False, backend="fa2")
  flashinfer-0.7-e4m3 decode-tc    BatchDecode(use_tensor_cores=True,  backend="fa2")
  flashinfer-0.7-e4m3 prefill-fa2  BatchPrefill(backend="fa2"), causal
  flashinfer-0.7-e4m3 prefill-fa3  BatchPrefill(backend="fa3"), causal (FlashInfer 0.7.2's FA3 module
                                   does not build for f16 queries over an fp8 cache: every row of it
                                   fails at JIT; `--systems decode,decode-tc,prefill-fa2` skips it)
(The 2026-12-02 results, bench/results/fp8-run-flashinfer-*, name them "flashinfer-0.7 <system> e4m3".)
The reference is fp32 math attention on the dequantized (fp8-rounded) keys and values, so rel_err
measures the kernel, not the quantization.
"""
import argparse
import os
import sys


def main():
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--peers", default=".peers")
    a, rest = ap.parse_known_args()
    sys.path.insert(0, os.path.join(os.path.abspath(a.peers), "flashinfer_peer"))
    sys.path.insert(0, os.path.abspath(a.peers))
    import fi_peer_bench as fb  # noqa: E402
    import peers_torch as pt  # noqa: E402
    import torch  # noqa: E402

    e4m3 = torch.float8_e4m3fn
    # "<name> <system>": the shared script's --systems filter matches the part after the space.
    fb.SYSTEMS = {
        "flashinfer-0.7-e4m3 decode": ("decode", "decode", dict(use_tensor_cores=False, backend="fa2")),
        "flashinfer-0.7-e4m3 decode-tc": ("decode", "fa2", dict(use_tensor_cores=True, backend="fa2")),
        "flashinfer-0.7-e4m3 prefill-fa2": ("prefill", "fa2", dict(backend="fa2")),
        "flashinfer-0.7-e4m3 prefill-fa3": ("prefill", "fa3", dict(backend="fa3")),
    }
    fb.PRIORITY = ["flashinfer-0.7-e4m3 decode-tc", "flashinfer-0.7-e4m3 prefill-fa2",
                   "flashinfer-0.7-e4m3 decode", "flashinfer-0.7-e4m3 prefill-fa3"]

    class Jit(fb.Jit):
        """The same background builds, of the fp8-KV specs the wrappers request."""

        def __init__(self, torch_mod, keys):
            from flashinfer.jit.attention import modules as m
            f16, i32, d = torch_mod.float16, torch_mod.int32, pt.HEAD_DIM
            args = (f16, e4m3, f16, i32, d, d, 0, False, False, False)
            orig = (m.gen_batch_prefill_module, m._gen_batch_prefill_primary_module,
                    m.gen_batch_decode_module)
            m.gen_batch_prefill_module = lambda backend, *_: orig[0](backend, *args)
            m._gen_batch_prefill_primary_module = lambda backend, *_: orig[1](backend, *args)
            m.gen_batch_decode_module = lambda *_: orig[2](f16, e4m3, f16, i32, d, d, 0, False, False)
            try:
                super().__init__(torch_mod, keys)
            finally:
                (m.gen_batch_prefill_module, m._gen_batch_prefill_primary_module,
                 m.gen_batch_decode_module) = orig

    fb.Jit = Jit

    make_data = pt.make_data

    def make_data_fp8(torch_mod, kind, lens, hq, hkv, seed):
        # K and V rounded through e4m3: the reference then sees exactly what the cache holds.
        q, k, v, cu_q, cu_k, rows = make_data(torch_mod, kind, lens, hq, hkv, seed)
        return q, k.to(e4m3).to(torch_mod.float16), v.to(e4m3).to(torch_mod.float16), cu_q, cu_k, rows

    pt.make_data = make_data_fp8

    paged = fb.paged

    def paged_fp8(torch_mod, k, v, lens, seed):
        kc, vc, indptr, indices, last = paged(torch_mod, k, v, lens, seed)
        return kc.to(e4m3), vc.to(e4m3), indptr, indices, last

    fb.paged = paged_fp8

    counts = pt.counts

    def counts_fp8(kind, lens, hq, hkv):  # K and V at one byte per element
        nbytes, flops = counts(kind, lens, hq, hkv)
        return nbytes - sum(lens) * hkv * pt.HEAD_DIM * 2, flops

    pt.counts = counts_fp8

    run_row = fb.run_row

    def run_row_fp8(torch_mod, flashinfer, bench, system, kind, lens, hq, hkv, data, ws):
        # plan() with kv_data_type e4m3 and run() with k_scale / v_scale, as FlashInfer documents.
        cls_d, cls_p = flashinfer.BatchDecodeWithPagedKVCacheWrapper, flashinfer.BatchPrefillWithPagedKVCacheWrapper
        plan_d, plan_p, run_d, run_p = cls_d.plan, cls_p.plan, cls_d.run, cls_p.run

        def with_kv_fp8(plan):
            def f(self, *args, **kw):
                kw["kv_data_type"] = e4m3
                return plan(self, *args, **kw)
            return f

        def with_scales(run):
            def f(self, *args, **kw):
                kw.setdefault("k_scale", 1.0)
                kw.setdefault("v_scale", 1.0)
                return run(self, *args, **kw)
            return f

        cls_d.plan, cls_p.plan = with_kv_fp8(plan_d), with_kv_fp8(plan_p)
        cls_d.run, cls_p.run = with_scales(run_d), with_scales(run_p)
        try:
            r = run_row(torch_mod, flashinfer, bench, system, kind, lens, hq, hkv, data, ws)
        finally:
            cls_d.plan, cls_p.plan, cls_d.run, cls_p.run = plan_d, plan_p, run_d, run_p
        r["notes"] = "KV e4m3 (k_scale = v_scale = 1.0); " + r["notes"]
        return r

    fb.run_row = run_row_fp8

    sys.argv = [sys.argv[0]] + rest
    rc = fb.main()
    # Tag the rows: the shared script writes dtype "f16" (the queries').
    out = next((rest[i + 1] for i, x in enumerate(rest[:-1]) if x == "--out"), None)
    if out and os.path.exists(out):
        import json
        with open(out) as f:
            res = json.load(f)
        for row in res.get("results", []):
            row["kv_dtype"] = "e4m3"
        res["source"] = "bench/peers/fi_peer_fp8.py over " + str(res.get("source"))
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
