"""Attention variants in the prefill functions on the CPU path (host arrays: the C++ reference of
the built-ins): BatchPrefillWithPagedKVCacheWrapper.plan, BatchPrefillWithRaggedKVCacheWrapper.plan
and single_prefill_with_kv_cache with FlashInfer's arguments (pos_encoding_mode, window_left,
logits_soft_cap, rope_scale, rope_theta, custom_mask, packed_custom_mask) and flashkv's (sinks,
alibi_slopes, sigmoid, mask_indptr) against a float64 NumPy reference written here; argument
validation (errors name the argument); user variants (flashkv.Variant) raise NotImplementedError
on the host. The GPU side: test_gpu_prefill_variants.py."""

import math

import numpy as np
import pytest

import flashkv
from conftest import (
    LOG2E,
    PagedCache,
    assert_close,
    llama_freqs,
    rand,
    rope_ref,
    to_fw,
    to_np,
)
from test_variants import ALIBI, SINKS, T5

WS = np.empty(16, np.uint8)  # a host workspace: the wrappers run the CPU reference
HQ, HK, D = 8, 2, 64


def prefill_variant_ref(q, k, v, causal=False, sm_scale=None, window_left=-1, cap=0.0,
                        sinks=None, alibi=None, freqs=None, mask=None, sigmoid=False,
                        sigmoid_bias=0.0):
    """float64 prefill of one request with the built-ins (include/flashkv/variants.h): q [Lq, Hq,
    D], k, v [Lk, Hk, D], mask bool [Lq, Lk] (True = attend). Query i sits at position
    Lk - Lq + i. Returns (out [Lq, Hq, D], natural lse [Lq, Hq] or None for sigmoid)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    lq, hq, d = q.shape
    lk = k.shape[0]
    qpos = lk - lq + np.arange(lq)
    kpos = np.arange(lk)
    if freqs is not None:  # rotate-half RoPE: query i at qpos[i], key j at j
        q = rope_ref(q, qpos, freqs, False)
        k = rope_ref(k, kpos, freqs, False)
    group = hq // k.shape[1]
    kk, vv = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("qhd,khd->qhk", q, kk) * (1 / math.sqrt(d) if sm_scale is None else sm_scale)
    if alibi is not None:
        s = s + np.asarray(alibi, np.float64)[None, :, None] * (
            kpos[None, :] - qpos[:, None])[:, None, :]
    if cap > 0:
        s = cap * np.tanh(s / cap)
    keep = np.ones((lq, lk), bool)
    if causal:
        keep &= kpos[None, :] <= qpos[:, None]
    if window_left >= 0:
        keep &= kpos[None, :] >= qpos[:, None] - window_left
    if mask is not None:
        keep &= np.asarray(mask, bool)
    keep = keep[:, None, :]
    if sigmoid:
        w = np.where(keep, 1 / (1 + np.exp(-(s + sigmoid_bias))), 0.0)
        return np.einsum("qhk,khd->qhd", w, vv), None
    s = np.where(keep, s, -np.inf)
    if sinks is not None:
        s = np.concatenate([s, np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None],
                                               (lq, hq, 1))], axis=2)
        vv = np.concatenate([vv, np.zeros((1,) + vv.shape[1:])], axis=0)
    m = s.max(axis=2, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    denom = p.sum(axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(denom[..., None] > 0, np.einsum("qhk,khd->qhd", p, vv) /
                       np.where(denom > 0, denom, 1)[..., None], 0.0)
        lse = np.where(denom > 0, m[..., 0] + np.log(np.where(denom > 0, denom, 1)), -np.inf)
    return out, lse


def check(out, lse, ref, ref_lse):
    assert_close(out, ref, np.float16)
    if ref_lse is not None:
        np.testing.assert_allclose(to_np(lse).astype(np.float64), ref_lse * LOG2E, rtol=1e-5,
                                   atol=1e-5)


QO_LENS, KV_LENS = [3, 1, 17, 9], [3, 40, 17, 30]


def random_masks(rng, qo_lens=QO_LENS, kv_lens=KV_LENS):
    """One random (non-causal) bool mask per request, and FlashInfer's flattened custom_mask."""
    masks = [rng.random((a, b)) < 0.6 for a, b in zip(qo_lens, kv_lens)]
    return masks, np.concatenate([m.reshape(-1) for m in masks])


def cases(rng):
    masks, flat = random_masks(rng)
    packed = np.concatenate([np.packbits(m.reshape(-1), bitorder="little") for m in masks])
    return {  # id: (plan kwargs, reference kwargs; "mask" per request)
        "causal_window": (dict(causal=True, window_left=4), dict(causal=True, window_left=4)),
        "window_noncausal": (dict(window_left=6), dict(window_left=6)),
        "softcap": (dict(causal=True, logits_soft_cap=0.5, sm_scale=1.0),
                    dict(causal=True, cap=0.5, sm_scale=1.0)),
        "custom_mask": (dict(custom_mask=flat), dict(mask=masks)),
        # FlashInfer's MaskMode.CUSTOM: the mask replaces causal.
        "custom_mask_causal": (dict(custom_mask=flat, causal=True), dict(mask=masks)),
        "packed_custom_mask": (dict(packed_custom_mask=packed), dict(mask=masks)),
        "sinks": (dict(causal=True, sinks=SINKS), dict(causal=True, sinks=SINKS)),
        "rope_llama": (dict(causal=True, pos_encoding_mode="ROPE_LLAMA", rope_theta=1e4),
                       dict(causal=True, freqs=llama_freqs(D, 1.0, 1e4))),
        "alibi_mode": (dict(causal=True, pos_encoding_mode="ALIBI"),
                       dict(causal=True, alibi=2.0 ** (-np.arange(1, HQ + 1)))),
        "alibi": (dict(alibi_slopes=ALIBI), dict(alibi=ALIBI)),
        "sigmoid": (dict(causal=True, sigmoid=True, sigmoid_bias=-1.0),
                    dict(causal=True, sigmoid=True, sigmoid_bias=-1.0)),
        "window_cap_sinks_mask": (dict(window_left=5, logits_soft_cap=2.0, sinks=SINKS,
                                       custom_mask=flat),
                                  dict(window_left=5, cap=2.0, sinks=SINKS, mask=masks)),
    }


CASE_IDS = list(cases(np.random.default_rng(0)))


def _fw_kwargs(kw, fw):
    return {k: to_fw(v, fw) if isinstance(v, np.ndarray) else v for k, v in kw.items()}


def _ref(ref_kw, i):
    kw = dict(ref_kw)
    if "mask" in kw:
        kw["mask"] = kw["mask"][i]
    return kw


@pytest.mark.parametrize("case", CASE_IDS)
def test_batch_prefill_paged_variants(fw, case):
    rng = np.random.default_rng(60)
    plan_kw, ref_kw = cases(rng)[case]
    cache = PagedCache(rng, KV_LENS, 16, HK, D, np.float16, "NHD")
    qo_indptr = np.concatenate([[0], np.cumsum(QO_LENS)]).astype(np.int32)
    q = rand(rng, (int(qo_indptr[-1]), HQ, D), np.float16)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(WS)
    w.plan(to_fw(qo_indptr, fw), to_fw(cache.indptr, fw), to_fw(cache.indices, fw),
           to_fw(cache.last_page_len, fw), HQ, HK, D, 16, **_fw_kwargs(plan_kw, fw))
    sigmoid = plan_kw.get("sigmoid", False)
    res = w.run(to_fw(q, fw), cache.cache(False, fw), return_lse=not sigmoid)
    out, lse = (res, None) if sigmoid else res
    for i in range(len(QO_LENS)):
        k, v = cache.gather(i)
        rows = slice(qo_indptr[i], qo_indptr[i + 1])
        ref, ref_lse = prefill_variant_ref(q[rows], k, v, **_ref(ref_kw, i))
        check(out[rows], None if lse is None else lse[rows], ref, ref_lse)


@pytest.mark.parametrize("case", CASE_IDS)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_batch_prefill_ragged_variants(case, layout):
    rng = np.random.default_rng(61)
    plan_kw, ref_kw = cases(rng)[case]
    qo_indptr = np.concatenate([[0], np.cumsum(QO_LENS)]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(KV_LENS)]).astype(np.int32)
    q = rand(rng, (int(qo_indptr[-1]), HQ, D), np.float16)
    k, v = (rand(rng, (int(kv_indptr[-1]), HK, D), np.float16) for _ in range(2))
    kl, vl = (k, v) if layout == "NHD" else (k.transpose(1, 0, 2).copy(),
                                             v.transpose(1, 0, 2).copy())
    w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS, layout)
    w.plan(qo_indptr, kv_indptr, HQ, HK, D, **plan_kw)
    sigmoid = plan_kw.get("sigmoid", False)
    res = w.run(q, kl, vl, return_lse=not sigmoid)
    out, lse = (res, None) if sigmoid else res
    for i in range(len(QO_LENS)):
        rows = slice(qo_indptr[i], qo_indptr[i + 1])
        kv = slice(kv_indptr[i], kv_indptr[i + 1])
        ref, ref_lse = prefill_variant_ref(q[rows], k[kv], v[kv], **_ref(ref_kw, i))
        check(out[rows], None if lse is None else lse[rows], ref, ref_lse)


@pytest.mark.parametrize("case", ["causal_window", "softcap", "custom_mask", "sinks",
                                  "rope_llama", "sigmoid"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_single_prefill_variants(case, layout):
    rng = np.random.default_rng(62)
    qo, kv = 9, 23
    masks, flat = random_masks(rng, [qo], [kv])
    plan_kw, ref_kw = cases(rng)[case]
    if "custom_mask" in plan_kw:  # single prefill: one [qo_len, kv_len] mask
        plan_kw, ref_kw = dict(plan_kw, custom_mask=masks[0]), dict(ref_kw, mask=masks)
    q = rand(rng, (qo, HQ, D), np.float16)
    k, v = (rand(rng, (kv, HK, D), np.float16) for _ in range(2))
    kl, vl = (k, v) if layout == "NHD" else (k.transpose(1, 0, 2).copy(),
                                             v.transpose(1, 0, 2).copy())
    sigmoid = plan_kw.get("sigmoid", False)
    res = flashkv.single_prefill_with_kv_cache(q, kl, vl, kv_layout=layout,
                                               return_lse=not sigmoid, **plan_kw)
    out, lse = (res, None) if sigmoid else res
    check(out, lse, *prefill_variant_ref(q, k, v, **_ref(ref_kw, 0)))


def test_custom_mask_packing_matches_pack_custom_mask_layout():
    """custom_mask packs as numpy.packbits(bitorder="little") per request, each request on a
    byte boundary (FlashInfer's segment_packbits); packed_custom_mask with an explicit
    mask_indptr reads the same bytes at other offsets."""
    from flashkv.variants import packed_mask

    rng = np.random.default_rng(63)
    masks, flat = random_masks(rng)
    pm = packed_mask(custom_mask=flat, qo_lens=QO_LENS, kv_lens=KV_LENS, on_gpu=False, like=None)
    nbytes = [(a * b + 7) // 8 for a, b in zip(QO_LENS, KV_LENS)]
    assert pm.indptr.tolist() == np.concatenate([[0], np.cumsum(nbytes)]).tolist()
    for m, lo, hi in zip(masks, pm.indptr[:-1], pm.indptr[1:]):
        np.testing.assert_array_equal(pm.bits[lo:hi], np.packbits(m.reshape(-1),
                                                                  bitorder="little"))
    # The same bytes with a gap of 5 before each request, located by mask_indptr.
    gap = np.concatenate(sum(([np.full(5, 0xFF, np.uint8), pm.bits[lo:hi]]
                              for lo, hi in zip(pm.indptr[:-1], pm.indptr[1:])), []))
    indptr = np.array([5 + sum(nbytes[:b]) + 5 * b for b in range(len(nbytes))] + [gap.size],
                      np.int32)
    qo_indptr = np.concatenate([[0], np.cumsum(QO_LENS)]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(KV_LENS)]).astype(np.int32)
    q = rand(rng, (int(qo_indptr[-1]), HQ, D), np.float16)
    k, v = (rand(rng, (int(kv_indptr[-1]), HK, D), np.float16) for _ in range(2))
    w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS)
    w.plan(qo_indptr, kv_indptr, HQ, HK, D, custom_mask=flat)
    want = w.run(q, k, v)
    w.plan(qo_indptr, kv_indptr, HQ, HK, D, packed_custom_mask=gap, mask_indptr=indptr)
    np.testing.assert_array_equal(w.run(q, k, v), want)


def paged_args(rng):
    cache = PagedCache(rng, [5, 20], 4, HK, D, np.float16, "NHD")
    qo_indptr = np.array([0, 2, 5], np.int32)
    return cache, (qo_indptr, cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, 4)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(pos_encoding_mode="ROPE_XYZ"), ValueError, "pos_encoding_mode"),
    (dict(window_left=-2), ValueError, "window_left"),
    (dict(logits_soft_cap=-1.0), ValueError, "logits_soft_cap"),
    (dict(pos_encoding_mode="ROPE_LLAMA", rope_theta=0.0), ValueError, "rope_theta"),
    (dict(sinks=np.zeros(3, np.float32)), ValueError, r"sinks: expected shape \[8\]"),
    (dict(alibi_slopes=np.zeros(HQ, np.float16)), ValueError, "alibi_slopes: expected dtype"),
    (dict(sigmoid=True, sinks=SINKS), ValueError, "sinks"),
    (dict(custom_mask=np.ones(10, bool)), ValueError,
     r"custom_mask: expected 2\*5 \+ 3\*20 = 70 elements|custom_mask: expected 70 elements"),
    (dict(custom_mask=np.ones(70, np.uint8)), ValueError, "custom_mask: expected a bool array"),
    (dict(custom_mask=np.ones(70, bool), packed_custom_mask=np.ones(9, np.uint8)), ValueError,
     "custom_mask: given with packed_custom_mask"),
    (dict(custom_mask=np.ones(70, bool), mask_indptr=np.array([0, 2, 10], np.int32)),
     ValueError, "mask_indptr: given with custom_mask"),
    (dict(packed_custom_mask=np.ones(9, bool)), ValueError,
     "packed_custom_mask: expected a uint8 array"),
    (dict(packed_custom_mask=np.ones((3, 3), np.uint8)), ValueError,
     "packed_custom_mask: expected a 1-D array"),
    (dict(packed_custom_mask=np.ones(8, np.uint8)), ValueError,
     "packed_custom_mask: expected at least 10 bytes"),
    (dict(packed_custom_mask=np.ones(10, np.uint8), mask_indptr=np.array([0, 2], np.int32)),
     ValueError, r"mask_indptr: expected shape \[3\]"),
    (dict(mask_indptr=np.array([0, 2, 10], np.int32)), ValueError,
     "mask_indptr: given without packed_custom_mask"),
    (dict(variant_args={"num_buckets": 4}), ValueError, "variant_args: given without variant"),
    (dict(variant=T5, custom_mask=np.ones(70, bool), variant_args={}), ValueError,
     "cannot be combined with the built-in custom_mask"),
    (dict(variant=T5, variant_args={"num_buckets": 4}), ValueError,
     r"variant_args\['bias'\]: missing"),
    (dict(variant=T5, variant_args={"num_buckets": 4, "bias": ALIBI}), NotImplementedError,
     "variant=T5Bias: user variants .* run on the GPU only"),
    (dict(sink=SINKS), TypeError, "unexpected keyword argument 'sink'"),
])
def test_plan_argument_errors(kwargs, error, match):
    cache, args = paged_args(np.random.default_rng(64))
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(WS)
    with pytest.raises(error, match=match):
        w.plan(*args, **kwargs)
    with pytest.raises(ValueError, match="before"):  # a failed plan() leaves no plan
        w.run(rand(np.random.default_rng(0), (5, HQ, D), np.float16), (cache.k, cache.v))
    r = flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS)
    with pytest.raises(error, match=match):
        r.plan(args[0], np.array([0, 5, 25], np.int32), HQ, HK, D, **kwargs)


def test_single_prefill_errors():
    q = np.zeros((2, HQ, D), np.float16)
    k = np.zeros((3, HK, D), np.float16)
    with pytest.raises(NotImplementedError, match="GPU only"):
        flashkv.single_prefill_with_kv_cache(
            q, k, k, variant=T5, variant_args={"num_buckets": 4, "bias": ALIBI})
    with pytest.raises(ValueError, match=r"custom_mask: expected 6 elements"):
        flashkv.single_prefill_with_kv_cache(q, k, k, custom_mask=np.ones((3, 3), bool))
    with pytest.raises(ValueError, match="sigmoid attention"):
        flashkv.single_prefill_with_kv_cache(q, k, k, sigmoid=True, return_lse=True)


def test_run_checks_against_the_plan():
    rng = np.random.default_rng(65)
    cache, args = paged_args(rng)
    q = rand(rng, (5, HQ, D), np.float16)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(WS)
    w.plan(*args, window_left=8, causal=True)
    w.run(q, (cache.k, cache.v), window_left=8)  # FlashInfer passes the plan's value again
    with pytest.raises(ValueError, match="window_left: 3 differs from the plan's 8"):
        w.run(q, (cache.k, cache.v), window_left=3)
    w.plan(*args, sigmoid=True)
    w.run(q, (cache.k, cache.v))
    with pytest.raises(ValueError, match="sigmoid attention"):
        w.run(q, (cache.k, cache.v), return_lse=True)


def test_cascade_keeps_refusing_variants():
    w = flashkv.MultiLevelCascadeAttentionWrapper(2, WS)
    ip = [np.array([0, 1], np.int32)] * 2
    with pytest.raises(NotImplementedError, match="window_left"):
        w.plan(ip, ip, ip, ip, HQ, HK, D, 4, window_left=3)


# --- the GPU path's argument mapping, on any machine (test_gpu_paths.py's stand-ins) ---

from test_gpu_paths import FakeCuda, FakeOp, cuda, fake  # noqa: E402, F401  (fake: a fixture)


@pytest.fixture
def fake_dev(fake, monkeypatch):
    """fake, and host arrays "copied" to the stand-in device (the packed mask, mask_indptr)."""
    from flashkv import _arrays

    real = _arrays.to_device_like
    monkeypatch.setattr(_arrays, "to_device_like", lambda a, like: np.asarray(a).view(
        FakeCuda) if _arrays.framework(like) == "other" and _arrays.is_cuda(like) else real(
        a, like))
    return fake


VARIANT, CAUSAL = "variant", "causal"  # what fake_paged_plan reports of the op's plan() call


def fake_paged_plan(w, **kw):
    w.plan(cuda(np.array([0, 2, 5], np.int32)), cuda(np.array([0, 1, 3]), np.int32),
           cuda(np.arange(3), np.int32), cuda(np.array([4, 2]), np.int32), HQ, HK, D, 16, **kw)
    op = FakeOp.made[-1]
    return {VARIANT: op.plan_kwargs["variant"], CAUSAL: op.plans[-1][5].causal}


def test_gpu_plan_passes_the_variant(fake_dev):
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(cuda(np.zeros(100_000, np.uint8)))
    plan = fake_paged_plan(w, causal=True)
    assert plan[VARIANT] is None and plan[CAUSAL] is True  # plain causal: no variant, the op's causal
    plan = fake_paged_plan(w, causal=True, window_left=7, logits_soft_cap=30.0,
                           sinks=cuda(SINKS), pos_encoding_mode="ROPE_LLAMA")
    var = plan[VARIANT]
    assert isinstance(var, flashkv._C.Variant) and not var.is_user and var.use_softmax
    assert plan[CAUSAL] is True
    # kv_lens 4 and 18: a custom mask replaces causal (FlashInfer's MaskMode.CUSTOM).
    plan = fake_paged_plan(w, causal=True, custom_mask=np.ones(2 * 4 + 3 * 18, bool))
    assert plan[VARIANT] is not None and plan[CAUSAL] is False
    assert not fake_paged_plan(w, sigmoid=True)[VARIANT].use_softmax
    bias = cuda(np.zeros(16, np.float32))
    var = fake_paged_plan(w, variant=T5, variant_args={"num_buckets": 16, "bias": bias})[VARIANT]
    assert var.is_user and var.use_softmax
    r = flashkv.BatchPrefillWithRaggedKVCacheWrapper(cuda(np.zeros(100_000, np.uint8)))
    r.plan(cuda(np.array([0, 2, 5], np.int32)), cuda(np.array([0, 4, 9], np.int32)), HQ, HK, D,
           window_left=2)
    assert FakeOp.made[-1].plan_kwargs["variant"] is not None
    with pytest.raises(ValueError, match="sinks: expected a host array"):
        flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS).plan(
            np.array([0, 1]), np.array([0, 1]), HQ, HK, D, sinks=cuda(SINKS))
    FakeOp.made.clear()  # the stand-ins hold the variants; free them before the interpreter exits


def test_gpu_cuda_graph_mode_copies_the_mask_into_its_buffers(fake_dev):
    i32 = [cuda(np.zeros(n), np.int32) for n in (3, 3, 8, 2)]
    mask_buf, indptr_buf = cuda(np.zeros(64, np.uint8)), cuda(np.zeros(3), np.int32)
    kw = dict(use_cuda_graph=True, qo_indptr_buf=i32[0], paged_kv_indptr_buf=i32[1],
              paged_kv_indices_buf=i32[2], paged_kv_last_page_len_buf=i32[3])
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(cuda(np.zeros(100_000, np.uint8)), **kw)
    mask = np.random.default_rng(66).random(2 * 4 + 3 * 18) < 0.5
    with pytest.raises(ValueError, match="custom_mask_buf and mask_indptr_buf are required"):
        fake_paged_plan(w, custom_mask=mask)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(
        cuda(np.zeros(100_000, np.uint8)), custom_mask_buf=mask_buf, mask_indptr_buf=indptr_buf,
        **kw)
    assert fake_paged_plan(w, custom_mask=mask)[VARIANT] is not None
    want = np.concatenate([np.packbits(mask[:8], bitorder="little"),
                           np.packbits(mask[8:], bitorder="little")])
    np.testing.assert_array_equal(np.asarray(mask_buf)[: want.size], want)
    assert np.asarray(indptr_buf).tolist() == [0, 1, 1 + (3 * 18 + 7) // 8]
    with pytest.raises(ValueError, match="sinks: expected an array on cuda:0 .*graph mode"):
        fake_paged_plan(w, sinks=SINKS)
    FakeOp.made.clear()
