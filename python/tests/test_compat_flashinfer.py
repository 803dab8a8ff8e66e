"""flashkv.compat.flashinfer, the FlashInfer-compatible namespace (issue 43), on the host path:
installed as `flashinfer`, its wrappers are flashkv's (same results), FlashInfer's float scales on
16-bit caches follow FlashInfer's math, missing features raise NotImplementedError naming them,
and install / uninstall leave sys.modules clean."""

import sys
import types

import numpy as np
import pytest

import flashkv
import flashkv.compat
from conftest import PagedCache, rand

WS = np.empty(64, np.uint8)
HQ, HK, D, PS = 4, 2, 64, 4


@pytest.fixture
def fi():
    ns = flashkv.compat.install_as_flashinfer()
    yield ns
    flashkv.compat.uninstall_flashinfer()


def test_import_as_flashinfer(fi):
    import flashinfer
    import flashinfer.decode
    from flashinfer.utils import PosEncodingMode, get_compute_capability  # noqa: F401

    assert flashinfer is fi
    assert flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper is \
        fi.BatchDecodeWithPagedKVCacheWrapper
    assert issubclass(flashinfer.BatchDecodeWithPagedKVCacheWrapper,
                      flashkv.BatchDecodeWithPagedKVCacheWrapper)
    assert PosEncodingMode.ROPE_LLAMA.name == "ROPE_LLAMA"


def test_wrappers_give_flashkvs_results(fi):
    rng = np.random.default_rng(1)
    cache = PagedCache(rng, [9, 20], PS, HK, D, np.float16, "NHD")
    q = rand(rng, (2, HQ, D), np.float16)
    args = (cache.indptr, cache.indices, cache.last_page_len, HQ, HK, D, PS)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(WS, "NHD")
    w.plan(*args)
    assert w._plan_info is not None
    ref = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
    ref.plan(*args)
    np.testing.assert_array_equal(w.run(q, (cache.k, cache.v)), ref.run(q, (cache.k, cache.v)))


def test_16bit_cache_scales_follow_flashinfer(fi):
    """FlashInfer's test_kv_scale_forwarding_math_property: k_scale scales the logits, v_scale
    the output, on a float16 cache."""
    rng = np.random.default_rng(2)
    cache = PagedCache(rng, [40], PS, 1, D, np.float16, "NHD")
    q = rand(rng, (40, 1, D), np.float16)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(WS)
    w.plan(np.array([0, 40], np.int32), cache.indptr, cache.indices, cache.last_page_len, 1, 1,
           D, PS, causal=True)
    kv = (cache.k, cache.v)
    out1, _ = w.forward_return_lse(q, kv, k_scale=0.5)
    out1_ref, _ = w.forward_return_lse((q * np.float16(0.5)).astype(np.float16), kv)
    np.testing.assert_allclose(out1, out1_ref, rtol=1e-3, atol=1e-3)
    out2, _ = w.forward_return_lse(q, kv, v_scale=2.0)
    np.testing.assert_allclose(out2, w.run(q, kv) * np.float16(2.0), rtol=1e-3, atol=1e-3)
    single = fi.single_prefill_with_kv_cache(q, cache.gather(0)[0], cache.gather(0)[1],
                                             causal=True, v_scale=2.0)
    np.testing.assert_allclose(single, out2, rtol=2e-3, atol=2e-3)


def test_missing_features_name_themselves(fi):
    import flashinfer
    from flashinfer.cute_dsl.attention import cute_dsl_mla_decode
    from flashinfer.prefill import trtllm_fmha_v2_prefill

    for fn, name in ((cute_dsl_mla_decode, "cute_dsl_mla_decode"),
                     (trtllm_fmha_v2_prefill, "trtllm_fmha_v2_prefill"),
                     (flashinfer.BatchAttentionWithAttentionSinkWrapper,
                      "BatchAttentionWithAttentionSinkWrapper"),
                     (flashinfer.xqa, "xqa")):
        with pytest.raises(NotImplementedError, match=name):
            fn(WS)
    with pytest.raises(NotImplementedError, match="o_data_type"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(WS).plan(
            np.array([0, 1], np.int32), np.array([0], np.int32), np.array([1], np.int32), HQ,
            HK, D, PS, o_data_type="float32")


def test_install_refuses_a_real_flashinfer_and_uninstalls_cleanly():
    sys.modules["flashinfer"] = types.ModuleType("flashinfer")
    try:
        with pytest.raises(RuntimeError, match="imported already"):
            flashkv.compat.install_as_flashinfer()
    finally:
        del sys.modules["flashinfer"]
    flashkv.compat.install_as_flashinfer()
    import flashinfer.some_backend  # noqa: F401  (a stand-in)

    flashkv.compat.uninstall_flashinfer()
    assert not [k for k in sys.modules if k == "flashinfer" or k.startswith("flashinfer.")]
