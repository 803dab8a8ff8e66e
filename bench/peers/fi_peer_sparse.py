#!/usr/bin/env python3
"""FlashInfer 0.7's BlockSparseAttentionWrapper as a peer on B1 / B2 (python/flashkv/bench/
sparse_workloads.py draws the patterns, the same bits as flashkv's benchmarks): 32k x 32k, GQA
32/8, d128, f16, causal. It needs flashinfer-python 0.7 importable with its JIT toolchain
(nvcc, ninja), as the flashinfer peers of flashkv.bench.peers do (docs/benchmarks.md):

    python3 bench/peers/fi_peer_sparse.py --out fi_sparse.json

It writes rows in the result schema of docs/benchmarks.md (system "flashinfer-0.7 block-sparse";
default --out: $OUT/fi_peer.json). FlashInfer applies `causal` inside each block row's gathered
keys; for these patterns (R == C, each row's columns ascending with its diagonal block last) that
is the positional causal mask flashkv applies, and each row is checked against a float32
reference of the positional mask. B3 / B4 (selections per KV head) are not run: FlashInfer's
decode takes a contiguous cache, not the one-head view flashkv's head_pages() gives.
Timing: CUDA events around run(), median of --reps after 3 warm-ups (plan excluded).
"""
import argparse
import importlib.util
import json
import math
import os
import time

import torch
import torch.nn.functional as F


def load_workloads():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "python", "flashkv", "bench", "sparse_workloads.py")
    spec = importlib.util.spec_from_file_location("sparse_workloads", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def time_us(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    us = sorted(s.elapsed_time(e) * 1e3 for s, e in ev)
    return us[len(us) // 2], us[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "fi_peer.json"))
    ap.add_argument("--reps", type=int, default=20)
    args, _ = ap.parse_known_args()
    import flashinfer

    SW = load_workloads()
    rows, failures = [], []
    for w in (SW.B1, SW.B2):
        n, blk, hq, hkv, d = w.n, w.block, SW.HQ, SW.HKV, SW.HEAD_DIM
        indptr, indices = SW.bsr_pattern(w)
        mb = w.blocks_per_side
        flops = 4.0 * d * hq * SW.causal_pairs(w, indptr, indices)
        g = torch.Generator(device="cuda").manual_seed(w.seed)
        q, k, v = (torch.empty(s, dtype=torch.float16, device="cuda").uniform_(-1, 1, generator=g)
                   for s in ((n, hq, d), (n, hkv, d), (n, hkv, d)))
        try:
            ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
            wr = flashinfer.sparse.BlockSparseAttentionWrapper(ws)
            t0 = time.time()
            wr.plan(torch.tensor(indptr, dtype=torch.int32, device="cuda"),
                    torch.tensor(indices, dtype=torch.int32, device="cuda"), n, n, blk, blk, hq,
                    hkv, d, causal=True, q_data_type=torch.float16)
            o = wr.run(q, k, v)
            torch.cuda.synchronize()
            print(f"{w.id}: plan + first run (JIT) {time.time() - t0:.1f} s", flush=True)
            med, mn = time_us(lambda: wr.run(q, k, v), args.reps)
        except Exception as e:  # noqa: BLE001  (a peer that cannot run is a result)
            failures.append(dict(workload=w.id, shape="gqa-32-8", dtype="f16",
                                 system="flashinfer-0.7 block-sparse",
                                 error=f"{type(e).__name__}: {str(e)[:400]}"))
            print(f"{w.id}: FAILED {failures[-1]['error'][:300]}", flush=True)
            continue
        # The check: sampled rows against float32 attention under the positional mask.
        blocks = torch.zeros(mb, mb, dtype=torch.bool)
        for i in range(mb):
            blocks[i, indices[indptr[i]:indptr[i + 1]]] = True
        st = torch.tensor(sorted({0, blk - 1, n // 2 + 5, 7 * n // 9, n - 1}))
        keys = torch.arange(n)
        vis = (blocks[st // blk][:, keys // blk] & (keys[None, :] <= st[:, None])).cuda()
        qs = q[st.cuda()].float().transpose(0, 1)
        kx = k.float().repeat_interleave(hq // hkv, 1).transpose(0, 1)
        vx = v.float().repeat_interleave(hq // hkv, 1).transpose(0, 1)
        ref = F.scaled_dot_product_attention(qs, kx, vx, attn_mask=vis).transpose(0, 1)
        got = o[st.cuda()].float()
        err = (torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref)).item()
        rows.append(dict(workload=w.id, kind="sparse", shape="gqa-32-8", dtype="f16",
                         system="flashinfer-0.7 block-sparse", time_us=med, min_us=mn,
                         reps=args.reps, tflops=flops / (med * 1e-6) / 1e12, tbps=None,
                         flops=flops, rel_err=err if math.isfinite(err) else None,
                         notes="flashinfer.sparse.BlockSparseAttentionWrapper, causal, backend "
                               "auto; contiguous K/V as pages of C tokens"))
        print(f"{w.id}: {med:.1f} us, {rows[-1]['tflops']:.1f} TFLOP/s, rel_err {err:.2e}",
              flush=True)
        del wr, ws, q, k, v, o, kx, vx
        torch.cuda.empty_cache()
    doc = dict(gpu=torch.cuda.get_device_name(0), flashinfer=flashinfer.__version__,
               date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), results=rows,
               failures=failures)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
