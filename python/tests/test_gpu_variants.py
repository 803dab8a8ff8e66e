"""GPU tests of attention variants in the decode functions: BatchDecodeWithPagedKVCacheWrapper.plan
and single_decode_with_kv_cache with window_left, logits_soft_cap, pos_encoding_mode ROPE_LLAMA,
sinks, sigmoid and a user variant (flashkv.Variant: a T5 relative position bias) against float32
torch references written here; a user variant's compile error names its source line. Skipped
unless torch with CUDA and a GPU are present (FLASHKV_REQUIRE_GPU=1 makes that an error).

Tolerance (tests/common/test_util.h): rel_err(out, ref) <= min(2 * rel_err(ref rounded to the
dtype, ref) + u, 1e-2), u the unit roundoff of the dtype; LSE relative error <= 1e-4.
"""

import math

import numpy as np
import pytest

import flashkv

from conftest import LOG2E, requires_gpu
from gpu_helpers import check_out, rel_err  # the STYLE.md tolerance rule, float32 torch refs

try:
    import torch
except ImportError:
    torch = None

pytestmark = requires_gpu

PAGE = 16

T5 = flashkv.Variant("T5Bias", """
struct T5Bias {
  using Args = Params;
  __device__ static float logits_transform(const Args& a, const flashkv::VariantPosition& p,
                                           float s) {
    const int bucket = min(max(p.q_pos() - p.kv_idx, 0), a.num_buckets - 1);
    return s + a.bias[bucket];
  }
};""", params=[("num_buckets", "i32"), ("bias", "tensor:f32")])


def check_lse(lse2, ref_lse):
    assert rel_err(lse2.double(), ref_lse.double() * LOG2E) <= 1e-4


def rope(x, pos, theta, dtype):
    """Rotate-half RoPE of x [n, H, D] at positions pos [n] (f_d = theta^(-2d/D)), rounded to the
    input dtype as the kernels keep q and k (kernels/variants/variant.cuh)."""
    d = x.shape[-1]
    f = theta ** (-2.0 * torch.arange(d // 2, dtype=torch.float64, device=x.device) / d)
    ang = pos.double()[:, None] * f[None, :]
    c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    x1, x2 = x[..., : d // 2].double(), x[..., d // 2:].double()
    out = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    return out.to(getattr(torch, dtype)).float()


def decode_ref(q, k, v, dtype, sm_scale=None, window_left=-1, cap=0.0, sinks=None, theta=None,
               t5_bias=None, sigmoid=False, sigmoid_bias=0.0):
    """float32 decode of one request: q [Hq, D], k, v [L, Hk, D]. -> (out [Hq, D], natural lse [Hq]
    or None for sigmoid)."""
    n, hq, d = k.shape[0], q.shape[0], q.shape[1]
    qpos = n - 1
    q, k, v = q.float(), k.float(), v.float()
    if theta is not None:
        q = rope(q[None], torch.tensor([qpos], device=q.device), theta, dtype)[0]
        k = rope(k, torch.arange(n, device=q.device), theta, dtype)
    group = hq // k.shape[1]
    kk, vv = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = torch.einsum("hd,khd->hk", q, kk) * (1 / math.sqrt(d) if sm_scale is None else sm_scale)
    j = torch.arange(n, device=q.device)
    if t5_bias is not None:
        s = s + t5_bias[(qpos - j).clamp(0, t5_bias.shape[0] - 1)][None, :]
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    keep = (j >= qpos - window_left) if window_left >= 0 else torch.ones_like(j, dtype=torch.bool)
    if sigmoid:
        w = torch.sigmoid(s + sigmoid_bias) * keep[None, :]
        return torch.einsum("hk,khd->hd", w, vv), None
    s = s.masked_fill(~keep[None, :], -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.float()[:, None]], dim=1)
        vv = torch.cat([vv, torch.zeros_like(vv[:1])], dim=0)
    lse = torch.logsumexp(s, dim=1)
    return torch.einsum("hk,khd->hd", torch.exp(s - lse[:, None]), vv), lse


def paged(kv_lens, hk, d, dtype, g):
    """A paged NHD cache with shuffled pages: (indptr, indices, last_page_len, k, v, gather)."""
    pages = [(n + PAGE - 1) // PAGE for n in kv_lens]
    total = sum(pages) + 3
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32,
                          device="cuda")
    perm = torch.randperm(total, generator=torch.Generator().manual_seed(7))
    indices = perm[: sum(pages)].to(torch.int32).cuda()
    last = torch.tensor([n - (p - 1) * PAGE for n, p in zip(kv_lens, pages)], dtype=torch.int32,
                        device="cuda")
    k = (torch.rand((total, PAGE, hk, d), generator=g, device="cuda") * 2 - 1).to(
        getattr(torch, dtype))
    v = (torch.rand((total, PAGE, hk, d), generator=g, device="cuda") * 2 - 1).to(
        getattr(torch, dtype))

    def gather(i):
        ids = indices[indptr[i]: indptr[i + 1]].long()
        return k[ids].reshape(-1, hk, d)[: kv_lens[i]], v[ids].reshape(-1, hk, d)[: kv_lens[i]]

    return indptr, indices, last, k, v, gather


def cases(hq):
    g = torch.Generator(device="cuda").manual_seed(3)
    sinks = torch.rand(hq, generator=g, device="cuda") * 4 - 1
    bias = torch.sin(torch.arange(32, device="cuda") * 0.7) * 0.5 - 0.08 * torch.arange(
        32, device="cuda")
    return {  # id: (plan kwargs, reference kwargs)
        "window_left": (dict(window_left=20), dict(window_left=20)),
        "logits_soft_cap": (dict(logits_soft_cap=1.0, sm_scale=0.5), dict(cap=1.0, sm_scale=0.5)),
        "rope_llama": (dict(pos_encoding_mode="ROPE_LLAMA"), dict(theta=1e4)),
        "sinks": (dict(sinks=sinks), dict(sinks=sinks)),
        "sigmoid": (dict(sigmoid=True, sigmoid_bias=-2.0), dict(sigmoid=True, sigmoid_bias=-2.0)),
        "user_t5": (dict(variant=T5, variant_args={"num_buckets": 32, "bias": bias.float()}),
                    dict(t5_bias=bias.float())),
    }


CASE_IDS = ["window_left", "logits_soft_cap", "rope_llama", "sinks", "sigmoid", "user_t5"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("heads_dim", [(8, 2, 128), (32, 8, 128), (8, 8, 64)])
@pytest.mark.parametrize("case", CASE_IDS)
def test_batch_decode_variant(case, heads_dim, dtype):
    hq, hk, d = heads_dim
    kv_lens = [1, 37, 300, 1500]  # 1500: split across CTAs, so partial states merge
    g = torch.Generator(device="cuda").manual_seed(11)
    indptr, indices, last, k, v, gather = paged(kv_lens, hk, d, dtype, g)
    q = (torch.rand((len(kv_lens), hq, d), generator=g, device="cuda") * 2 - 1).to(
        getattr(torch, dtype))
    plan_kw, ref_kw = cases(hq)[case]
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8,
                                                               device="cuda"))
    w.plan(indptr, indices, last, hq, hk, d, PAGE, q_data_type=getattr(torch, dtype), **plan_kw)
    sigmoid = case == "sigmoid"
    res = w.run(q, (k, v), return_lse=not sigmoid)
    out, lse = (res, None) if sigmoid else res
    for i in range(len(kv_lens)):
        ki, vi = gather(i)
        ref, ref_lse = decode_ref(q[i], ki, vi, dtype, **ref_kw)
        check_out(out[i], ref, dtype)
        if lse is not None:
            check_lse(lse[i], ref_lse)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("case", CASE_IDS)
def test_single_decode_variant(case, layout):
    dtype, hq, hk, d, n = "float16", 32, 8, 128, 257
    g = torch.Generator(device="cuda").manual_seed(12)
    q, k, v = ((torch.rand(s, generator=g, device="cuda") * 2 - 1).half()
               for s in ((hq, d), (n, hk, d), (n, hk, d)))
    plan_kw, ref_kw = cases(hq)[case]
    kl, vl = (k, v) if layout == "NHD" else (k.transpose(0, 1).contiguous(),
                                             v.transpose(0, 1).contiguous())
    sigmoid = case == "sigmoid"
    res = flashkv.single_decode_with_kv_cache(q, kl, vl, layout, return_lse=not sigmoid,
                                              **plan_kw)
    out, lse = (res, None) if sigmoid else res
    ref, ref_lse = decode_ref(q, k, v, dtype, **ref_kw)
    check_out(out, ref, dtype)
    if lse is not None:
        check_lse(lse, ref_lse)


def test_user_variant_compile_error_names_the_source_line():
    typo = flashkv.Variant("T5Typo", T5.source.replace("T5Bias", "T5Typo").replace(
        "a.bias[", "a.bais["), params=[("num_buckets", "i32"), ("bias", "tensor:f32")])
    indptr, indices, last, k, v, _ = paged([5], 2, 128, "float16",
                                           torch.Generator(device="cuda").manual_seed(1))
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16 << 20, dtype=torch.uint8,
                                                               device="cuda"))
    bias = torch.zeros(4, device="cuda")
    with pytest.raises(RuntimeError, match=r"T5Typo\.variant\(\d+\)"):
        w.plan(indptr, indices, last, 8, 2, 128, PAGE, variant=typo,
               variant_args={"num_buckets": 4, "bias": bias})


def test_variant_tensors_from_the_host_are_copied_to_the_device():
    """sinks / variant tensors given as host arrays on a GPU wrapper: copied at plan() and kept."""
    hq, hk, d = 8, 2, 128
    g = torch.Generator(device="cuda").manual_seed(13)
    indptr, indices, last, k, v, gather = paged([40, 3], hk, d, "float16", g)
    q = (torch.rand((2, hq, d), generator=g, device="cuda") * 2 - 1).half()
    sinks = np.linspace(-1, 1, hq).astype(np.float32)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16 << 20, dtype=torch.uint8,
                                                               device="cuda"))
    w.plan(indptr, indices, last, hq, hk, d, PAGE, sinks=sinks)
    del sinks  # the plan keeps its device copy
    out = w.run(q, (k, v))
    for i in range(2):
        ki, vi = gather(i)
        ref, _ = decode_ref(q[i], ki, vi, "float16",
                            sinks=torch.linspace(-1, 1, hq, device="cuda"))
        check_out(out[i], ref, "float16")


def test_cuda_graph_mode_takes_device_variant_arrays_only():
    hq, hk, d = 8, 2, 128
    indptr, indices, last, k, v, _ = paged([5, 9], hk, d, "float16",
                                           torch.Generator(device="cuda").manual_seed(2))
    i32 = dict(dtype=torch.int32, device="cuda")
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(16 << 20, dtype=torch.uint8, device="cuda"), use_cuda_graph=True,
        paged_kv_indptr_buffer=torch.zeros(5, **i32), paged_kv_indices_buffer=torch.zeros(64, **i32),
        paged_kv_last_page_len_buffer=torch.zeros(4, **i32))
    with pytest.raises(ValueError, match="sinks: expected an array on cuda:0 .*graph mode"):
        w.plan(indptr, indices, last, hq, hk, d, PAGE, sinks=np.zeros(hq, np.float32))
    w.plan(indptr, indices, last, hq, hk, d, PAGE, sinks=torch.zeros(hq, device="cuda"))
