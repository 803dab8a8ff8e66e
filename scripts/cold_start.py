"""Cold start of Llama-3.1-8B's attention kernels, with and without `python -m flashkv.precompile`
(GPU machine, PyTorch; flashkv installed or on PYTHONPATH):
    python3 scripts/cold_start.py [--json FILE]
Llama-3.1-8B: head_dim 128, 32 query / 8 KV heads (group 4), page size 16. A "first requests"
child process plans and runs decode (8 requests of 1000 tokens) and causal prefill (2 requests
of 512 tokens) in f16 and bf16 and reports the seconds from the first plan() to the last result
(imports excluded). It runs twice, each with a fresh kernel cache ($FLASHKV_CACHE_DIR):
  cold:         nothing cached, so it pays every NVRTC compile;
  precompiled:  after `python -m flashkv.precompile` for these shapes (its time is reported too).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

FIRST_REQUESTS = r"""
import time, torch, flashkv
hq, hk, d, ps = 32, 8, 128, 16
dev = "cuda"
ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
torch.cuda.synchronize()
t0 = time.monotonic()
for dtype in (torch.float16, torch.bfloat16):
    # decode: 8 requests of 1000 tokens
    lens = [1000] * 8
    pages = [(n + ps - 1) // ps for n in lens]
    indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0)), dtype=torch.int32)
    indices = torch.arange(int(indptr[-1]), dtype=torch.int32)
    last = torch.tensor([(n - 1) % ps + 1 for n in lens], dtype=torch.int32)
    k = torch.randn(int(indptr[-1]), ps, hk, d, dtype=dtype, device=dev)
    v = torch.randn_like(k)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(indptr, indices, last, hq, hk, d, ps, q_data_type=dtype)
    w.run(torch.randn(len(lens), hq, d, dtype=dtype, device=dev), (k, v))
    # prefill: 2 causal requests of 512 tokens
    lens = [512, 512]
    pages = [(n + ps - 1) // ps for n in lens]
    indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0)), dtype=torch.int32)
    indices = torch.arange(int(indptr[-1]), dtype=torch.int32)
    last = torch.tensor([(n - 1) % ps + 1 for n in lens], dtype=torch.int32)
    qo_indptr = torch.tensor([0, 512, 1024], dtype=torch.int32)
    k = torch.randn(int(indptr[-1]), ps, hk, d, dtype=dtype, device=dev)
    v = torch.randn_like(k)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(qo_indptr, indptr, indices, last, hq, hk, d, ps, causal=True, q_data_type=dtype)
    w.run(torch.randn(1024, hq, d, dtype=dtype, device=dev), (k, v))
torch.cuda.synchronize()
print("FIRST_REQUESTS_S", time.monotonic() - t0)
"""

PRECOMPILE = ["-m", "flashkv.precompile", "--ops", "decode", "prefill", "--head-dims", "128",
              "--group-sizes", "4", "--page-sizes", "16", "--dtypes", "f16", "bf16"]


def first_requests(env):
    r = subprocess.run([sys.executable, "-c", FIRST_REQUESTS], env=env, capture_output=True,
                       text=True, check=True)
    return float(r.stdout.split("FIRST_REQUESTS_S")[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    a = p.parse_args()
    out = {"model": "Llama-3.1-8B", "head_dim": 128, "group": 4, "page_size": 16,
           "dtypes": ["f16", "bf16"]}
    with tempfile.TemporaryDirectory() as cold, tempfile.TemporaryDirectory() as warm:
        env = dict(os.environ, FLASHKV_CACHE_DIR=cold)
        out["cold_first_requests_s"] = first_requests(env)
        env = dict(os.environ, FLASHKV_CACHE_DIR=warm)
        t0 = time.monotonic()
        subprocess.run([sys.executable] + PRECOMPILE, env=env, check=True)
        out["precompile_s"] = time.monotonic() - t0
        out["precompiled_first_requests_s"] = first_requests(env)
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
