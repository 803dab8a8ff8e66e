"""Helpers of the GPU tests (test_gpu_*.py): CUDA torch tensors, torch's float32
scaled_dot_product_attention on the gathered KV as the reference, the tolerance checks, a random
paged cache on the GPU (Paged), cache copies and comparisons, and the unfused decode step that
run_step replaces. The GPU tests are skipped unless torch with CUDA and a GPU are present (run
them on a GPU machine: `scripts/gpu-test-python.sh`, or pytest python/tests/test_gpu_*.py with the
module built).

Tolerance (tests/common/test_util.h, STYLE.md): rel_err(out, ref) <= min(2 * rel_err(ref rounded
to the dtype, ref) + u, 1e-2), u the unit roundoff of the dtype P is rounded to (f16 2^-11,
bf16 2^-8); LSE relative error <= 1e-4, with -inf exactly where no key is visible.
"""

import math

import numpy as np

import flashkv

from conftest import LOG2E, UNIT_ROUNDOFF

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

MB = 1 << 20


def tdtype(name):
    return getattr(torch, name)


def workspace(mb=128):
    return torch.empty(mb * MB, dtype=torch.uint8, device="cuda")


def rand(shape, dtype, gen):
    return (torch.rand(shape, generator=gen, device="cuda") * 2 - 1).to(tdtype(dtype))


def gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def sdpa_ref(q, k, v, causal=False, sm_scale=None):
    """float32 reference: q [Lq, Hq, D], k/v [Lk, Hk, D] -> out [Lq, Hq, D], natural lse [Lq, Hq].
    Causal aligned to the end of the KV; rows that see no key: out 0, lse -inf."""
    lq, hq, d = q.shape
    lk, hk = k.shape[0], k.shape[1]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    if lk == 0:
        return (torch.zeros(lq, hq, d, device=q.device),
                torch.full((lq, hq), -math.inf, device=q.device))
    qh = q.float().transpose(0, 1)
    kh = k.float().repeat_interleave(hq // hk, dim=1).transpose(0, 1)
    vh = v.float().repeat_interleave(hq // hk, dim=1).transpose(0, 1)
    visible = None
    if causal:
        visible = (torch.arange(lk, device=q.device)[None, :]
                   <= (lk - lq) + torch.arange(lq, device=q.device)[:, None])
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=visible, scale=scale)
    scores = (qh @ kh.transpose(-1, -2)) * scale
    if visible is not None:
        scores = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(out), out)
    return out.transpose(0, 1), lse.transpose(0, 1)


def rel_err(a, b):
    a, b = a.double(), b.double()
    den = torch.linalg.norm(b)
    num = torch.linalg.norm(a - b)
    return float(num / den) if den > 0 else float(num)


def check_out(out, ref, dtype):
    assert not torch.isnan(out).any()
    err_lowp = rel_err(ref.to(tdtype(dtype)).float(), ref)
    bound = min(2 * err_lowp + UNIT_ROUNDOFF[dtype], 1e-2)
    err = rel_err(out.float(), ref)
    assert err <= bound, f"rel_err {err:.3g} > bound {bound:.3g}"


def check_lse(lse2, ref_lse):
    """lse2: flashkv's base-2 LSE; ref_lse natural."""
    ref2 = ref_lse.double() * LOG2E
    empty = torch.isinf(ref2)
    assert torch.equal(torch.isinf(lse2) & (lse2 < 0), empty)
    if (~empty).any():
        assert rel_err(lse2[~empty], ref2[~empty]) <= 1e-4


class Paged:
    """A random paged cache on the GPU (scattered pages), with its page table and gather()."""

    def __init__(self, kv_lens, page_size, hk, d, dtype, layout, g, spare=5):
        self.page_size, self.layout, self.kv_lens = page_size, layout, list(kv_lens)
        pages = [(n + page_size - 1) // page_size for n in kv_lens]
        num_pages = sum(pages) + spare
        self.indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32,
                                   device="cuda")
        perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(len(kv_lens)))
        self.indices = perm[: sum(pages)].to(torch.int32).cuda()
        self.last_page_len = torch.tensor(
            [n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, pages)],
            dtype=torch.int32, device="cuda")
        inner = (page_size, hk, d) if layout == "NHD" else (hk, page_size, d)
        self.kv = rand((num_pages, 2) + inner, dtype, g)
        self.k, self.v = self.kv[:, 0].contiguous(), self.kv[:, 1].contiguous()

    def gather(self, i):
        ids = self.indices[self.indptr[i]: self.indptr[i + 1]].long()
        out = []
        for c in (self.k, self.v):
            c = c if self.layout == "NHD" else c.transpose(1, 2)
            out.append(c[ids].reshape(-1, c.shape[2], c.shape[3])[: self.kv_lens[i]])
        return out

    def cache(self, interleaved):
        return self.kv if interleaved else (self.k, self.v)


DTYPES = ["float16", "bfloat16"]


def i32(values):
    return torch.tensor(values, dtype=torch.int32, device="cuda")


def clone_cache(c):
    return c.clone() if isinstance(c, torch.Tensor) else tuple(x.clone() for x in c)


def cpu_cache(c):
    return c.cpu() if isinstance(c, torch.Tensor) else tuple(x.cpu() for x in c)


def flat(c):
    """A cache's elements, k then v (or the interleaved kv), as one CPU vector."""
    parts = (c,) if isinstance(c, torch.Tensor) else c
    return torch.cat([x.reshape(-1).cpu() for x in parts])


def assert_caches_equal(a, b):
    for x, y in zip((a,) if isinstance(a, torch.Tensor) else a,
                    (b,) if isinstance(b, torch.Tensor) else b):
        assert torch.equal(x.cpu(), y.cpu())


def unfused_step(rope, q, k_new, v_new, cache, pos, append_pos, w, indices, indptr, last,
                 layout, cos_sin):
    """What run_step replaces: RoPE -> append_paged_kv_cache -> run."""
    if rope == "none":
        q_rot, k_rot = q, k_new
    elif rope == "llama":
        q_rot, k_rot = flashkv.apply_rope_pos_ids(q, k_new, pos)
    elif rope == "llama31":
        q_rot, k_rot = flashkv.apply_llama31_rope_pos_ids(q, k_new, pos)
    else:
        q_rot, k_rot = flashkv.apply_rope_with_cos_sin_cache(pos, q, k_new, q.shape[-1], cos_sin)
    b = q.shape[0]
    flashkv.append_paged_kv_cache(k_rot, v_new, torch.arange(b, dtype=torch.int32, device="cuda"),
                                  append_pos, cache, indices, indptr, last, kv_layout=layout)
    out, lse = w.run(q_rot, cache, return_lse=True)
    return q_rot, out, lse
