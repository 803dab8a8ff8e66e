"""flashkv on the GPU through its Python API (the FlashInfer-shaped wrappers on torch CUDA
tensors), timed and checked the way docs/benchmarks.md asks, and the ceilings of the same process.

Timing: plan() once per configuration (outside the timing), then run() with CUDA events around
the call only: median (and min) of `reps` repetitions after 5 warm-ups; a GPU spin
(torch.cuda._sleep) before each start event hides the host's Python time, and the inputs (q and
the paged KV cache) rotate over copies that together span 200 MB, so the L2 does not flatter the
kernel (rotation_copies). Random uniform data in [-1, 1), never zeros; every copy uses one page
table with scattered pages.

Check: after timing, copy 0 is run again into an output filled with NaN, and sampled requests
(decode: the first, a third, two thirds, the last; prefill: those and the longest, on their first
two, two random and last four query rows) are compared with a float32 torch reference on the
gathered KV (SDPA, math backend, end-aligned causal mask): rel_err = ||out - ref|| / ||ref|| must
be at most min(2 * rel_err(ref rounded to the dtype) + u, 1e-2) (workloads.error_bound), else the
row is marked ref_ok false.
"""

import math
import random
import re
import time

import torch
import torch.nn.functional as F

import flashkv

from . import workloads as W

TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn,
                "e5m2": torch.float8_e5m2}
WORKSPACE_BYTES = 128 << 20  # FlashInfer's usual; grown when a plan asks for more
SPIN_CYCLES = 1_000_000  # >= ~0.5 ms on the GPU: longer than the host's time to launch run()


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def time_events(fn, reps, warmup=5, spin=True):
    """fn(rep) timed with CUDA events; returns dict(time_us (median), min_us, reps)."""
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if spin and hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(SPIN_CYCLES)
        start[i].record()
        fn(warmup + i)
        end[i].record()
    torch.cuda.synchronize()
    us = [s.elapsed_time(e) * 1e3 for s, e in zip(start, end)]
    return dict(time_us=median(us), min_us=min(us), reps=reps)


# --- ceilings ---


def own_ceilings():
    """Read: the fastest of two reductions over 4 GiB (bytes read); copy: copy_ of 2 GiB (read +
    written); GEMM: torch.mm 8192^3 on randn, f16 and bf16."""
    nbytes = 4 << 30
    buf = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_(-1, 1)
    read = 0.0
    for fn in (lambda: torch.sum(buf), lambda: torch.amax(buf.view(torch.int32))):
        t = time_events(lambda _: fn(), 20, warmup=3, spin=False)["time_us"]
        read = max(read, nbytes / (t * 1e-6) / 1e12)
    half = buf[: buf.numel() // 2]
    dst = torch.empty_like(half)
    t = time_events(lambda _: dst.copy_(half), 20, warmup=3, spin=False)["time_us"]
    copy = 2 * half.numel() * 4 / (t * 1e-6) / 1e12
    buf = half = dst = None  # freed before the GEMMs allocate
    gemm = {}
    n = 8192
    for name, dt in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        a = torch.randn(n, n, device="cuda", dtype=dt)
        b = torch.randn(n, n, device="cuda", dtype=dt)
        c = torch.empty(n, n, device="cuda", dtype=dt)
        t = time_events(lambda _: torch.mm(a, b, out=c), 30, warmup=5, spin=False)["time_us"]
        gemm[name] = 2 * n ** 3 / (t * 1e-6) / 1e12
        a = b = c = None
    torch.cuda.empty_cache()
    return dict(read_tbps=read, copy_tbps=copy, gemm_f16_tflops=gemm["f16"],
                gemm_bf16_tflops=gemm["bf16"],
                source="flashkv.bench: max(torch.sum f32, torch.amax i32) over 4 GiB; copy_ of "
                       "2 GiB (read + written); torch.mm 8192^3")


# --- data, plan, check ---


def uniform(shape, dt, g):
    return torch.empty(shape, dtype=dt, device="cuda").uniform_(-1, 1, generator=g)


def workspace():
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")


def planned(make, plan):
    """make(workspace) -> wrapper, planned by plan(wrapper); a larger workspace when the plan
    names the bytes it needs."""
    w = make(workspace())
    try:
        plan(w)
    except ValueError as e:
        need = re.search(r"needs (\d+) bytes", str(e))
        if not need:
            raise
        w = make(torch.empty(int(need.group(1)) + (1 << 20), dtype=torch.uint8, device="cuda"))
        plan(w)
    return w


class PagedInputs:
    """`copies` copies of q [rows, hq, d] and of a paged cache [pages, page, hkv, d] (k, v; in
    kv_dtype, default the q dtype: fp8 values are drawn in the q dtype and rounded, scale 1),
    sharing one scattered page table."""

    def __init__(self, w: W.Workload, hq, hkv, d, page, dtype, seed, kv_dtype=None):
        dt, kvt = TORCH_DTYPES[dtype], TORCH_DTYPES[kv_dtype or dtype]
        self.indptr, self.last = W.page_table(w.kv_lens, page)
        pages = self.indptr[-1]
        rows = sum(w.qo())
        per_copy = (pages * page * hkv * d * 2 * W.DTYPE_BYTES[kv_dtype or dtype]
                    + rows * hq * d * W.DTYPE_BYTES[dtype])
        self.copies = W.rotation_copies(per_copy)
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.q = [uniform((rows, hq, d), dt, g) for _ in range(self.copies)]
        self.k = [uniform((max(pages, 1), page, hkv, d), dt, g).to(kvt) for _ in range(self.copies)]
        self.v = [uniform((max(pages, 1), page, hkv, d), dt, g).to(kvt) for _ in range(self.copies)]
        perm = torch.randperm(max(pages, 1), generator=torch.Generator().manual_seed(seed))
        self.indices = perm[:pages].to(torch.int32).cuda()
        self.out = torch.empty((rows, hq, d), dtype=dt, device="cuda")
        self.qo_indptr = [0]
        for n in w.qo():
            self.qo_indptr.append(self.qo_indptr[-1] + n)

    def i32(self, xs):
        return torch.tensor(xs, dtype=torch.int32)

    def gather(self, r):
        """Request r's keys and values of copy 0, contiguous [kv_len, hkv, d]."""
        ids = self.indices[self.indptr[r]: self.indptr[r + 1]].long()
        n = (self.indptr[r + 1] - self.indptr[r] - 1) * self.k[0].shape[1] + self.last[r]

        def pages(x):  # fp8 pages gathered as bytes (torch indexes no float8 tensor)
            return x.view(torch.uint8)[ids].view(x.dtype) if x.element_size() == 1 else x[ids]

        k, v = pages(self.k[0]), pages(self.v[0])
        return k.reshape(-1, k.shape[2], k.shape[3])[:n], v.reshape(-1, v.shape[2], v.shape[3])[:n]


def reference(q, k, v, rows, kv_len, qo_len):
    """float32 attention of query rows `rows` (of qo_len) over k/v [kv_len, hkv, d], causal
    aligned to the end of the KV (decode: qo_len 1, every key). Returns [len(rows), hq, d]."""
    hq, hkv = q.shape[1], k.shape[1]
    qh = q.float().transpose(0, 1)  # [hq, n, d]
    kh = k.float().repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
    vh = v.float().repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
    r = torch.tensor(rows, device=q.device)
    visible = torch.arange(kv_len, device=q.device)[None, :] <= (kv_len - qo_len + r)[:, None]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.MATH]):
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=visible)
    except ImportError:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=visible)
    return out.transpose(0, 1)


def rel(a, b):
    den = torch.linalg.vector_norm(b).item()
    num = torch.linalg.vector_norm(a - b).item()
    return num / den if den > 0 else num


def check(inp: PagedInputs, w: W.Workload, dtype, seed):
    """(rel_err, bound, ok, rows checked) of inp.out (copy 0's output) on sampled requests."""
    B = w.batch
    reqs = {0, B // 3, (2 * B) // 3, B - 1}
    if w.kind == "prefill":
        reqs.add(max(range(B), key=lambda i: w.kv_lens[i]))
    rng = random.Random(seed)
    got, ref = [], []
    for r in sorted(reqs):
        qo, kv = w.qo()[r], w.kv_lens[r]
        rows = sorted({x for x in [0, 1, rng.randrange(qo), rng.randrange(qo)]
                       + list(range(qo - 4, qo)) if 0 <= x < qo})
        q = inp.q[0][[inp.qo_indptr[r] + x for x in rows]]
        k, v = inp.gather(r)
        ref.append(reference(q, k, v, rows, kv, qo))
        got.append(inp.out[[inp.qo_indptr[r] + x for x in rows]].float())
    got, ref = torch.cat(got), torch.cat(ref)
    lowp = ref.to(TORCH_DTYPES[dtype]).float()
    err = rel(got, ref) if torch.isfinite(got).all() else math.nan
    bound = W.error_bound(rel(lowp, ref), dtype)
    return err, bound, bool(err <= bound), int(got.shape[0])


def run_config(w: W.Workload, shape, dtype, page, d, reps, seed, kv_dtype=None):
    """One flashkv row (decode or prefill) of the results, in the schema's keys (pct_of_ceiling
    filled in later, with the ceilings). kv_dtype: an fp8 cache ("e4m3", "e5m2"; scale 1)."""
    hq, hkv = W.SHAPES[shape]
    dt = TORCH_DTYPES[dtype]
    kvt = TORCH_DTYPES[kv_dtype or dtype]
    inp = PagedInputs(w, hq, hkv, d, page, dtype, seed, kv_dtype)
    indptr, last = inp.i32(inp.indptr), inp.i32(inp.last)
    decode = w.kind == "decode"

    def plan(wr):
        t0 = time.perf_counter()
        if decode:
            wr.plan(indptr, inp.indices, last, hq, hkv, d, page, q_data_type=dt,
                    kv_data_type=kvt)
        else:
            wr.plan(inp.i32(inp.qo_indptr), indptr, inp.indices, last, hq, hkv, d, page,
                    causal=True, q_data_type=dt, kv_data_type=kvt)
        return (time.perf_counter() - t0) * 1e6

    cls = (flashkv.BatchDecodeWithPagedKVCacheWrapper if decode
           else flashkv.BatchPrefillWithPagedKVCacheWrapper)
    wrapper = planned(lambda ws: cls(ws, "NHD"), plan)
    plan_us = median([plan(wrapper) for _ in range(5)])  # after the first (and its JIT compile)
    info = wrapper.plan_info()
    c = inp.copies
    timing = time_events(lambda i: wrapper.run(inp.q[i % c], (inp.k[i % c], inp.v[i % c]),
                                               out=inp.out), reps)
    inp.out.fill_(math.nan)  # a row the kernel does not write fails the check
    wrapper.run(inp.q[0], (inp.k[0], inp.v[0]), out=inp.out)
    torch.cuda.synchronize()
    err, bound, ok, checked = check(inp, w, dtype, seed)
    row = dict(workload=w.id, kind=w.kind, shape=shape, dtype=dtype,
               kv_dtype=kv_dtype or dtype, system="flashkv",
               api="python", **timing, tbps=None, tflops=None, rel_err=err, rel_err_bound=bound,
               ref_ok=ok, ref_rows_checked=checked, batch=w.batch, sum_kv=sum(w.kv_lens),
               sum_qo=sum(w.qo()), copies_rotated=c, plan_py_us=plan_us,
               plan_info={k: v for k, v in info.items() if isinstance(v, (int, float, bool))})
    seconds = timing["time_us"] * 1e-6
    if decode:
        row["bytes"] = W.decode_bytes(w, hq, hkv, d, dtype, kv_dtype)
        row["tbps"] = row["bytes"] / seconds / 1e12
    else:
        row["flops"] = W.prefill_flops(w, hq, d)
        row["tflops"] = row["flops"] / seconds / 1e12
    inp = wrapper = None  # free the inputs before the next configuration allocates
    torch.cuda.empty_cache()
    return row
