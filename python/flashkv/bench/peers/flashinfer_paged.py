"""FlashInfer (flashinfer-python 0.7) as a peer on a paged KV cache, as flashkv reads one.

Systems (NHD, page size 16, separate K and V caches, pages in a seeded random order):
  decode        BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=False, backend="fa2")
  decode-tc     BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True, backend="fa2")
  prefill-fa2   BatchPrefillWithPagedKVCacheWrapper(backend="fa2"), causal
  prefill-fa3   BatchPrefillWithPagedKVCacheWrapper(backend="fa3"), causal (Hopper)
plan() is outside the timing (its first call loads or JIT-compiles FlashInfer's module: that
needs FlashInfer's own toolchain, nvcc and ninja, on the machine); run() into a preallocated
output is timed, its split-KV merge included. With an fp8 cache (kv_dtype "e4m3") K and V are
rounded through e4m3 before the reference is computed, so rel_err measures the kernel and not
the quantization; plan() gets kv_data_type and run() k_scale = v_scale = 1.
"""

import random
import time

from .batch import HEAD_DIM, rel_err

PAGE_SIZE = 16
WORKSPACE_BYTES = 512 << 20
WRAPPER_OPTIONS = {
    "decode": dict(use_tensor_cores=False, backend="fa2"),
    "decode-tc": dict(use_tensor_cores=True, backend="fa2"),
    "prefill-fa2": dict(backend="fa2"),
    "prefill-fa3": dict(backend="fa3"),
}


def import_flashinfer():
    """The flashinfer module, or an ImportError that says what the peer needs."""
    try:
        import flashinfer
    except ImportError as e:
        raise ImportError(
            f"the FlashInfer peers need flashinfer-python 0.7 importable ({e})") from e
    return flashinfer


class PagedCache:
    """A batch's packed K and V scattered into pages [P, 16, Hkv, d] in a random page order;
    slots past a request's last token stay zero."""

    def __init__(self, torch, b, seed, dtype):
        pages_per_request = [(n + PAGE_SIZE - 1) // PAGE_SIZE for n in b.kv_lens]
        total = sum(pages_per_request)
        order = list(range(total))
        random.Random(seed).shuffle(order)
        hkv = b.num_kv_heads
        k = torch.zeros(total, PAGE_SIZE, hkv, HEAD_DIM, device="cuda", dtype=b.k.dtype)
        v = torch.zeros_like(k)
        k_slots, v_slots = k.view(-1, hkv, HEAD_DIM), v.view(-1, hkv, HEAD_DIM)
        indptr, indices, last = [0], [], []
        token, first_page = 0, 0
        for n, p in zip(b.kv_lens, pages_per_request):
            pages = order[first_page:first_page + p]
            first_page += p
            # token t of the request lives in row t % 16 of its page t // 16
            slot = (torch.tensor(pages, device="cuda")[:, None] * PAGE_SIZE
                    + torch.arange(PAGE_SIZE, device="cuda")[None, :]).reshape(-1)[:n]
            k_slots[slot] = b.k[token:token + n]
            v_slots[slot] = b.v[token:token + n]
            token += n
            indices += pages
            indptr.append(len(indices))
            last.append(n - (p - 1) * PAGE_SIZE)
        i32 = dict(device="cuda", dtype=torch.int32)
        self.k, self.v = k.to(dtype), v.to(dtype)
        self.indptr = torch.tensor(indptr, **i32)
        self.indices = torch.tensor(indices, **i32)
        self.last_page_len = torch.tensor(last, **i32)


def run(torch, b, timer, system, seed, kv_dtype=None):
    """One row of FlashInfer `system` (a WRAPPER_OPTIONS key) on batch b."""
    flashinfer = import_flashinfer()
    opts = WRAPPER_OPTIONS[system]
    f16 = torch.float16
    kv_torch = torch.float8_e4m3fn if kv_dtype == "e4m3" else f16
    cache = PagedCache(torch, b, seed, kv_torch)
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    hq, hkv = b.num_qo_heads, b.num_kv_heads
    t0 = time.time()
    if b.kind == "decode":
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", **opts)
        w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hkv, HEAD_DIM, PAGE_SIZE,
               q_data_type=f16, kv_data_type=kv_torch)
    else:
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", **opts)
        qo_indptr = torch.tensor(b.cu_q, device="cuda", dtype=torch.int32)
        w.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, hq, hkv, HEAD_DIM,
               PAGE_SIZE, causal=True, q_data_type=f16, kv_data_type=kv_torch)
    torch.cuda.synchronize()
    plan_ms = (time.time() - t0) * 1e3
    out = torch.empty_like(b.q)
    scales = dict(k_scale=1.0, v_scale=1.0) if kv_dtype else {}

    def call():
        return w.run(b.q, (cache.k, cache.v), out=out, **scales)

    t0 = time.time()
    call()
    torch.cuda.synchronize()
    first_run_ms = (time.time() - t0) * 1e3
    err = rel_err(torch, b, out)
    nonfinite = int((~torch.isfinite(out)).sum().item())
    timing = timer.measure(call)
    wrapper = "BatchDecode" if b.kind == "decode" else "BatchPrefill"
    notes = (f"paged NHD page_size {PAGE_SIZE}, separate K/V caches, random page order; wrapper "
             f"{wrapper}(" + ", ".join(f"{k}={v!r}" for k, v in opts.items()) + ")"
             + (", causal=True" if b.causal else "")
             + (f"; KV {kv_dtype} (k_scale = v_scale = 1.0)" if kv_dtype else "")
             + f"; plan {plan_ms:.1f} ms (untimed, first call incl. module load); first run "
               f"{first_run_ms:.1f} ms")
    backend = getattr(w, "resolved_backend", None)
    if backend is not None:
        notes += f"; resolved_backend={backend}"
    return dict(**timing, rel_err=err, nonfinite_outputs=nonfinite,
                plan=dict(plan_ms=plan_ms, first_run_ms=first_run_ms), notes=notes,
                flashinfer=getattr(flashinfer, "__version__", None))
