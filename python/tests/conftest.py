"""Shared test helpers: float64 NumPy references written here (independent of flashkv's C++
reference) for attention and RoPE, random paged caches, and the frameworks the CPU tests run
under (NumPy always; PyTorch CPU tensors too where torch is installed)."""

import math
import os

import numpy as np
import pytest

import flashkv

LOG2E = 1.4426950408889634
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8}

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

FRAMEWORKS = ["numpy"] + (["torch"] if HAVE_TORCH else [])

# The GPU test modules (test_gpu*.py) set pytestmark = requires_gpu.
GPU = HAVE_TORCH and torch.cuda.is_available() and flashkv.cuda_available()
if not GPU and os.environ.get("FLASHKV_REQUIRE_GPU") == "1":  # scripts/gpu-test-python.sh
    raise RuntimeError("FLASHKV_REQUIRE_GPU=1, but PyTorch with CUDA and a CUDA GPU are missing")
requires_gpu = pytest.mark.skipif(not GPU, reason="needs PyTorch with CUDA and a CUDA GPU")


@pytest.fixture(params=FRAMEWORKS)
def fw(request):
    """The framework host arrays are handed over in ("numpy" or "torch" CPU tensors)."""
    return request.param


def to_fw(a, fw):
    if fw == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(a))
    return a


def to_np(x):
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().float().numpy() if x.dtype.is_floating_point else x.cpu().numpy()
    return np.asarray(x)


def rand(rng, shape, dtype):
    """Uniform [-1, 1) rounded to dtype (what the reference sees is exactly what flashkv sees)."""
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)


def attention_ref(q, k, v, causal=False, sm_scale=None):
    """Attention in float64. q [Lq, Hq, D]; k, v [Lk, Hk, D] (NHD); GQA: query head h reads kv
    head h // (Hq / Hk). Causal aligned to the end of the KV. Returns (out [Lq, Hq, D], natural-log
    lse [Lq, Hq]); rows that see no key: out 0, lse -inf."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    lq, hq, d = q.shape
    lk, hk = k.shape[0], k.shape[1]
    group = hq // hk
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    kk = np.repeat(k, group, axis=1)
    vv = np.repeat(v, group, axis=1)
    s = np.einsum("qhd,khd->qhk", q, kk) * scale
    if causal:
        visible = np.arange(lk)[None, :] <= (lk - lq) + np.arange(lq)[:, None]
        s = np.where(visible[:, None, :], s, -np.inf)
    m = s.max(axis=-1, initial=-np.inf)
    seen = np.isfinite(m)
    m0 = np.where(seen, m, 0.0)
    p = np.exp(s - m0[..., None])
    denom = p.sum(axis=-1)
    safe = np.where(seen, denom, 1.0)
    out = np.einsum("qhk,khd->qhd", p, vv) / safe[..., None]
    out[~seen] = 0.0
    lse = np.where(seen, m0 + np.log(safe), -np.inf)
    return out, lse


# --- RoPE (rope.h / FlashInfer conventions), float64 ---


def llama_freqs(rotary_dim, rope_scale=1.0, rope_theta=1e4):
    i = np.arange(rotary_dim // 2, dtype=np.float64)
    return rope_theta ** (-2.0 * i / rotary_dim) / rope_scale


def llama31_freqs(rotary_dim, rope_scale=8.0, rope_theta=5e5, low_freq_factor=1.0,
                  high_freq_factor=4.0, old_context_len=8192):
    """Meta's apply_scaling (llama3 reference code), band by band."""
    out = []
    low_wavelen = old_context_len / low_freq_factor
    high_wavelen = old_context_len / high_freq_factor
    for f in llama_freqs(rotary_dim, 1.0, rope_theta):
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / rope_scale)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (
                high_freq_factor - low_freq_factor)
            out.append((1 - smooth) * f / rope_scale + smooth * f)
    return np.array(out)


def rotate(x, cos, sin, interleave):
    """x [n, H, D]; cos/sin [n, R/2] (float64): the first R dims rotate, the rest are copied."""
    x = np.asarray(x, dtype=np.float64)
    r = 2 * cos.shape[1]
    out = x.copy()
    if interleave:
        i1, i2 = np.arange(0, r, 2), np.arange(1, r, 2)
    else:
        i1, i2 = np.arange(r // 2), np.arange(r // 2, r)
    x1, x2 = x[..., i1], x[..., i2]
    c, s = cos[:, None, :], sin[:, None, :]
    out[..., i1] = x1 * c - x2 * s
    out[..., i2] = x2 * c + x1 * s
    return out


def rope_ref(x, pos, freqs, interleave):
    ang = np.asarray(pos, dtype=np.float64)[:, None] * freqs[None, :]
    return rotate(x, np.cos(ang), np.sin(ang), interleave)


def tolerance(dtype):
    """Output rounded once to dtype by a double-precision backend."""
    return {"float16": dict(rtol=2e-3, atol=2e-3), "float32": dict(rtol=1e-5, atol=1e-6)}[
        np.dtype(dtype).name]


def assert_close(out, ref, dtype):
    np.testing.assert_allclose(to_np(out).astype(np.float64), ref, **tolerance(dtype))


def assert_lse2(lse2, lse_natural):
    """flashkv's wrappers return base-2 LSE (FlashInfer's convention)."""
    np.testing.assert_allclose(to_np(lse2).astype(np.float64), lse_natural * LOG2E, rtol=1e-5,
                               atol=1e-5)


class PagedCache:
    """A random paged KV cache with scattered pages: k/v [num_pages, page, Hk, D] (NHD) or
    [num_pages, Hk, page, D] (HND), as a (k, v) pair and as one interleaved [num_pages, 2, ...]
    array, with its page table."""

    def __init__(self, rng, kv_lens, page_size, num_kv_heads, head_dim, dtype, layout,
                 spare_pages=3):
        self.page_size, self.layout = page_size, layout
        pages = [(n + page_size - 1) // page_size for n in kv_lens]
        num_pages = sum(pages) + spare_pages
        self.indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        self.indices = rng.permutation(num_pages)[: sum(pages)].astype(np.int32)
        self.last_page_len = np.array(
            [n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, pages)], np.int32)
        inner = ((page_size, num_kv_heads, head_dim) if layout == "NHD"
                 else (num_kv_heads, page_size, head_dim))
        self.kv = rand(rng, (num_pages, 2) + inner, dtype)  # interleaved
        self.k, self.v = self.kv[:, 0].copy(), self.kv[:, 1].copy()
        self.kv_lens = list(kv_lens)

    def gather(self, i):
        """Request i's (k, v) as contiguous NHD [kv_len, Hk, D]."""
        ids = self.indices[self.indptr[i]: self.indptr[i + 1]]
        rows = []
        for cache in (self.k, self.v):
            c = cache if self.layout == "NHD" else cache.transpose(0, 2, 1, 3)
            rows.append(c[ids].reshape(-1, c.shape[2], c.shape[3])[: self.kv_lens[i]])
        return rows

    def cache(self, interleaved, fw):
        return to_fw(self.kv, fw) if interleaved else (to_fw(self.k, fw), to_fw(self.v, fw))
