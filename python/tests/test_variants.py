"""Attention variants in the decode functions on the CPU path (host arrays: the C++ reference of
the built-ins): FlashInfer's arguments (pos_encoding_mode, window_left, logits_soft_cap,
rope_scale, rope_theta) and flashkv's (sinks, alibi_slopes, sigmoid) against a float64 NumPy
reference written here; argument validation (errors name the argument); user variants
(flashkv.Variant) raise NotImplementedError on the host. The GPU side: test_gpu_variants.py."""

import math

import numpy as np
import pytest

import flashkv
from conftest import (
    LOG2E,
    PagedCache,
    assert_close,
    llama31_freqs,
    llama_freqs,
    rand,
    rope_ref,
    to_fw,
    to_np,
)

WS = np.empty(16, np.uint8)  # a host workspace: the wrappers run the CPU reference
HQ, HK, D = 8, 2, 64

T5 = flashkv.Variant("T5Bias", """
struct T5Bias {
  using Args = Params;
  __device__ static float logits_transform(const Args& a, const flashkv::VariantPosition& p,
                                           float s) {
    return s + a.bias[min(max(p.q_pos() - p.kv_idx, 0), a.num_buckets - 1)];
  }
};""", params=[("num_buckets", "i32"), ("bias", "tensor:f32")])


def decode_variant_ref(q, k, v, sm_scale=None, window_left=-1, cap=0.0, sinks=None, alibi=None,
                       freqs=None, sigmoid=False, sigmoid_bias=0.0):
    """float64 decode of one request with the built-ins (include/flashkv/variants.h): q [Hq, D],
    k, v [L, Hk, D]. Returns (out [Hq, D], natural lse [Hq] or None for sigmoid)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    n, hq, d = k.shape[0], q.shape[0], q.shape[1]
    qpos = n - 1
    if freqs is not None:  # rotate-half RoPE: q at kv_len - 1, key j at j
        q = rope_ref(q[None], [qpos], freqs, False)[0]
        k = rope_ref(k, np.arange(n), freqs, False)
    group = hq // k.shape[1]
    kk, vv = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("hd,khd->hk", q, kk) * (1 / math.sqrt(d) if sm_scale is None else sm_scale)
    if alibi is not None:
        s = s + np.asarray(alibi, np.float64)[:, None] * (np.arange(n) - qpos)[None, :]
    if cap > 0:
        s = cap * np.tanh(s / cap)
    keep = np.ones(n, bool) if window_left < 0 else np.arange(n) >= qpos - window_left
    if sigmoid:
        w = np.where(keep[None, :], 1 / (1 + np.exp(-(s + sigmoid_bias))), 0.0)
        return np.einsum("hk,khd->hd", w, vv), None
    s = np.where(keep[None, :], s, -np.inf)
    if sinks is not None:
        s = np.concatenate([s, np.asarray(sinks, np.float64)[:, None]], axis=1)
        vv = np.concatenate([vv, np.zeros((1,) + vv.shape[1:])], axis=0)
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    denom = p.sum(axis=1)
    return np.einsum("hk,khd->hd", p, vv) / denom[:, None], m[:, 0] + np.log(denom)


SINKS = np.linspace(-1.0, 2.0, HQ).astype(np.float32)
ALIBI = (2.0 ** -np.arange(1, HQ + 1)).astype(np.float32)
CASES = {  # id: (plan kwargs, reference kwargs)
    "window": (dict(window_left=10), dict(window_left=10)),
    "window0": (dict(window_left=0), dict(window_left=0)),
    "softcap": (dict(logits_soft_cap=0.5, sm_scale=1.0), dict(cap=0.5, sm_scale=1.0)),
    "rope_llama": (dict(pos_encoding_mode="ROPE_LLAMA", rope_theta=1e4),
                   dict(freqs=llama_freqs(D, 1.0, 1e4))),
    "rope_llama_scaled": (dict(pos_encoding_mode="ROPE_LLAMA", rope_scale=2.0, rope_theta=500.0),
                          dict(freqs=llama_freqs(D, 2.0, 500.0))),
    "rope_llama31": (dict(pos_encoding_mode="ROPE_LLAMA31", old_context_len=64),
                     dict(freqs=llama31_freqs(D, 8.0, 5e5, old_context_len=64))),
    "sinks": (dict(sinks=SINKS), dict(sinks=SINKS)),
    "alibi": (dict(alibi_slopes=ALIBI), dict(alibi=ALIBI)),
    "alibi_mode": (dict(pos_encoding_mode="ALIBI"), dict(alibi=2.0 ** (-np.arange(1, HQ + 1)))),
    "sigmoid": (dict(sigmoid=True, sigmoid_bias=-1.0), dict(sigmoid=True, sigmoid_bias=-1.0)),
    "window_cap_sinks": (dict(window_left=5, logits_soft_cap=2.0, sinks=SINKS),
                         dict(window_left=5, cap=2.0, sinks=SINKS)),
}


def check(out, lse, ref, ref_lse):
    assert_close(out, ref, np.float16)
    if ref_lse is not None:
        np.testing.assert_allclose(to_np(lse).astype(np.float64), ref_lse * LOG2E, rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("case", list(CASES))
def test_batch_decode_variants(fw, case):
    plan_kw, ref_kw = CASES[case]
    rng = np.random.default_rng(50)
    kv_lens = [1, 37, 70]
    cache = PagedCache(rng, kv_lens, 16, HK, D, np.float16, "NHD")
    q = rand(rng, (len(kv_lens), HQ, D), np.float16)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(to_fw(cache.indptr, fw), to_fw(cache.indices, fw), to_fw(cache.last_page_len, fw), HQ,
           HK, D, 16, **{k: to_fw(v, fw) if isinstance(v, np.ndarray) else v
                         for k, v in plan_kw.items()})
    sigmoid = plan_kw.get("sigmoid", False)
    res = w.run(to_fw(q, fw), cache.cache(False, fw), return_lse=not sigmoid)
    out, lse = (res, None) if sigmoid else res
    for i in range(len(kv_lens)):
        k, v = cache.gather(i)
        ref, ref_lse = decode_variant_ref(q[i], k, v, **ref_kw)
        check(out[i], None if lse is None else lse[i], ref, ref_lse)


@pytest.mark.parametrize("case", ["window", "softcap", "rope_llama", "sinks"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_single_decode_variants(case, layout):
    plan_kw, ref_kw = CASES[case]
    rng = np.random.default_rng(51)
    q, k, v = rand(rng, (HQ, D), np.float16), rand(rng, (40, HK, D), np.float16), rand(
        rng, (40, HK, D), np.float16)
    kl, vl = (k, v) if layout == "NHD" else (k.transpose(1, 0, 2).copy(),
                                             v.transpose(1, 0, 2).copy())
    out, lse = flashkv.single_decode_with_kv_cache(q, kl, vl, layout, return_lse=True, **plan_kw)
    check(out, lse, *decode_variant_ref(q, k, v, **ref_kw))


def test_run_step_applies_the_plans_variant():
    """The host run_step (append, then the reference decode) keeps the plan's variant."""
    rng = np.random.default_rng(52)
    kv_lens = [3, 20]
    cache = PagedCache(rng, kv_lens, 16, HK, D, np.float16, "NHD")
    q = rand(rng, (2, HQ, D), np.float16)
    k_new, v_new = rand(rng, (2, HK, D), np.float16), rand(rng, (2, HK, D), np.float16)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, 16, window_left=4,
           sinks=SINKS)
    out, lse = w.run_step(q, k_new, v_new, (cache.k, cache.v), return_lse=True)
    for i in range(2):
        k, v = cache.gather(i)  # after the append: the last key is the new one
        np.testing.assert_array_equal(k[-1], k_new[i])
        check(out[i], lse[i], *decode_variant_ref(q[i], k, v, window_left=4, sinks=SINKS))
    w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, 16,
           pos_encoding_mode="ROPE_LLAMA")
    with pytest.raises(ValueError, match="run_step: the plan's pos_encoding_mode"):
        w.run_step(q, k_new, v_new, (cache.k, cache.v))


def plan_args(rng):
    cache = PagedCache(rng, [5, 20], 4, HK, D, np.float16, "NHD")
    return cache, (cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, 4)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(pos_encoding_mode="ROPE_XYZ"), ValueError, "pos_encoding_mode"),
    (dict(window_left=-2), ValueError, "window_left"),
    (dict(logits_soft_cap=-1.0), ValueError, "logits_soft_cap"),
    (dict(pos_encoding_mode="ROPE_LLAMA", rope_theta=0.0), ValueError, "rope_theta"),
    (dict(pos_encoding_mode="ROPE_LLAMA", rope_scale=-1.0), ValueError, "rope_scale"),
    (dict(sinks=np.zeros(3, np.float32)), ValueError, r"sinks: expected shape \[8\]"),
    (dict(sinks=np.zeros(HQ, np.float16)), ValueError, "sinks: expected dtype f32"),
    (dict(alibi_slopes=np.zeros((HQ, 1), np.float32)), ValueError, "alibi_slopes"),
    (dict(sigmoid=True, sinks=SINKS), ValueError, "sinks"),
    (dict(pos_encoding_mode="ALIBI", alibi_slopes=ALIBI), ValueError, "alibi_slopes"),
    (dict(variant_args={"num_buckets": 4}), ValueError, "variant_args: given without variant"),
    (dict(variant=T5, window_left=3, variant_args={}), ValueError,
     "cannot be combined with the built-in window_left"),
    (dict(variant=T5, variant_args={"num_buckets": 4}), ValueError,
     r"variant_args\['bias'\]: missing"),
    (dict(variant=T5, variant_args={"num_buckets": 4, "bias": ALIBI, "scale": 1.0}), ValueError,
     r"variant_args\['scale'\]: not a param"),
    (dict(variant=T5, variant_args={"num_buckets": 4.5, "bias": ALIBI}), ValueError,
     r"variant_args\['num_buckets'\]: expected an int"),
    (dict(variant=T5, variant_args=[1, 2]), TypeError, "variant_args: expected a dict"),
    (dict(variant="T5Bias"), TypeError, "variant: expected a flashkv.Variant"),
    (dict(variant=T5, variant_args={"num_buckets": 4, "bias": ALIBI}), NotImplementedError,
     "variant=T5Bias: user variants .* run on the GPU only"),
])
def test_plan_argument_errors(kwargs, error, match):
    cache, args = plan_args(np.random.default_rng(53))
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    with pytest.raises(error, match=match):
        w.plan(*args, **kwargs)
    with pytest.raises(ValueError, match="before"):  # a failed plan() leaves no plan
        w.run(rand(np.random.default_rng(0), (2, HQ, D), np.float16), (cache.k, cache.v))


def test_single_decode_user_variant_on_host_is_not_implemented():
    q = np.zeros((HQ, D), np.float16)
    k = np.zeros((3, HK, D), np.float16)
    with pytest.raises(NotImplementedError, match="GPU only"):
        flashkv.single_decode_with_kv_cache(
            q, k, k, variant=T5, variant_args={"num_buckets": 4, "bias": ALIBI})
    with pytest.raises(ValueError, match="window_left"):
        flashkv.single_decode_with_kv_cache(q, k, k, window_left=-5)


def test_run_checks_against_the_plan():
    rng = np.random.default_rng(54)
    cache, args = plan_args(rng)
    q = rand(rng, (2, HQ, D), np.float16)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(*args, window_left=8)
    w.run(q, (cache.k, cache.v), window_left=8)  # FlashInfer passes the plan's value again
    with pytest.raises(ValueError, match="window_left: 3 differs from the plan's 8"):
        w.run(q, (cache.k, cache.v), window_left=3)
    w.plan(*args, sigmoid=True)
    w.run(q, (cache.k, cache.v))
    with pytest.raises(ValueError, match="sigmoid attention"):
        w.run(q, (cache.k, cache.v), return_lse=True)


@pytest.mark.parametrize("bad, match", [
    (dict(name="not an identifier"), "Variant.name"),
    (dict(source="  "), "Variant.source"),
    (dict(params=[("x", "f64")]), r"Variant.params\['x'\]: kind 'f64'"),
    (dict(params=[("x", "tensor:u8")]), r"Variant.params\['x'\]"),
    (dict(params=[("x", "f32"), ("x", "i32")]), "declared twice"),
    (dict(params=[("1x", "f32")]), "not a C\\+\\+ identifier"),
    (dict(params=["x"]), r"\(name, kind\) pairs"),
])
def test_variant_spec_errors(bad, match):
    kw = dict(name="V", source="struct V { using Args = Params; };", params=())
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        flashkv.Variant(**kw)


def test_variant_spec_normalizes_kinds():
    v = flashkv.Variant("V", "struct V {};", params=[("a", "f32"), ("b", "tensor:float16"),
                                                      ("c", "tensor:int32"), ("d", "i32")])
    assert v.params == (("a", "f32", ""), ("b", "tensor", "f16"), ("c", "tensor", "i32"),
                        ("d", "i32", ""))
    assert "tensor:f16" in repr(v)


def test_alibi_slopes_match_flashinfer():
    from flashkv.variants import alibi_slopes_for

    np.testing.assert_allclose(alibi_slopes_for(8), 2.0 ** -np.arange(1, 9), rtol=1e-7)
    # 12 heads: 8 geometric slopes of 2^-1, then 4 interleaved ones of 2^-0.5 (odd powers).
    want = np.concatenate([2.0 ** -np.arange(1, 9), 2.0 ** (-0.5 * np.arange(1, 8, 2))])
    np.testing.assert_allclose(alibi_slopes_for(12), want, rtol=1e-7)


# --- the GPU path's argument mapping, on any machine (test_gpu_paths.py's stand-ins) ---

from test_gpu_paths import FakeOp, cuda, fake  # noqa: E402, F401  (fake: a fixture)


def fake_plan(w, **kw):
    w.plan(cuda(np.array([0, 1, 3], np.int32)), cuda(np.arange(3), np.int32),
           cuda(np.array([4, 2]), np.int32), HQ, HK, D, 16, **kw)
    return FakeOp.made[-1].plan_kwargs["variant"]  # the plan's variant argument


def test_gpu_plan_passes_the_variant(fake):
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(cuda(np.zeros(100_000, np.uint8)))
    assert fake_plan(w) is None  # plain attention: no variant
    var = fake_plan(w, window_left=7, logits_soft_cap=30.0, sinks=cuda(SINKS),
                    pos_encoding_mode="ROPE_LLAMA")
    assert isinstance(var, flashkv._C.Variant) and not var.is_user and var.use_softmax
    assert not fake_plan(w, sigmoid=True).use_softmax
    bias = cuda(np.zeros(16, np.float32))
    var = fake_plan(w, variant=T5, variant_args={"num_buckets": 16, "bias": bias})
    assert var.is_user and var.use_softmax
    with pytest.raises(ValueError, match=r"variant_args\['bias'\]: expected dtype f32, got f16"):
        fake_plan(w, variant=T5, variant_args={"num_buckets": 16, "bias": cuda(
            np.zeros(16, np.float16))})
    with pytest.raises(ValueError, match="sinks: expected an array on cuda:0 .*graph mode"):
        bufs = [cuda(np.zeros(n), np.int32) for n in (5, 32, 4)]
        g = flashkv.BatchDecodeWithPagedKVCacheWrapper(
            cuda(np.zeros(100_000, np.uint8)), use_cuda_graph=True,
            paged_kv_indptr_buffer=bufs[0], paged_kv_indices_buffer=bufs[1],
            paged_kv_last_page_len_buffer=bufs[2])
        fake_plan(g, sinks=SINKS)
    with pytest.raises(ValueError, match="sinks: expected a host array"):
        flashkv.BatchDecodeWithPagedKVCacheWrapper(WS).plan(
            np.array([0, 1]), np.arange(1, dtype=np.int32), np.array([1]), HQ, HK, D, 16,
            sinks=cuda(SINKS))
    FakeOp.made.clear()  # the stand-ins hold the variants; free them before the interpreter exits
