"""Quantized KV formats on the host path (flashkv.kv_quant; issue 42): the quantizers' closed forms
and their agreement between NumPy and torch, the decode and paged prefill wrappers over each format
equal to the same wrappers over the dequantized float32 cache (and close to the float64 NumPy
reference), and the named errors: missing / extra group scales, bad scale values, shapes and
dtypes (outputs untouched), ragged KV and variants with a format, unknown format names. GPU plans
refuse every format with NotImplementedError (run where a GPU is present)."""

import numpy as np
import pytest

import flashkv
from conftest import GPU, HAVE_TORCH, PagedCache, attention_ref, rand
from flashkv import kv_quant

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

HQ, HK, D, PS = 8, 2, 128, 16
FORMATS = list(kv_quant.FORMATS)
# fp8 values need a float8 array type on the host: ml_dtypes (NumPy) or torch.
needs_fp8 = pytest.mark.skipif(ml_dtypes is None and not HAVE_TORCH,
                               reason="needs ml_dtypes or torch for float8 arrays")


def host_fw():
    return "torch" if HAVE_TORCH else "numpy"


def as_fw(a, fw):
    if fw == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(a))
    return a


def f32(x):
    if hasattr(x, "numpy"):
        return x.float().numpy()
    return np.asarray(x, dtype=np.float32)


def formats_for(fw):
    """Formats a framework can hold: fp8 values need ml_dtypes with NumPy."""
    if fw == "numpy" and ml_dtypes is None:
        return [f for f in FORMATS if not f.endswith("per-token") and f != "nvfp4"]
    return FORMATS


def test_int4_grid_is_exact_and_packs_low_nibble_first():
    x = (-3.0 + 0.5 * (np.arange(64) % 16)).astype(np.float32).reshape(1, 64)
    q = flashkv.quantize_kv(x, "int4-g32")
    assert q.values.dtype == np.uint8 and q.values.shape == (1, 32)
    assert q.values[0, 0] == 0x10 and q.values[0, 1] == 0x32
    np.testing.assert_array_equal(q.scales, [[0.5, 0.5]])
    np.testing.assert_array_equal(q.zeros, [[-3.0, -3.0]])
    np.testing.assert_array_equal(flashkv.dequantize_kv(q.values, q.scales, q.zeros, "int4-g32"),
                                  x)


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
@pytest.mark.parametrize("fmt", FORMATS)
def test_numpy_and_torch_quantize_alike(fmt):
    import torch

    x = np.random.default_rng(1).standard_normal((3, 4, 2, D)).astype(np.float32)
    t = flashkv.quantize_kv(torch.from_numpy(x), fmt)
    back = flashkv.dequantize_kv(t.values, t.scales, t.zeros, fmt, t.tensor_scale)
    assert tuple(back.shape) == x.shape
    if formats_for("numpy") == FORMATS:
        n = flashkv.quantize_kv(x, fmt)
        assert n.tensor_scale == t.tensor_scale
        np.testing.assert_array_equal(
            f32(flashkv.dequantize_kv(n.values, n.scales, n.zeros, fmt, n.tensor_scale)),
            back.numpy())
    # The error is the format's: small against the values.
    err = np.abs(back.numpy() - x).max() / np.abs(x).max()
    assert err < {"e4m3-per-token": 0.07, "e5m2-per-token": 0.13, "nvfp4": 0.2}.get(fmt, 0.1)


def quantized_cache(rng, kv_lens, layout, fmt, fw):
    c = PagedCache(rng, kv_lens, PS, HK, D, np.float32, layout)
    k, v = as_fw(c.k, fw), as_fw(c.v, fw)
    qk = flashkv.quantize_kv(k, fmt)
    qv = flashkv.quantize_kv(v, fmt, tensor_scale=qk.tensor_scale)
    kd = f32(flashkv.dequantize_kv(qk.values, qk.scales, qk.zeros, fmt, qk.tensor_scale))
    vd = f32(flashkv.dequantize_kv(qv.values, qv.scales, qv.zeros, fmt, qv.tensor_scale))
    run_args = dict(k_scale=qk.tensor_scale, v_scale=qv.tensor_scale, k_group_scale=qk.scales,
                    v_group_scale=qv.scales, k_zero=qk.zeros, v_zero=qv.zeros)
    return c, (qk.values, qv.values), run_args, (kd, vd)


@needs_fp8
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_equals_the_dequantized_cache(fmt, layout):
    fw = host_fw()
    rng = np.random.default_rng(2)
    kv_lens = [1, 40, 0, 70]
    c, cache, run_args, deq = quantized_cache(rng, kv_lens, layout, fmt, fw)
    q = rand(rng, (len(kv_lens), HQ, D), np.float32)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(np.empty(16, np.uint8), layout)
    w.plan(c.indptr, c.indices, c.last_page_len, HQ, HK, D, PS, q_data_type="float32",
           kv_data_type=fmt)
    out, lse = w.run(as_fw(q, fw), cache, return_lse=True, **run_args)
    ref = flashkv.BatchDecodeWithPagedKVCacheWrapper(np.empty(16, np.uint8), layout)
    ref.plan(c.indptr, c.indices, c.last_page_len, HQ, HK, D, PS, q_data_type="float32")
    out_d, lse_d = ref.run(q, deq, return_lse=True)
    np.testing.assert_allclose(f32(out), out_d, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(f32(lse), lse_d, rtol=1e-5, atol=1e-6)
    # And against the float64 NumPy reference over the dequantized keys / values.
    kd, vd = deq
    dq = PagedCache.__new__(PagedCache)
    dq.__dict__.update(c.__dict__, k=kd, v=vd)
    for i, n in enumerate(kv_lens):
        if n:
            ki, vi = dq.gather(i)
            np.testing.assert_allclose(f32(out)[i], attention_ref(q[i:i + 1], ki, vi)[0][0],
                                       rtol=1e-4, atol=1e-5)


@needs_fp8
@pytest.mark.parametrize("fmt", ["e4m3-per-token", "int4-g64", "nvfp4"])
def test_paged_prefill_equals_the_dequantized_cache(fmt):
    fw = host_fw()
    rng = np.random.default_rng(3)
    kv_lens = [33, 17]
    c, cache, run_args, deq = quantized_cache(rng, kv_lens, "NHD", fmt, fw)
    qo_indptr = np.array([0, 5, 8], np.int32)
    q = rand(rng, (8, HQ, D), np.float16)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(np.empty(16, np.uint8), "NHD")
    w.plan(qo_indptr, c.indptr, c.indices, c.last_page_len, HQ, HK, D, PS, causal=True,
           q_data_type="float16", kv_data_type=fmt)
    out = w.run(as_fw(q, fw), cache, **run_args)
    ref = flashkv.BatchPrefillWithPagedKVCacheWrapper(np.empty(16, np.uint8), "NHD")
    ref.plan(qo_indptr, c.indptr, c.indices, c.last_page_len, HQ, HK, D, PS, causal=True,
             q_data_type="float32")
    out_d = ref.run(q.astype(np.float32), deq)
    np.testing.assert_allclose(f32(out), out_d, rtol=2e-3, atol=2e-3)  # out is float16


def planned(fmt, layout="NHD"):
    rng = np.random.default_rng(4)
    c, cache, run_args, _ = quantized_cache(rng, [20, 5], layout, fmt, host_fw())
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(np.empty(16, np.uint8), layout)
    w.plan(c.indptr, c.indices, c.last_page_len, HQ, HK, D, PS, q_data_type="float16",
           kv_data_type=fmt)
    q = as_fw(rand(rng, (2, HQ, D), np.float16), host_fw())
    return w, q, cache, run_args


def test_run_names_missing_and_extra_group_scales():
    w, q, cache, args = planned("int4-g64")
    with pytest.raises(ValueError, match="k_group_scale: the plan's kv_data_type int4-g64 needs"):
        w.run(q, cache, **dict(args, k_group_scale=None))
    with pytest.raises(ValueError, match="v_zero: the plan's kv_data_type int4-g64 needs"):
        w.run(q, cache, **dict(args, v_zero=None))
    w2, q2, cache2, args2 = planned("nvfp4")
    with pytest.raises(ValueError, match="k_zero: nvfp4 has no zero points"):
        w2.run(q2, cache2, **dict(args2, k_zero=args["k_zero"]))
    plain = flashkv.BatchDecodeWithPagedKVCacheWrapper(np.empty(16, np.uint8), "NHD")
    plain.plan(np.array([0, 1], np.int32), np.array([0], np.int32), np.array([3], np.int32), HQ,
               HK, D, PS)
    with pytest.raises(ValueError, match="k_group_scale: group scales belong to a quantized"):
        plain.run(q[:1], (np.zeros((1, PS, HK, D), np.float16),) * 2,
                  k_group_scale=np.ones((1, PS, HK, 1), np.float32))


def test_bad_scale_values_shapes_and_dtypes_are_named_and_out_untouched():
    w, q, cache, args = planned("int4-g64")
    fw = host_fw()
    out = as_fw(np.full((2, HQ, D), 7.0, np.float16), fw)
    bad = args["k_group_scale"].clone() if fw == "torch" else args["k_group_scale"].copy()
    bad[1, 2, 0, 0] = -1.0
    with pytest.raises(ValueError, match=r"paged_kv.scale.k_group_scale\[1, 2, 0, 0\] = -1: "
                                         r"expected a finite scale >= 0"):
        w.run(q, cache, out=out, **dict(args, k_group_scale=bad))
    bad[1, 2, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="k_group_scale.* = nan"):
        w.run(q, cache, out=out, **dict(args, k_group_scale=bad))
    assert (f32(out) == 7.0).all()
    wrong = bad.repeat(1, 1, 1, 2) if fw == "torch" else np.repeat(bad, 2, axis=3)
    with pytest.raises(ValueError, match=r"k_group_scale: expected shape \[\d+, 16, 2, 2\] "
                                         r"\(paged_kv.k's NHD shape with head_dim 128 -> 2 groups"):
        w.run(q, cache, out=out, **dict(args, k_group_scale=wrong))
    assert (f32(out) == 7.0).all()


def test_wrong_scale_dtype_is_named():
    w, q, cache, args = planned("int4-g64")
    v64 = np.asarray(f32(args["v_group_scale"]), np.float64)
    with pytest.raises((ValueError, TypeError), match="v_group_scale"):
        w.run(q, cache, **dict(args, v_group_scale=v64))


def test_ragged_prefill_and_variants_refuse_formats():
    w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(np.empty(16, np.uint8))
    ind = np.array([0, 4], np.int32)
    with pytest.raises(ValueError, match="kv_format: int4-g64 is read from a paged cache only"):
        w.plan(ind, ind, HQ, HK, D, kv_data_type="int4-g64")
    d = flashkv.BatchDecodeWithPagedKVCacheWrapper(np.empty(16, np.uint8), "NHD")
    with pytest.raises(NotImplementedError, match="attention variants over a quantized format"):
        d.plan(np.array([0, 1], np.int32), np.array([0], np.int32), np.array([3], np.int32), HQ,
               HK, D, PS, kv_data_type="nvfp4", logits_soft_cap=30.0)


def test_format_names():
    d = flashkv.BatchDecodeWithPagedKVCacheWrapper(np.empty(16, np.uint8), "NHD")
    args = (np.array([0, 1], np.int32), np.array([0], np.int32), np.array([3], np.int32), HQ, HK,
            64, PS)
    with pytest.raises(ValueError, match="int4-g128's group of 128 elements does not divide "
                                         "head_dim 64"):
        d.plan(*args, kv_data_type="int4-g128")
    with pytest.raises(ValueError, match="unsupported data type 'int4-g48'"):
        d.plan(*args, kv_data_type="int4-g48")
    d.plan(*args, kv_data_type="fp8_e4m3_per_token")  # FlashInfer-style spelling
    with pytest.raises(ValueError, match="kv_data_type: expected one of"):
        flashkv.quantize_kv(np.zeros((1, 64), np.float32), "f16")


def test_quantize_refuses_non_finite_input():
    x = np.zeros((2, 64), np.float32)
    x[1, 6] = np.inf
    with pytest.raises(ValueError, match="x: row 1, element 6 is inf: expected finite values"):
        flashkv.quantize_kv(x, "int4-g64")


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU and torch")
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_plans_refuse_every_format(fmt):
    import torch

    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    ind = torch.tensor([0, 1], dtype=torch.int32)
    for w in (flashkv.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD"),):
        with pytest.raises(NotImplementedError, match=f"{fmt} has no GPU kernel yet .issue 42."):
            w.plan(ind, torch.tensor([0], dtype=torch.int32), torch.tensor([3], dtype=torch.int32),
                   HQ, HK, D, PS, kv_data_type=fmt)
    p = flashkv.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    with pytest.raises(NotImplementedError, match="issue 42"):
        p.plan(ind, ind, torch.tensor([0], dtype=torch.int32),
               torch.tensor([3], dtype=torch.int32), HQ, HK, D, PS, kv_data_type=fmt)


@pytest.mark.skipif(ml_dtypes is None, reason="the script needs ml_dtypes")
def test_accuracy_script_runs_small(tmp_path):
    """scripts/kv_quant_accuracy.py (the committed accuracy table's generator) at a tiny size."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(root / "scripts" / "kv_quant_accuracy.py"), "--batch",
                        "1", "--kv-len", "64", "--q-heads", "4", "--kv-heads", "2",
                        "--outlier-tokens", "0", "--out-dir", str(tmp_path)],
                       capture_output=True, text=True, check=True)
    assert "| int4-g64 |" in r.stdout and "| nvfp4 |" in r.stdout
    assert "e4m3 per-token-head" in r.stdout
    assert len(list(tmp_path.glob("kv-quant-accuracy-*.json"))) == 1
