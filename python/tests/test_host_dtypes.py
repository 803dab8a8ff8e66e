"""Every wrapper's host path (CPU reference) over every q / KV dtype, in every host framework
that has the dtype: torch CPU tensors in float16, bfloat16, float8_e4m3fn, float8_e5m2 (fp8: KV
only, q 16-bit), NumPy arrays in float16 and (ml_dtypes) float8.

Each run is compared with the same wrapper planned and run in float32 over the same values (the
16-bit / fp8 inputs widened exactly), so what is checked is the dtype handling of the host path:
the conversions before the reference, the outputs allocated in the right dtype, lse in base 2.
Outputs start as NaN (poisoned) where the wrapper takes out=. Issue 43: the variable block-sparse
wrapper raised ``TypeError: Got unsupported ScalarType BFloat16`` for bf16 / fp8 torch tensors.
"""

import numpy as np
import pytest

import flashkv
from conftest import HAVE_TORCH

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

HQ, HK, D, PS = 4, 2, 64, 4
WS = np.empty(16, np.uint8)  # a host workspace: the wrappers run the CPU reference
K_SCALE, V_SCALE = 0.5, 2.0  # fp8 dequantization scales (powers of two: exact in f32)

# (framework, q dtype, kv dtype) for every combination the framework can hold.
CASES = []
if HAVE_TORCH:
    CASES += [("torch", "float16", "float16"), ("torch", "bfloat16", "bfloat16")]
    CASES += [("torch", q, kv) for q in ("float16", "bfloat16")
              for kv in ("float8_e4m3fn", "float8_e5m2")]
CASES += [("numpy", "float16", "float16")]
if ml_dtypes is not None:
    CASES += [("numpy", "float16", "float8_e4m3fn"), ("numpy", "float16", "float8_e5m2")]


def _np_dtype(name):
    return np.float16 if name == "float16" else getattr(ml_dtypes, name)


class Arrays:
    """Random arrays of one case: `make` rounds to the case's dtype, `wide` the same values in
    float32 (the reference run's input)."""

    def __init__(self, fw, q_dtype, kv_dtype, seed):
        self.fw, self.q_dtype, self.kv_dtype = fw, q_dtype, kv_dtype
        self.rng = np.random.default_rng(seed)

    def _make(self, shape, dtype, lo=-1.0):
        a = self.rng.uniform(lo, 1.0, size=shape).astype(np.float32)
        if self.fw == "torch":
            import torch

            return torch.from_numpy(a).to(getattr(torch, dtype))
        return a.astype(_np_dtype(dtype))

    def q(self, *shape):
        return self._make(shape, self.q_dtype)

    def kv(self, *shape):
        return self._make(shape, self.kv_dtype)

    def wide(self, x, scale=1.0):
        """float32, times a dequantization scale (fp8 KV)."""
        if self.fw == "torch":
            return x.float() * scale
        return x.astype(np.float32) * np.float32(scale)

    @property
    def fp8(self):
        return self.kv_dtype.startswith("float8")

    def scales(self):
        """run()'s k_scale / v_scale for this case (fp8 only: a 16-bit cache takes none)."""
        return dict(k_scale=K_SCALE, v_scale=V_SCALE) if self.fp8 else {}

    def wide_kv(self, k, v):
        ks, vs = (K_SCALE, V_SCALE) if self.fp8 else (1.0, 1.0)
        return self.wide(k, ks), self.wide(v, vs)

    def ints(self, values):
        a = np.asarray(values, dtype=np.int32)
        if self.fw == "torch":
            import torch

            return torch.from_numpy(a)
        return a

    def nan(self, like, shape, dtype=None):
        """A NaN-filled (poisoned) output in like's framework."""
        if self.fw == "torch":
            import torch

            return torch.full(shape, float("nan"), dtype=dtype or like.dtype)
        return np.full(shape, np.nan, dtype=like.dtype if dtype is None else dtype)


def _f64(x):
    if type(x).__module__.startswith("torch"):
        return x.detach().float().numpy().astype(np.float64)
    return np.asarray(x).astype(np.float64)


def _check(got, want, q_dtype, what, roundings=2):
    """got (q's dtype) against the float32 run of the same values: within `roundings` roundings
    to the output dtype (bf16 2^-8, f16 2^-11; a cascade rounds each level's state, then the
    merge), relative (at most 1e-2) and absolute (values and states are at most 1 in magnitude:
    V is uniform in [-1, 1)); NaN never passes."""
    g, w = _f64(got), _f64(want)
    assert g.shape == w.shape, (what, g.shape, w.shape)
    assert np.isfinite(g).all(), f"{what}: non-finite values in the output"
    tol = roundings * (2.0**-8 if q_dtype == "bfloat16" else 2.0**-11)
    err = np.abs(g - w)
    assert (err <= min(tol, 1e-2) * np.abs(w) + tol / 2).all(), (
        f"{what}: max error {err.max():.3g}")


def _check_lse(got, want, what):
    g, w = _f64(got), _f64(want)
    assert np.isfinite(g).all(), f"{what}: non-finite lse"
    np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3, err_msg=what)


def _dtype_of(x):
    return str(x.dtype).replace("torch.", "")


@pytest.fixture(params=CASES, ids=["-".join(c) for c in CASES])
def arr(request):
    return Arrays(*request.param, seed=abs(hash(request.node.name)) % (2**32))


def _paged(arr, lens):
    """A paged cache holding requests of `lens` tokens, pages shuffled."""
    pages = [(n + PS - 1) // PS for n in lens]
    total = sum(pages) + 1
    k = arr.kv(total, PS, HK, D)
    v = arr.kv(total, PS, HK, D)
    ids = arr.rng.permutation(total)[:sum(pages)]
    indptr = np.concatenate([[0], np.cumsum(pages)])
    last = np.array([(n - 1) % PS + 1 for n in lens])
    return k, v, arr.ints(indptr), arr.ints(ids), arr.ints(last)


def test_decode_wrapper(arr):
    k, v, indptr, ids, last = _paged(arr, [9, 1, 16])
    q = arr.q(3, HQ, D)

    def run(q, k, v, q_dt, kv_dt, scales):
        w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
        w.plan(indptr, ids, last, HQ, HK, D, PS, q_data_type=q_dt, kv_data_type=kv_dt)
        out = arr.nan(q, (3, HQ, D))
        return w.run(q, (k, v), out=out, return_lse=True, **scales)

    out, lse = run(q, k, v, arr.q_dtype, arr.kv_dtype, arr.scales())
    assert _dtype_of(out) == arr.q_dtype
    ref, ref_lse = run(arr.wide(q), *arr.wide_kv(k, v), "float32", "float32", {})
    _check(out, ref, arr.q_dtype, "decode")
    _check_lse(lse, ref_lse, "decode lse")


def test_sparse_kv_decode_head_pages(arr):
    """Sparse-KV decode: per (request, KV head) token selections over head_pages' view."""
    k, v, _, _, _ = _paged(arr, [12])
    sel = [[0, 3, 5], [1, 2, 7, 11]]  # one request, each KV head its own tokens (NHD view)
    ids = np.concatenate([[(t // PS * PS + t % PS) * HK + h for t in s] for h, s in enumerate(sel)])
    indptr = arr.ints(np.cumsum([0] + [len(s) for s in sel]))
    ids, last = arr.ints(ids), arr.ints([1, 1])
    q = arr.q(1, HQ, D)

    def run(q, k, v, q_dt, kv_dt, scales):
        w = flashkv.BatchDecodeWithPagedKVCacheWrapper(WS)
        w.plan(indptr, ids, last, HQ // HK, 1, D, 1, q_data_type=q_dt, kv_data_type=kv_dt)
        kp, vp = flashkv.head_pages(k), flashkv.head_pages(v)
        return w.run(q.reshape(HK, HQ // HK, D), (kp, vp), **scales)

    out = run(q, k, v, arr.q_dtype, arr.kv_dtype, arr.scales())
    ref = run(arr.wide(q), *arr.wide_kv(k, v), "float32", "float32", {})
    _check(out, ref, arr.q_dtype, "sparse-KV decode")


def test_single_decode(arr):
    q, k, v = arr.q(HQ, D), arr.kv(13, HK, D), arr.kv(13, HK, D)
    sc = arr.scales()
    out, lse = flashkv.single_decode_with_kv_cache(q, k, v, return_lse=True, **sc)
    assert _dtype_of(out) == arr.q_dtype
    ref, ref_lse = flashkv.single_decode_with_kv_cache(arr.wide(q), *arr.wide_kv(k, v),
                                                       return_lse=True)
    _check(out, ref, arr.q_dtype, "single decode")
    _check_lse(lse, ref_lse, "single decode lse")


def test_prefill_paged(arr):
    k, v, indptr, ids, last = _paged(arr, [9, 5])
    qo = arr.ints([0, 3, 8])
    q = arr.q(8, HQ, D)

    def run(q, k, v, q_dt, kv_dt, scales):
        w = flashkv.BatchPrefillWithPagedKVCacheWrapper(WS)
        w.plan(qo, indptr, ids, last, HQ, HK, D, PS, causal=True, q_data_type=q_dt,
               kv_data_type=kv_dt)
        return w.run(q, (k, v), out=arr.nan(q, (8, HQ, D)), return_lse=True, **scales)

    out, lse = run(q, k, v, arr.q_dtype, arr.kv_dtype, arr.scales())
    ref, ref_lse = run(arr.wide(q), *arr.wide_kv(k, v), "float32", "float32", {})
    _check(out, ref, arr.q_dtype, "paged prefill")
    _check_lse(lse, ref_lse, "paged prefill lse")


def test_prefill_ragged(arr):
    k, v = arr.kv(14, HK, D), arr.kv(14, HK, D)
    qo, kvp = arr.ints([0, 3, 8]), arr.ints([0, 6, 14])
    q = arr.q(8, HQ, D)

    def run(q, k, v, q_dt, kv_dt, scales):
        w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(WS)
        w.plan(qo, kvp, HQ, HK, D, causal=True, q_data_type=q_dt, kv_data_type=kv_dt)
        return w.run(q, k, v, return_lse=True, **scales)

    out, lse = run(q, k, v, arr.q_dtype, arr.kv_dtype, arr.scales())
    ref, ref_lse = run(arr.wide(q), *arr.wide_kv(k, v), "float32", "float32", {})
    _check(out, ref, arr.q_dtype, "ragged prefill")
    _check_lse(lse, ref_lse, "ragged prefill lse")


def test_single_prefill(arr):
    q, k, v = arr.q(5, HQ, D), arr.kv(11, HK, D), arr.kv(11, HK, D)
    sc = {"scale_k": K_SCALE, "scale_v": V_SCALE} if arr.fp8 else {}
    out = flashkv.single_prefill_with_kv_cache(q, k, v, causal=True, **sc)
    assert _dtype_of(out) == arr.q_dtype
    ref = flashkv.single_prefill_with_kv_cache(arr.wide(q), *arr.wide_kv(k, v), causal=True)
    _check(out, ref, arr.q_dtype, "single prefill")


def test_cascade(arr):
    """FlashInfer's two-level cascade (a shared prefix, then each request's suffix) and
    flashkv's, which finds the shared prefix itself."""
    k, v, _, _, _ = _paged(arr, [12, 8])
    q = arr.q(2, HQ, D)
    levels = dict(qo=[arr.ints([0, 2]), arr.ints([0, 1, 2])],
                  indptr=[arr.ints([0, 2]), arr.ints([0, 1, 3])],
                  ids=[arr.ints([4, 1]), arr.ints([0, 2, 3])],
                  last=[arr.ints([PS]), arr.ints([3, 2])])

    def run(q, k, v, q_dt, kv_dt, scales):
        w = flashkv.MultiLevelCascadeAttentionWrapper(2, WS)
        w.plan(levels["qo"], levels["indptr"], levels["ids"], levels["last"], HQ, HK, D, PS,
               q_data_type=q_dt, kv_data_type=kv_dt)
        return w.run(q, (k, v), return_lse=True, **scales)

    out, lse = run(q, k, v, arr.q_dtype, arr.kv_dtype, arr.scales())
    ref, ref_lse = run(arr.wide(q), *arr.wide_kv(k, v), "float32", "float32", {})
    _check(out, ref, arr.q_dtype, "cascade", roundings=3)
    _check_lse(lse, ref_lse, "cascade lse")

    def run_own(q, k, v, q_dt, kv_dt, scales):
        w = flashkv.MultiLevelCascadeWrapper(WS)
        w.plan(arr.ints([0, 1, 2]), arr.ints([0, 3, 5]), arr.ints([4, 1, 0, 4, 1]),
               arr.ints([2, 3]), HQ, HK, D, PS, q_data_type=q_dt, kv_data_type=kv_dt,
               use_cascade="always", min_group_size=2)
        return w.run(q, (k, v), **scales)

    out = run_own(q, k, v, arr.q_dtype, arr.kv_dtype, arr.scales())
    ref = run_own(arr.wide(q), *arr.wide_kv(k, v), "float32", "float32", {})
    _check(out, ref, arr.q_dtype, "flashkv cascade", roundings=3)


def test_block_sparse(arr):
    M, N, R, C = 8, 12, 2, 4
    indptr, ids = arr.ints([0, 1, 3, 3, 5]), arr.ints([0, 0, 2, 1, 2])
    q, k, v = arr.q(M, HQ, D), arr.kv(N, HK, D), arr.kv(N, HK, D)

    def run(q, k, v, q_dt, kv_dt, scales):
        w = flashkv.BlockSparseAttentionWrapper(WS)
        w.plan(indptr, ids, M, N, R, C, HQ, HK, D, causal=True, q_data_type=q_dt,
               kv_data_type=kv_dt)
        return w.run(q, k, v, return_lse=True, **scales)

    out, lse = run(q, k, v, arr.q_dtype, arr.kv_dtype, arr.scales())
    ref, ref_lse = run(arr.wide(q), *arr.wide_kv(k, v), "float32", "float32", {})
    _check(out, ref, arr.q_dtype, "block sparse")
    finite = np.isfinite(_f64(ref_lse))  # rows without a visible block: -inf in both
    np.testing.assert_array_equal(np.isfinite(_f64(lse)), finite)
    _check_lse(_f64(lse)[finite], _f64(ref_lse)[finite], "block sparse lse")


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_variable_block_sparse(arr, layout):
    M, N = 7, 10
    mask = np.array([[[1, 0, 1], [0, 1, 1]], [[1, 1, 0], [1, 0, 1]]], dtype=bool)
    rows = arr.ints([[3, 4], [5, 2]])
    cols = arr.ints([[4, 4, 2], [1, 6, 3]])
    if arr.fw == "torch":
        import torch

        mask = torch.from_numpy(mask)
    shape_q, shape_kv = ((HQ, M, D), (HK, N, D)) if layout == "HND" else ((M, HQ, D), (N, HK, D))
    q, k, v = arr.q(*shape_q), arr.kv(*shape_kv), arr.kv(*shape_kv)

    def run(q, k, v, q_dt, kv_dt, scales):
        w = flashkv.VariableBlockSparseAttentionWrapper(WS, layout=layout)
        w.plan(mask, rows, cols, HQ, HK, D, q_data_type=q_dt, kv_data_type=kv_dt)
        return w.run(q, k, v, out=arr.nan(q, shape_q), return_lse=True, **scales)

    out, lse = run(q, k, v, arr.q_dtype, arr.kv_dtype, arr.scales())
    assert _dtype_of(out) == arr.q_dtype
    ref, ref_lse = run(arr.wide(q), *arr.wide_kv(k, v), "float32", "float32", {})
    _check(out, ref, arr.q_dtype, "variable block sparse")
    _check_lse(lse, ref_lse, "variable block sparse lse")
