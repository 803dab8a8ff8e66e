"""FP8 KV caches on the host path (CPU reference): kv_data_type parsing, the k_scale / v_scale
argument checks (every error names its argument), and, with ml_dtypes (NumPy's float8 arrays) or
torch (float8 CPU tensors), every op over e4m3 / e5m2 caches: equal to the same op over the
dequantized cache in float16 (exact for power-of-two scales), close to the float64 NumPy
reference, append_paged_kv_cache quantizing bit for bit as ml_dtypes converts (round to nearest
even) but saturating, and run_step equal to append + run. The GPU kernels: test_gpu_fp8.py."""

import numpy as np
import pytest

import flashkv
from conftest import HAVE_TORCH, PagedCache, assert_close, assert_lse2, attention_ref, rand
from flashkv import _C
from flashkv import _common as C

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

WS = np.empty(16, np.uint8)  # a host workspace: the wrappers run the CPU reference
HQ, HK, D, PS = 8, 2, 64, 4
FP8 = ["float8_e4m3fn", "float8_e5m2"]
MAX_FINITE = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
# The frameworks fp8 host arrays come in: NumPy (ml_dtypes' float8 types), torch CPU tensors.
FP8_FRAMEWORKS = ((["numpy"] if ml_dtypes is not None else []) +
                  (["torch"] if HAVE_TORCH and ml_dtypes is not None else []))
needs_fp8 = pytest.mark.skipif(ml_dtypes is None, reason="needs ml_dtypes (NumPy float8 arrays)")


@pytest.fixture(params=FP8_FRAMEWORKS or ["none"])
def fw8(request):
    if request.param == "none":
        pytest.skip("needs ml_dtypes (NumPy float8 arrays)")
    return request.param


def np_fp8(name):
    return getattr(ml_dtypes, name)


def to8(a, fw):
    """A host array (any dtype, ml_dtypes' float8 included) in framework fw."""
    a = np.ascontiguousarray(a)
    if fw != "torch":
        return a
    import torch

    if a.dtype.name in FP8:
        return torch.from_numpy(a.view(np.uint8)).view(getattr(torch, a.dtype.name))
    return torch.from_numpy(a)


def f64(x):
    """float64 NumPy copy of a host array of any framework (float8 included)."""
    if type(x).__module__.startswith("torch"):
        return x.float().numpy().astype(np.float64)
    return np.asarray(x).astype(np.float64)


def dequantized(a, scale, layout, paged=True):
    """a (fp8) * scale in float16, exact for power-of-two scales; scale a float or [H] array."""
    s = np.asarray(scale, np.float64).reshape(-1)
    heads = (2 if layout == "NHD" else 1) if paged else (1 if layout == "NHD" else 0)
    shape = [1] * a.ndim
    if s.size > 1:
        shape[heads] = s.size
    out = a.astype(np.float64) * s.reshape(shape)
    assert np.array_equal(out.astype(np.float16).astype(np.float64), out)  # exact in f16
    return out.astype(np.float16)


def head_scale(scale, h):
    s = np.asarray(scale, np.float64).reshape(-1)
    return s[0] if s.size == 1 else s[h]


def scaled(x, scale):
    """x [L, H, D] (NHD rows) times scale per head, float64."""
    s = np.asarray(scale, np.float64).reshape(-1)
    return np.asarray(x, np.float64) * (s[None, :, None] if s.size > 1 else s[0])


def scale_args(kind, fw):
    """(k_scale, v_scale) of a kind: floats, [1] arrays, [num_kv_heads] arrays (powers of 2)."""
    if kind == "float":
        return 0.5, 2.0
    if kind == "one":
        return to8(np.array([2.0], np.float32), fw), to8(np.array([0.25], np.float32), fw)
    return to8(np.array([0.5, 2.0], np.float32), fw), to8(np.array([4.0, 0.125], np.float32), fw)


def host(x):
    """A host array of any framework as NumPy (torch float8 as ml_dtypes' float8)."""
    if not type(x).__module__.startswith("torch"):
        return x
    name = str(x.dtype).replace("torch.", "")
    if name in FP8:
        import torch

        return x.view(torch.uint8).numpy().view(np_fp8(name))
    return x.numpy()


# --- kv_data_type ------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling, name", [
    ("float8_e4m3fn", "e4m3"), ("e4m3", "e4m3"), ("fp8_e4m3", "e4m3"),
    ("float8_e5m2", "e5m2"), ("e5m2", "e5m2"), ("fp8_e5m2", "e5m2"), ("FLOAT8_E5M2", "e5m2"),
])
def test_kv_data_type_spellings(spelling, name):
    assert C.plan_dtypes("float16", spelling, None) == ("f16", name, "f16")
    cache = PagedCache(np.random.default_rng(0), [5, 9], PS, HK, D, np.float16, "NHD")
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS,
           q_data_type="bfloat16", kv_data_type=spelling)
    assert (w._plan["q_dtype"], w._plan["kv_dtype"], w._plan["o_dtype"]) == ("bf16", name, "bf16")


def test_kv_data_type_torch_and_numpy_dtypes():
    if ml_dtypes is not None:
        assert C.plan_dtypes(np.float16, np.dtype(ml_dtypes.float8_e4m3fn), None)[1] == "e4m3"
        assert C.plan_dtypes(np.float16, ml_dtypes.float8_e5m2, None)[1] == "e5m2"
    if HAVE_TORCH:
        import torch

        for dt, name in ((torch.float8_e4m3fn, "e4m3"), (torch.float8_e5m2, "e5m2")):
            assert C.plan_dtypes(torch.bfloat16, dt, None) == ("bf16", name, "bf16")


@pytest.mark.parametrize("bad", ["float8_e4m3fnuz", "float8_e8m0fnu", "int8"])
def test_kv_data_type_unsupported(bad):
    w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS)
    ip = np.array([0, 2], np.int32)
    with pytest.raises(ValueError, match="unsupported data type.*float8_e4m3fn or float8_e5m2"):
        w.plan(ip, ip, HQ, HK, D, kv_data_type=bad)


def test_fp8_plans_need_16_bit_queries():
    """fp8 KV goes with float16 / bfloat16 q (and out); the plan checks refuse the rest, on the
    host as on the GPU."""
    cache = PagedCache(np.random.default_rng(1), [5, 9], PS, HK, D, np.float16, "NHD")
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    with pytest.raises(ValueError, match="kv_dtype: an fp8 cache"):
        w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS,
               q_data_type="float32", kv_data_type="e4m3")
    with pytest.raises(ValueError, match="o_dtype: expected f16"):
        w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS,
               kv_data_type="e4m3", o_data_type="e4m3")
    # The automatic cascade: fp8 KV under float32 queries is refused too.
    with pytest.raises(ValueError, match="fp8 cache"):
        flashkv.MultiLevelCascadeWrapper(WS).plan(
            None, cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS,
            q_data_type="float32", kv_data_type="e4m3")


# --- k_scale / v_scale checks ------------------------------------------------------------------


class Fp8Stub:
    """What kv_scales reads of a cache (its dtype and device), without float8 arrays."""

    def __init__(self, dtype="float8_e4m3fn", device=(1, 0)):
        self.dtype, self._device, self.shape = dtype, device, (4, PS, HK, D)

    def __dlpack_device__(self):
        return self._device


class FakeCuda(np.ndarray):
    def __dlpack_device__(self):
        return (2, 0)


def test_kv_scales_accepted_forms():
    k8 = Fp8Stub()
    assert C.kv_scales(None, None, k8, HK) is C.NO_SCALE
    assert C.kv_scales(0.5, 2, k8, HK) == C.KVScale(0.5, 2.0, None, None)
    assert C.kv_scales(np.float32(0.25), None, k8, HK) == C.KVScale(0.25, 1.0, None, None)
    one, per_head = np.ones(1, np.float32), np.ones(HK, np.float32)
    s = C.kv_scales(one, per_head, k8, HK)
    assert s.k == s.v == 1.0 and s.k_tensor is one and s.v_tensor is per_head
    s = C.kv_scales(np.array(0.5, np.float32), None, k8, HK)  # 0-d: [1]
    assert s.k_tensor.shape == (1,) and not s.is_identity
    assert C.kv_scales(None, None, k8, HK).is_identity
    # Unknown head count (a cache of odd shape): any length; the C++ op checks it.
    assert C.kv_scales(np.ones(3, np.float32), None, k8, None).k_tensor.shape == (3,)
    # 16-bit caches: None and 1.0 (vLLM always passes 1.0).
    k16 = np.zeros((4, PS, HK, D), np.float16)
    assert C.kv_scales(1.0, 1.0, k16, HK).is_identity
    assert C.kv_scales(1, None, k16, HK).is_identity


@pytest.mark.parametrize("k_scale, match", [
    (0.0, r"k_scale: expected a finite scale > 0, got 0.0"),
    (-1.0, r"k_scale: expected a finite scale > 0"),
    (float("nan"), r"k_scale: expected a finite scale > 0"),
    (float("inf"), r"k_scale: expected a finite scale > 0"),
    ("0.5", r"k_scale: expected None, a float or a float32 array"),
    (True, r"k_scale: expected None, a float or a float32 array"),
    (np.ones(HK, np.float16), r"k_scale: expected a float32 array, got dtype float16"),
    (np.ones(HK, np.float64), r"k_scale: expected a float32 array, got dtype float64"),
    (np.ones(HK + 1, np.float32), r"k_scale: expected shape \[1\] or \[2 \(num_kv_heads\)\], "
                                  r"got \[3\]"),
    (np.ones((1, HK), np.float32), r"k_scale: expected shape \[1\] or \[2 \(num_kv_heads\)\]"),
    (np.ones(2 * HK, np.float32)[::2], r"k_scale: expected a contiguous array, got stride 2"),
    (np.ones(HK, np.float32).view(FakeCuda), r"k_scale: expected an array on the host \(the KV "
                                             r"cache's device"),
])
def test_kv_scale_errors_name_the_argument(k_scale, match):
    with pytest.raises(ValueError, match=match):
        C.kv_scales(k_scale, None, Fp8Stub(), HK)
    with pytest.raises(ValueError, match=match.replace("k_scale", "v_scale")):
        C.kv_scales(None, k_scale, Fp8Stub(), HK)


def test_kv_scale_device_must_be_the_caches():
    cuda_cache = Fp8Stub(device=(2, 0))
    with pytest.raises(ValueError, match=r"v_scale: expected an array on cuda:0 \(the KV cache's "
                                         r"device.*got one on the host"):
        C.kv_scales(None, np.ones(1, np.float32), cuda_cache, HK)
    s = C.kv_scales(np.ones(1, np.float32).view(FakeCuda), None, cuda_cache, HK)
    assert isinstance(s.k_tensor, FakeCuda)


@pytest.mark.parametrize("value", [0.5, 2, np.ones(1, np.float32)])
def test_non_unit_scales_on_16_bit_caches_are_refused(value):
    """FlashInfer folds k_scale / v_scale of a 16-bit cache into sm_scale; flashkv plans
    sm_scale, so a non-1 scale there is an error naming the argument and saying what to do."""
    rng = np.random.default_rng(2)
    cache = PagedCache(rng, [5, 9], PS, HK, D, np.float16, "NHD")
    q = rand(rng, (2, HQ, D), np.float16)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS)
    ref = w.run(q, (cache.k, cache.v))
    np.testing.assert_array_equal(w.run(q, (cache.k, cache.v), k_scale=1.0, v_scale=1.0), ref)
    with pytest.raises(ValueError, match=r"k_scale=.*fp8 KV caches.*f16.*into sm_scale"):
        w.run(q, (cache.k, cache.v), k_scale=value)
    with pytest.raises(ValueError, match=r"v_scale=.*f16.*multiply the output"):
        w.run(q, (cache.k, cache.v), v_scale=value)
    kc, vc = cache.gather(0)
    with pytest.raises(ValueError, match="k_scale="):
        flashkv.single_decode_with_kv_cache(q[0], kc, vc, k_scale=value)
    with pytest.raises(ValueError, match="scale_v="):
        flashkv.single_prefill_with_kv_cache(q[:1], kc, vc, scale_v=value)
    bi, pos = np.zeros(1, np.int32), np.array([4], np.int32)
    with pytest.raises(ValueError, match="k_scale="):
        flashkv.append_paged_kv_cache(kc[:1], vc[:1], bi, pos, (cache.k, cache.v), cache.indices,
                                      cache.indptr, cache.last_page_len, k_scale=value)
    with pytest.raises(ValueError, match="v_scale="):
        w.run_step(q, kc[:2], vc[:2], (cache.k, cache.v), v_scale=value)


def test_query_scales_stay_not_implemented():
    rng = np.random.default_rng(3)
    cache = PagedCache(rng, [5, 9], PS, HK, D, np.float16, "NHD")
    q = rand(rng, (2, HQ, D), np.float16)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS)
    w.run(q, (cache.k, cache.v), q_scale=1.0)
    with pytest.raises(NotImplementedError, match="q_scale"):
        w.run(q, (cache.k, cache.v), q_scale=0.5)
    with pytest.raises(NotImplementedError, match="q_scale"):
        w.run(q, (cache.k, cache.v), q_scale=np.ones(1, np.float32))
    kc, vc = cache.gather(1)
    with pytest.raises(NotImplementedError, match="scale_q"):
        flashkv.single_prefill_with_kv_cache(q[:1], kc, vc, scale_q=np.ones(HQ, np.float32))


@pytest.mark.parametrize("name, one, two", [("e4m3", 0x38, 0x40), ("float8_e4m3fn", 0x38, 0x40),
                                            ("e5m2", 0x3C, 0x40)])
def test_fp8_view(name, one, two):
    """_C.fp8_view: the bytes of an fp8 array (a uint8 view, strided too) as that fp8 array, which
    _C's ops take without ml_dtypes or a float8 DLPack export."""
    kv_len = 5
    k = np.full((kv_len, HK, D), one, np.uint8)  # 1.0
    v = np.zeros((kv_len, HK, 2 * D), np.uint8)
    v[..., ::2] = two
    v = v[..., ::2]  # 2.0, strided (its strides cross too)
    q = np.ones((HQ, D), np.float16)
    out = np.zeros((HQ, D), np.float16)
    _C.single_decode(q, _C.fp8_view(k, name), _C.fp8_view(v, name), out, None, "NHD", 0.0, 0,
                     v_scale=0.25)
    np.testing.assert_array_equal(out, np.full((HQ, D), 0.5, np.float16))
    b = np.zeros((2, 4), np.uint8)
    with pytest.raises(ValueError, match="fp8_view: expected dtype e4m3 or e5m2, got f16"):
        _C.fp8_view(b, "f16")
    with pytest.raises(ValueError, match="fp8_view: expected an 8-bit integer array"):
        _C.fp8_view(b.astype(np.float16), "e4m3")


# --- ops over fp8 caches (ml_dtypes / torch float8 host arrays) ---------------------------------


@needs_fp8
@pytest.mark.parametrize("dtype", FP8)
def test_fp8_host_arrays_carry_their_dtype(dtype):
    """dl() hands fp8 arrays to _C as a uint8 view retyped (no copy): the reference reads them."""
    a = rand(np.random.default_rng(4), (3, HK, D), np_fp8(dtype))
    out = np.empty((2, HQ, D), np.float16)
    q = rand(np.random.default_rng(5), (2, HQ, D), np.float16)
    flashkv.single_prefill_with_kv_cache(q, a, a, out=out)
    ref, _ = attention_ref(q, a.astype(np.float64), a.astype(np.float64))
    assert_close(out, ref, np.float16)


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("scales", ["float", "one", "per_head"])
def test_batch_decode_fp8(fw8, dtype, layout, scales):
    rng = np.random.default_rng(10)
    kv_lens = [1, 0, 37, PS, 16, 3]
    cache = PagedCache(rng, kv_lens, PS, HK, D, np_fp8(dtype), layout)
    q = rand(rng, (len(kv_lens), HQ, D), np.float16)
    ks, vs = scale_args(scales, fw8)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS, layout)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS,
           kv_data_type=dtype)
    out, lse = w.run(to8(q, fw8), (to8(cache.k, fw8), to8(cache.v, fw8)), k_scale=ks,
                     v_scale=vs, return_lse=True)
    # The same op over the dequantized cache in float16: equal, bit for bit.
    w16 = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS, layout)
    w16.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS)
    k16 = dequantized(cache.k, host(ks), layout)
    v16 = dequantized(cache.v, host(vs), layout)
    out16, lse16 = w16.run(q, (k16, v16), return_lse=True)
    np.testing.assert_array_equal(host(out), out16)
    np.testing.assert_array_equal(host(lse), lse16)
    for i in range(len(kv_lens)):  # and the float64 NumPy reference
        k, v = cache.gather(i)
        ref, ref_lse = attention_ref(q[i:i + 1], scaled(k, host(ks)), scaled(v, host(vs)))
        assert_close(out[i], ref[0], np.float16)
        assert_lse2(lse[i], ref_lse[0])


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("scales", ["float", "per_head"])
def test_batch_prefill_paged_fp8(fw8, dtype, interleaved, scales):
    rng = np.random.default_rng(11)
    qo, kv = [3, 17, 1, 0], [20, 17, 40, 6]
    cache = PagedCache(rng, kv, PS, HK, D, np_fp8(dtype), "HND")
    q = rand(rng, (sum(qo), HQ, D), np.float16)
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    ks, vs = scale_args(scales, fw8)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(WS, "HND")
    w.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS,
           causal=True, kv_data_type=getattr(ml_dtypes, dtype))
    kv_cache = to8(cache.kv, fw8) if interleaved else (to8(cache.k, fw8), to8(cache.v, fw8))
    out, lse = w.run(to8(q, fw8), kv_cache, k_scale=ks, v_scale=vs, return_lse=True)
    for i in range(len(qo)):
        k, v = cache.gather(i)
        rows = slice(qo_indptr[i], qo_indptr[i + 1])
        ref, ref_lse = attention_ref(q[rows], scaled(k, host(ks)), scaled(v, host(vs)),
                                     causal=True)
        assert_close(out[rows], ref, np.float16)
        assert_lse2(lse[rows], ref_lse)


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("scales", ["float", "one", "per_head"])
def test_batch_prefill_ragged_fp8(fw8, dtype, layout, scales):
    rng = np.random.default_rng(12)
    qo, kv = [4, 9, 1], [30, 9, 0]
    q = rand(rng, (sum(qo), HQ, D), np.float16)
    k = rand(rng, (sum(kv), HK, D), np_fp8(dtype))
    v = rand(rng, (sum(kv), HK, D), np_fp8(dtype))
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(kv)]).astype(np.int32)
    ks, vs = scale_args(scales, fw8)
    w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS, layout)
    w.plan(qo_indptr, kv_indptr, HQ, HK, D, causal=True, kv_data_type=dtype)
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(1, 0, 2), v.transpose(1, 0, 2))
    out = w.run(to8(q, fw8), to8(kk, fw8), to8(vv, fw8), k_scale=ks, v_scale=vs)
    for i in range(len(qo)):
        rows, keys = slice(qo_indptr[i], qo_indptr[i + 1]), slice(kv_indptr[i], kv_indptr[i + 1])
        ref, _ = attention_ref(q[rows], scaled(k[keys], host(ks)), scaled(v[keys], host(vs)),
                               causal=True)
        assert_close(out[rows], ref, np.float16)


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("scales", ["float", "one", "per_head"])
def test_single_decode_and_prefill_fp8(fw8, dtype, layout, scales):
    rng = np.random.default_rng(13)
    kv_len = 23
    q = rand(rng, (5, HQ, D), np.float16)
    k = rand(rng, (kv_len, HK, D), np_fp8(dtype))
    v = rand(rng, (kv_len, HK, D), np_fp8(dtype))
    ks, vs = scale_args(scales, fw8)
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(1, 0, 2), v.transpose(1, 0, 2))
    kk, vv = to8(kk, fw8), to8(vv, fw8)
    out, lse = flashkv.single_decode_with_kv_cache(to8(q[0], fw8), kk, vv, layout, k_scale=ks,
                                                   v_scale=vs, return_lse=True)
    ref, ref_lse = attention_ref(q[:1], scaled(k, host(ks)), scaled(v, host(vs)))
    assert_close(out, ref[0], np.float16)
    assert_lse2(lse, ref_lse[0])
    out = flashkv.single_prefill_with_kv_cache(to8(q, fw8), kk, vv, None, ks, vs, causal=True,
                                               kv_layout=layout)
    ref, _ = attention_ref(q, scaled(k, host(ks)), scaled(v, host(vs)), causal=True)
    assert_close(out, ref, np.float16)


@needs_fp8
@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_variants_with_scales_equal_the_dequantized_cache(dtype, layout):
    """Built-in variants over an fp8 cache with scales (the host runs the contiguous-KV variant
    ops as one-token pages, whose reference takes scales) equal the same variant over the
    dequantized cache in float16, bit for bit."""
    rng = np.random.default_rng(14)
    kv_len, qo_len = 29, 6
    q = rand(rng, (qo_len, HQ, D), np.float16)
    k = rand(rng, (kv_len, HK, D), np_fp8(dtype))
    v = rand(rng, (kv_len, HK, D), np_fp8(dtype))
    ks, vs = np.array([0.5, 2.0], np.float32), 0.25
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(1, 0, 2), v.transpose(1, 0, 2))
    k16 = dequantized(kk, ks, layout, paged=False)
    v16 = dequantized(vv, vs, layout, paged=False)
    variant = dict(logits_soft_cap=7.0, window_left=11)
    got = flashkv.single_decode_with_kv_cache(q[0], kk, vv, layout, k_scale=ks, v_scale=vs,
                                              return_lse=True, **variant)
    ref = flashkv.single_decode_with_kv_cache(q[0], k16, v16, layout, return_lse=True, **variant)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    got = flashkv.single_prefill_with_kv_cache(q, kk, vv, None, ks, vs, causal=True,
                                               kv_layout=layout, return_lse=True,
                                               sinks=np.linspace(-1, 1, HQ).astype(np.float32),
                                               **variant)
    ref = flashkv.single_prefill_with_kv_cache(q, k16, v16, causal=True, kv_layout=layout,
                                               return_lse=True,
                                               sinks=np.linspace(-1, 1, HQ).astype(np.float32),
                                               **variant)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    # Ragged prefill with a variant, two requests.
    qo_indptr, kv_indptr = np.array([0, 2, 6], np.int32), np.array([0, 13, 29], np.int32)
    outs = []
    for kc, vc, scale in ((kk, vv, dict(k_scale=ks, v_scale=vs)), (k16, v16, {})):
        w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS, layout)
        w.plan(qo_indptr, kv_indptr, HQ, HK, D, causal=True, kv_data_type=kc.dtype, **variant)
        outs.append(w.run(q, kc, vc, return_lse=True, **scale))
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


def quantize_ref(x, scale, dtype):
    """(x.float() / scale) converted by ml_dtypes (round to nearest even; overflow -> NaN or inf,
    where flashkv saturates): float32 division per head, as flashkv's."""
    s = np.asarray(scale, np.float32).reshape(-1)
    y = x.astype(np.float32) / (s[None, :, None] if s.size > 1 else s[0])
    return y, y.astype(np_fp8(dtype))


def check_quantized(got, x, scale, dtype):
    """got (fp8) against quantize_ref: bit for bit where the value fits the format (NaN for
    NaN), the largest finite value of x's sign where it overflows."""
    y, ref = quantize_ref(x, scale, dtype)
    got_bits, ref_bits = got.view(np.uint8), ref.view(np.uint8)
    fits = np.isfinite(y) & np.isfinite(ref.astype(np.float32))
    overflow = ~fits & ~np.isnan(y)  # infinities included
    np.testing.assert_array_equal(got_bits[fits], ref_bits[fits])
    assert np.isnan(got.astype(np.float32)[np.isnan(y)]).all()
    np.testing.assert_array_equal(got.astype(np.float32)[overflow],
                                  np.sign(y[overflow]) * MAX_FINITE[dtype])
    return int(fits.sum()), int(overflow.sum())


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("src", [np.float16, np.float32])
@pytest.mark.parametrize("scales", ["float", "per_head"])
def test_append_quantizes_like_ml_dtypes_but_saturates(fw8, dtype, src, scales):
    rng = np.random.default_rng(15)
    kv_lens = [7, 1, 20]
    cache = PagedCache(rng, kv_lens, PS, HK, D, np_fp8(dtype), "NHD")
    nnz = 9
    big = min(MAX_FINITE[dtype] * 1.5, 6e4)  # float16's largest is 65504
    key = rng.uniform(-big, big, (nnz, HK, D)).astype(src)
    value = rng.uniform(-1, 1, (nnz, HK, D)).astype(src) * rng.choice([1e-6, 1, 100], (nnz, 1, 1))
    value = value.astype(src)
    key[0, 0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    batch = np.array([0, 0, 0, 1, 2, 2, 2, 2, 2], np.int32)
    pos = np.array([0, 4, 6, 0, 3, 8, 15, 16, 19], np.int32)
    ks, vs = (0.5, 2.0) if scales == "float" else (np.array([0.5, 2.0], np.float32),
                                                   np.array([4.0, 1.0], np.float32))
    k8, v8 = to8(cache.k, fw8), to8(cache.v, fw8)
    flashkv.append_paged_kv_cache(to8(key, fw8), to8(value, fw8), to8(batch, fw8),
                                  to8(pos, fw8), (k8, v8), to8(cache.indices, fw8),
                                  to8(cache.indptr, fw8), to8(cache.last_page_len, fw8),
                                  k_scale=to8(np.asarray(ks, np.float32), fw8)
                                  if scales != "float" else ks,
                                  v_scale=to8(np.asarray(vs, np.float32), fw8)
                                  if scales != "float" else vs)
    k8, v8 = host(k8), host(v8)
    page = cache.indices[cache.indptr[batch] + pos // PS]
    slot = pos % PS
    fits, overflow = check_quantized(k8[page, slot], key, ks, dtype)
    assert fits > 0 and overflow > 0  # both cases were exercised
    check_quantized(v8[page, slot], value, vs, dtype)
    untouched = np.ones(cache.k.shape[:2], bool)
    untouched[page, slot] = False
    np.testing.assert_array_equal(k8.view(np.uint8)[untouched], cache.k.view(np.uint8)[untouched])


@needs_fp8
def test_append_copies_fp8_rows_of_the_caches_dtype():
    rng = np.random.default_rng(16)
    cache = PagedCache(rng, [6], PS, HK, D, ml_dtypes.float8_e5m2, "HND")
    key = rand(rng, (2, HK, D), ml_dtypes.float8_e5m2)
    k, v = cache.k.copy(), cache.v.copy()
    flashkv.append_paged_kv_cache(key, key, np.zeros(2, np.int32), np.array([2, 5], np.int32),
                                  (k, v), cache.indices, cache.indptr, cache.last_page_len,
                                  "HND", k_scale=4.0)  # a copy: no scale applies
    pages = cache.indices[np.array([2, 5]) // PS]
    np.testing.assert_array_equal(k[pages, :, np.array([2, 5]) % PS].view(np.uint8),
                                  key.view(np.uint8))
    with pytest.raises(ValueError, match="append_key"):  # fp8 rows of the other format
        flashkv.append_paged_kv_cache(key.astype(ml_dtypes.float8_e4m3fn), key, np.zeros(2,
                                      np.int32), np.array([2, 5], np.int32), (k, v),
                                      cache.indices, cache.indptr, cache.last_page_len, "HND")


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("scales", ["float", "per_head"])
def test_run_step_fp8_equals_append_then_run(fw8, dtype, scales):
    rng = np.random.default_rng(17)
    lens = [5, 40, 17]  # after the append: the new token is each request's last
    cache = PagedCache(rng, lens, PS, HK, D, np_fp8(dtype), "NHD")
    q = rand(rng, (3, HQ, D), np.float16)
    k_new, v_new = rand(rng, (3, HK, D), np.float16), rand(rng, (3, HK, D), np.float16)
    ks, vs = scale_args(scales, fw8)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS, kv_data_type=dtype)
    step_cache = (to8(cache.k, fw8), to8(cache.v, fw8))
    out, lse = w.run_step(to8(q, fw8), to8(k_new, fw8), to8(v_new, fw8), step_cache,
                          rope="llama31", k_scale=ks, v_scale=vs, return_lse=True)
    ref_cache = (to8(cache.k, fw8), to8(cache.v, fw8))
    pos = np.array(lens, np.int32) - 1
    q_rot, k_rot = flashkv.apply_llama31_rope_pos_ids(to8(q, fw8), to8(k_new, fw8),
                                                      to8(pos, fw8))
    flashkv.append_paged_kv_cache(k_rot, to8(v_new, fw8), to8(np.arange(3, dtype=np.int32), fw8),
                                  to8(pos, fw8), ref_cache, to8(cache.indices, fw8),
                                  to8(cache.indptr, fw8), to8(cache.last_page_len, fw8),
                                  k_scale=ks, v_scale=vs)
    ref_out, ref_lse = w.run(q_rot, ref_cache, k_scale=ks, v_scale=vs, return_lse=True)
    for a, b in zip(step_cache, ref_cache):
        np.testing.assert_array_equal(host(a).view(np.uint8), host(b).view(np.uint8))
    np.testing.assert_array_equal(host(out), host(ref_out))
    np.testing.assert_array_equal(host(lse), host(ref_lse))


@needs_fp8
def test_cascade_attention_wrapper_fp8():
    """FlashInfer's explicit cascade: each level's paged prefill reads the fp8 cache with the
    scales run() got; equal to one paged prefill over the whole page lists."""
    rng = np.random.default_rng(18)
    dtype = ml_dtypes.float8_e4m3fn
    cache = PagedCache(rng, [8, 8], PS, HK, D, dtype, "NHD", spare_pages=6)
    shared = cache.indices[:2]  # both requests start with the same two pages
    rest = np.array([p for p in range(cache.k.shape[0]) if p not in shared][:3], np.int32)
    suffix = [rest[:2], rest[2:]]
    q = rand(rng, (2, HQ, D), np.float16)
    ks, vs = np.array([0.5, 2.0], np.float32), 4.0
    w = flashkv.MultiLevelCascadeAttentionWrapper(2, WS)
    w.plan([np.array([0, 2], np.int32), np.array([0, 1, 2], np.int32)],
           [np.array([0, 2], np.int32), np.array([0, 2, 3], np.int32)],
           [shared, np.concatenate(suffix)],
           [np.array([PS], np.int32), np.array([PS, 3], np.int32)], HQ, HK, D, PS,
           kv_data_type="float8_e4m3fn")
    out = w.run(q, (cache.k, cache.v), k_scale=ks, v_scale=vs)
    full = flashkv.BatchPrefillWithPagedKVCacheWrapper(WS)
    full.plan(np.array([0, 1, 2], np.int32), np.array([0, 4, 7], np.int32),
              np.concatenate([shared, suffix[0], shared, suffix[1]]),
              np.array([PS, 3], np.int32), HQ, HK, D, PS, kv_data_type="float8_e4m3fn")
    ref = full.run(q, (cache.k, cache.v), k_scale=ks, v_scale=vs)
    np.testing.assert_allclose(out.astype(np.float32), ref.astype(np.float32), rtol=2e-3,
                               atol=2e-3)
    with pytest.raises(ValueError, match=r"v_scale: expected shape \[1\] or \[2"):
        w.run(q, (cache.k, cache.v), v_scale=np.ones(3, np.float32))


@needs_fp8
def test_run_scale_errors_on_fp8_caches():
    rng = np.random.default_rng(19)
    cache = PagedCache(rng, [5, 9], PS, HK, D, ml_dtypes.float8_e4m3fn, "NHD")
    q = rand(rng, (2, HQ, D), np.float16)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS, kv_data_type="e4m3")
    for bad, match in ((np.ones(HQ, np.float32), r"k_scale: expected shape \[1\] or \[2"),
                       (np.ones(1, np.float64), "k_scale: expected a float32 array"),
                       (np.ones(1, np.float32).view(FakeCuda), "k_scale: expected an array on "
                                                               "the host"),
                       (-2.0, "k_scale: expected a finite scale > 0")):
        with pytest.raises(ValueError, match=match):
            w.run(q, (cache.k, cache.v), k_scale=bad)
    # A cache of another dtype than the plan's: the plan check names it.
    with pytest.raises(ValueError, match=r"paged_kv_cache: expected dtype e4m3"):
        w.run(q, (cache.k.astype(ml_dtypes.float8_e5m2), cache.v.astype(ml_dtypes.float8_e5m2)))


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("decode", [True, False])
def test_multi_level_cascade_wrapper_fp8(fw8, dtype, decode):
    """flashkv's automatic cascade wrapper over an fp8 cache with its scales: on the host the
    reference of the plain attention, equal to the decode / paged prefill wrapper's answer."""
    rng = np.random.default_rng(30)
    kv_lens = [5, 9, 13, 4]
    qo = [1] * 4 if decode else [2, 1, 3, 1]
    cache = PagedCache(rng, kv_lens, PS, HK, D, np_fp8(dtype), "NHD")
    q = rand(rng, (sum(qo), HQ, D), np.float16)
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    ks, vs = scale_args("per_head", fw8)
    w = flashkv.MultiLevelCascadeWrapper(WS)
    w.plan(None if decode else qo_indptr, cache.indptr, cache.indices, cache.last_page_len, HQ,
           HK, D, PS, causal=True, kv_data_type=dtype)
    out = w.run(to8(q, fw8), (to8(cache.k, fw8), to8(cache.v, fw8)), k_scale=ks, v_scale=vs)
    if decode:
        ref = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS, "NHD")
        ref.plan(cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS,
                 kv_data_type=dtype)
    else:
        ref = flashkv.BatchPrefillWithPagedKVCacheWrapper(WS, "NHD")
        ref.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS,
                 causal=True, kv_data_type=dtype)
    want = ref.run(to8(q, fw8), (to8(cache.k, fw8), to8(cache.v, fw8)), k_scale=ks, v_scale=vs)
    np.testing.assert_array_equal(host(out), host(want))
    with pytest.raises(ValueError, match="kv_data_type"):
        w.plan(None, cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS,
               q_data_type="float16", kv_data_type="bfloat16")
