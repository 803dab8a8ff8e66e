"""The torch custom ops (flashkv._torch_ops) on any machine: flashkv imports without torch and
never imports it; with torch, every op passes torch.library.opcheck, and torch.compile
(fullgraph=True) traces the public functions and wrappers into the ops, bitwise equal to eager.

The ops' bodies are the eager Python paths, which run the CPU reference on host tensors, so these
tests run them on CPU tensors: the public API routes only torch CUDA tensors to the ops
(_torch_ops.wants), which the `routed` fixture widens to CPU tensors. The GPU kernels through
the ops are covered by test_gpu_torch.py."""

import os
import subprocess
import sys

import numpy as np
import pytest

import flashkv
from conftest import PagedCache

try:
    import torch

    HAVE_OPS = hasattr(torch.library, "custom_op")
except ImportError:
    torch, HAVE_OPS = None, False
if HAVE_OPS:
    from flashkv import _torch_ops
needs_ops = pytest.mark.skipif(not HAVE_OPS, reason="needs torch >= 2.4 (torch.library.custom_op)")

OPS = ["batch_decode_run", "batch_decode_run_out", "batch_prefill_paged_run",
       "batch_prefill_paged_run_out", "batch_prefill_ragged_run", "batch_prefill_ragged_run_out",
       "merge_state", "merge_state_in_place", "merge_states", "append_paged_kv_cache",
       "rope_pos_ids", "rope_pos_ids_"]
HQ, HK, D, PS = 8, 2, 64, 16


@pytest.fixture
def routed(monkeypatch):
    """The public API routes CPU torch tensors through the ops too, and eager calls as under
    torch.compile (where it routes them; eagerly it calls the bodies directly)."""
    monkeypatch.setattr(_torch_ops, "wants", lambda x: isinstance(x, torch.Tensor))
    monkeypatch.setattr(_torch_ops, "tracing", lambda: True)


def t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def rnd(rng, shape, dtype=np.float16):
    return t(rng.uniform(-1, 1, shape).astype(dtype))


def host_ws():
    return np.empty(1, np.uint8)


def decode_setup(seed=0, layout="NHD"):
    rng = np.random.default_rng(seed)
    c = PagedCache(rng, [5, 40, 17, 0], PS, HK, D, np.float16, layout)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(host_ws(), layout)
    w.plan(c.indptr, c.indices, c.last_page_len, HQ, HK, D, PS, q_data_type="float16")
    return w, c, rnd(rng, (4, HQ, D))


def prefill_setup(seed=1):
    rng = np.random.default_rng(seed)
    qo, kv = [3, 17, 1], [20, 17, 40]
    c = PagedCache(rng, kv, PS, HK, D, np.float16, "NHD")
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(host_ws(), "NHD")
    w.plan(qo_indptr, c.indptr, c.indices, c.last_page_len, HQ, HK, D, PS, causal=True,
           q_data_type="float16")
    return w, c, rnd(rng, (sum(qo), HQ, D))


def ragged_setup(seed=2):
    rng = np.random.default_rng(seed)
    qo, kv = [4, 9], [30, 9]
    w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(host_ws(), "NHD")
    w.plan(np.array([0, 4, 13], np.int32), np.array([0, 30, 39], np.int32), HQ, HK, D,
           causal=True, q_data_type="float16")
    return w, rnd(rng, (sum(qo), HQ, D)), rnd(rng, (sum(kv), HK, D)), rnd(rng, (sum(kv), HK, D))


def states(rng, n=5, num=3):
    v = rnd(rng, (n, num, HQ, D))
    s = t(rng.uniform(-4, 4, (n, num, HQ)).astype(np.float32))
    return v, s


def append_setup(seed=3, interleaved=False):
    rng = np.random.default_rng(seed)
    c = PagedCache(rng, [18, 3], PS, HK, D, np.float16, "NHD")
    key, value = rnd(rng, (2, HK, D)), rnd(rng, (2, HK, D))
    bi, pos = t(np.array([0, 1], np.int32)), t(np.array([17, 2], np.int32))
    cache = t(c.kv.copy()) if interleaved else (t(c.k.copy()), t(c.v.copy()))
    return key, value, bi, pos, cache, t(c.indices), t(c.indptr), t(c.last_page_len)


def rope_setup(seed=4):
    rng = np.random.default_rng(seed)
    return rnd(rng, (6, HQ, D)), rnd(rng, (6, HK, D)), t(np.array([0, 5, 9, 100, 3, 7], np.int32))


def test_flashkv_imports_and_runs_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"  # `import torch` raises ImportError
            "import numpy as np, flashkv\n"
            "from flashkv import _arrays as A\n"
            "assert A.torch_ops(np.zeros(1)) is None and A.load_torch_ops() is None\n"
            "v = np.zeros((2, 1, 4, 8), np.float16); s = np.zeros((2, 1, 4), np.float32)\n"
            "flashkv.merge_states(v, s)\n"
            "try:\n    import flashkv._torch_ops\nexcept ImportError:\n    pass\n"
            "else:\n    raise SystemExit('flashkv._torch_ops imported without torch')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_import_flashkv_does_not_import_torch():
    code = "import sys, flashkv; assert 'torch' not in sys.modules, 'flashkv imported torch'"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@needs_ops
def test_ops_are_registered():
    for name in OPS:
        assert hasattr(torch.ops.flashkv, name), name


OPCHECK_CASES = ["decode", "decode_no_lse", "decode_out", "decode_out_no_lse", "prefill",
                 "prefill_out", "ragged", "ragged_out", "merge_state", "merge_state_in_place",
                 "merge_states", "append", "append_interleaved", "rope", "rope_llama31",
                 "rope_inplace", "decode_scales", "append_scales", "decode_fp8", "decode_out_fp8",
                 "prefill_fp8", "ragged_out_fp8", "append_fp8"]


def fp8(x, dtype_name="float8_e4m3fn"):
    """A float8 CPU tensor of x's values (rounded)."""
    return x.float().to(getattr(torch, dtype_name))


def fp8_setup(seed=10):
    """Decode, paged prefill and ragged prefill wrappers planned for fp8 KV, their fp8 caches and
    per-head / [1] scale tensors."""
    w, c, q = decode_setup(seed)
    w.plan(c.indptr, c.indices, c.last_page_len, HQ, HK, D, PS, q_data_type="float16",
           kv_data_type=torch.float8_e4m3fn)
    pw, pc, pq = prefill_setup(seed + 1)
    pw.plan(np.concatenate([[0], np.cumsum([3, 17, 1])]).astype(np.int32), pc.indptr,
            pc.indices, pc.last_page_len, HQ, HK, D, PS, causal=True, q_data_type="float16",
            kv_data_type="float8_e5m2")
    rw, rq, rk, rv = ragged_setup(seed + 2)
    rw.plan(np.array([0, 4, 13], np.int32), np.array([0, 30, 39], np.int32), HQ, HK, D,
            causal=True, q_data_type="float16", kv_data_type="e4m3")
    ks, vs = torch.tensor([0.5, 1.5]), torch.tensor([0.75])
    e5m2 = "float8_e5m2"
    return ((w, fp8(t(c.k)), fp8(t(c.v)), q), (pw, fp8(t(pc.k), e5m2), fp8(t(pc.v), e5m2), pq),
            (rw, rq, fp8(rk), fp8(rv)), ks, vs)


def opcheck_cases():
    w, c, q = decode_setup()
    k, v = t(c.k), t(c.v)
    pw, pc, pq = prefill_setup()
    rw, rq, rk, rv = ragged_setup()
    va, sa = states(np.random.default_rng(5))
    key, value, bi, pos, (kc, vc), ind, ip, last = append_setup()
    kvc = append_setup(interleaved=True)[4]
    rq_, rk_, rpos = rope_setup()
    (fw, fk, fv, fq), (fpw, fpk, fpv, fpq), (frw, frq, frk, frv), ks, vs = fp8_setup()
    fkey, fval, fbi, fpos, (fkc, fvc), find, fip, flast = append_setup(seed=11)
    fkc, fvc = fp8(fkc), fp8(fvc)
    f16 = torch.float16
    lse = torch.empty(q.shape[:2])
    llama31 = ("llama31", 0, False, 8.0, 5e5, 1.0, 4.0, 8192.0)
    return {
        "decode": ("batch_decode_run", (q, k, v, w._handle, f16, True)),
        "decode_no_lse": ("batch_decode_run", (q, k, v, w._handle, f16, False)),
        "decode_out": ("batch_decode_run_out", (q, k, v, torch.empty_like(q), lse, w._handle)),
        "decode_out_no_lse": ("batch_decode_run_out",
                              (q, k, v, torch.empty_like(q), None, w._handle)),
        "prefill": ("batch_prefill_paged_run", (pq, t(pc.k), t(pc.v), pw._handle, f16, True)),
        "prefill_out": ("batch_prefill_paged_run_out",
                        (pq, t(pc.k), t(pc.v), torch.empty_like(pq), None, pw._handle)),
        "ragged": ("batch_prefill_ragged_run", (rq, rk, rv, rw._handle, f16, True)),
        "ragged_out": ("batch_prefill_ragged_run_out",
                       (rq, rk, rv, torch.empty_like(rq), torch.empty(rq.shape[:2]),
                        rw._handle)),
        "merge_state": ("merge_state", (va[:, 0].contiguous(), sa[:, 0].contiguous(),
                                        va[:, 1].contiguous(), sa[:, 1].contiguous())),
        "merge_state_in_place": ("merge_state_in_place",
                                 (va[:, 0].clone(), sa[:, 0].clone(), va[:, 1].contiguous(),
                                  sa[:, 1].contiguous())),
        "merge_states": ("merge_states", (va, sa)),
        "append": ("append_paged_kv_cache", (key, value, bi, pos, kc, vc, ind, ip, last, "NHD")),
        "append_interleaved": ("append_paged_kv_cache",
                               (key, value, bi, pos, kvc, None, ind, ip, last, "NHD")),
        "rope": ("rope_pos_ids", (rq_, rk_, rpos, "llama", 0, False, 1.0, 1e4, 1.0, 4.0, 8192.0)),
        "rope_llama31": ("rope_pos_ids", (rq_, rk_, rpos) + llama31),
        "rope_inplace": ("rope_pos_ids_", (rq_.clone(), rk_.clone(), rpos) + llama31),
        # *SCALES (k_scale, v_scale, k_scale_tensor, v_scale_tensor) last. The ops pass them to
        # the C++ op as they are (the wrappers check them): the CPU reference takes scales on a
        # 16-bit cache too, which lets opcheck's schema test run (it cannot on float8 tensors).
        "decode_scales": ("batch_decode_run", (q, k, v, w._handle, f16, True, 0.5, 1.0, ks, vs)),
        "append_scales": ("append_paged_kv_cache", (key, value, bi, pos, kc.clone(), vc.clone(),
                                                    ind, ip, last, "NHD", 1.0, 0.25, ks, None)),
        "decode_fp8": ("batch_decode_run", (fq, fk, fv, fw._handle, f16, True, 1.0, 1.0, ks, vs)),
        "decode_out_fp8": ("batch_decode_run_out", (fq, fk, fv, torch.empty_like(fq), None,
                                                    fw._handle, 0.5, 2.0, None, None)),
        "prefill_fp8": ("batch_prefill_paged_run", (fpq, fpk, fpv, fpw._handle, f16, False, 1.0,
                                                    3.0, ks, None)),
        "ragged_out_fp8": ("batch_prefill_ragged_run_out",
                           (frq, frk, frv, torch.empty_like(frq), torch.empty(frq.shape[:2]),
                            frw._handle, 1.0, 1.0, None, vs)),
        "append_fp8": ("append_paged_kv_cache", (fkey, fval, fbi, fpos, fkc, fvc, find, fip,
                                                 flast, "NHD", 1.0, 0.25, ks, None)),
    }, (w, pw, rw, fw, fpw, frw)  # the wrappers must outlive the calls (handles are weak)


@needs_ops
@pytest.mark.parametrize("case", OPCHECK_CASES)
def test_opcheck(case):
    cases, keep = opcheck_cases()
    name, args = cases[case]
    # opcheck's schema test multiplies the inputs, which torch cannot do on float8 tensors.
    utils = (dict(test_utils=("test_autograd_registration", "test_faketensor",
                              "test_aot_dispatch_dynamic")) if case.endswith("_fp8") else {})
    result = torch.library.opcheck(getattr(torch.ops.flashkv, name).default, args, **utils)
    assert all(v == "SUCCESS" for v in result.values()), result
    del keep


@needs_ops
def test_dead_handle_raises():
    w, c, q = decode_setup()
    handle = w._handle
    del w
    with pytest.raises(ValueError, match="no live wrapper has handle"):
        torch.ops.flashkv.batch_decode_run(q, t(c.k), t(c.v), handle, torch.float16, False)


@pytest.fixture
def calls(monkeypatch, routed):
    """Routes CPU tensors to the ops and records which op each public call used."""
    seen = []

    def spy(name, fn):
        def call(*args, **kwargs):
            seen.append(name)
            return fn(*args, **kwargs)
        return call

    for name in ("merge_state", "merge_states", "merge_state_in_place", "_append", "_rope",
                 "_rope_"):
        monkeypatch.setattr(_torch_ops, name, spy(name, getattr(_torch_ops, name)))
    monkeypatch.setattr(_torch_ops, "RUN_OPS", {
        n: (spy(n, run), spy(n + "_out", run_out))
        for n, (run, run_out) in _torch_ops.RUN_OPS.items()})
    return seen


def used(seen, fn):
    del seen[:]
    result = fn()
    return result, list(seen)


@needs_ops
def test_routing_is_bitwise_the_eager_path(calls):
    w, c, q = decode_setup(layout="HND")
    k, v = t(c.k), t(c.v)
    out, lse = w._run(q, k, v, None, None, True)
    got, ops = used(calls, lambda: w.run(q, t(c.kv), return_lse=True))  # interleaved cache
    assert ops == ["batch_decode_run"]
    assert torch.equal(got[0], out) and torch.equal(got[1], lse)
    o2, l2 = torch.full_like(q, float("nan")), torch.full(q.shape[:2], float("nan"))
    got, ops = used(calls, lambda: w.run(q, (k, v), out=o2, lse=l2))
    assert ops == ["batch_decode_run_out"] and got is o2
    assert torch.equal(o2, out) and torch.equal(l2, lse)
    o3, l3 = w.run(q, (k, v), lse=l2, return_lse=True)  # out allocated, lse given
    assert l3 is l2 and torch.equal(o3, out) and torch.equal(l2, lse)
    pw, pc, pq = prefill_setup()
    ref = pw._run(pq, t(pc.k), t(pc.v), None, None, False)
    got, ops = used(calls, lambda: pw.run(pq, (t(pc.k), t(pc.v))))
    assert ops == ["batch_prefill_paged_run"] and torch.equal(got, ref)
    rw, rq, rk, rv = ragged_setup()
    got, ops = used(calls, lambda: rw.run(rq, rk, rv))
    assert ops == ["batch_prefill_ragged_run"]
    assert torch.equal(got, rw._run(rq, rk, rv, None, None, False))


@needs_ops
def test_eager_calls_skip_the_dispatcher(calls, monkeypatch):
    """Outside torch.compile the wrappers and functions call the op bodies directly (torch's
    dispatcher costs ~100 us per call); the result is the same."""
    monkeypatch.setattr(_torch_ops, "tracing", torch.compiler.is_compiling)
    w, c, q = decode_setup()
    ref = w._run(q, t(c.k), t(c.v), None, None, False)
    got, ops = used(calls, lambda: w.run(q, (t(c.k), t(c.v))))
    assert ops == [] and torch.equal(got, ref)
    va, vb = rnd(np.random.default_rng(1), (3, 2, 8)), rnd(np.random.default_rng(2), (3, 2, 8))
    sa, sb = torch.zeros(3, 2), torch.ones(3, 2)
    _, ops = used(calls, lambda: flashkv.merge_state(va, sa, vb, sb))
    assert ops == []


@needs_ops
def test_free_functions_route_and_match_eager(calls):
    from flashkv import cascade, page, rope

    rng = np.random.default_rng(6)
    va, sa = states(rng, num=2)
    a = (va[:, 0].contiguous(), sa[:, 0].contiguous(), va[:, 1].contiguous(),
         sa[:, 1].contiguous())
    got, ops = used(calls, lambda: flashkv.merge_state(*a))
    assert ops == ["merge_state"]
    assert all(torch.equal(x, y) for x, y in zip(got, cascade._merge_state(*a)))
    got, ops = used(calls, lambda: flashkv.merge_states(va, sa))
    assert ops == ["merge_states"]
    assert all(torch.equal(x, y) for x, y in zip(got, cascade._merge_states(va, sa)))
    v1, s1, v2, s2 = a[0].clone(), a[1].clone(), a[0].clone(), a[1].clone()
    _, ops = used(calls, lambda: flashkv.merge_state_in_place(v1, s1, a[2], a[3]))
    cascade._merge_state_in_place(v2, s2, a[2], a[3])
    assert ops == ["merge_state_in_place"] and torch.equal(v1, v2) and torch.equal(s1, s2)
    for interleaved in (False, True):
        args = append_setup(interleaved=interleaved)
        ref = append_setup(interleaved=interleaved)
        _, ops = used(calls, lambda: flashkv.append_paged_kv_cache(*args))
        page._append_paged_kv_cache(*ref, "NHD")
        assert ops == ["_append"]
        got_c, ref_c = args[4], ref[4]
        for x, y in (zip(got_c, ref_c) if not interleaved else [(got_c, ref_c)]):
            assert torch.equal(x, y)
    q, k, pos = rope_setup()
    for fn, kind, extra in ((flashkv.apply_rope_pos_ids, "llama", (1.0, 1e4, 1.0, 4.0, 8192.0)),
                            (flashkv.apply_llama31_rope_pos_ids, "llama31",
                             (8.0, 5e5, 1.0, 4.0, 8192.0))):
        qr, kr = torch.empty_like(q), torch.empty_like(k)
        rope._rope_pos_ids(q, k, qr, kr, pos, kind, 32, True, *extra)
        got, ops = used(calls, lambda: fn(q, k, pos, rotary_dim=32, interleave=True))
        assert ops == ["_rope"] and torch.equal(got[0], qr) and torch.equal(got[1], kr)
        qi, ki = q.clone(), k.clone()
        inplace = getattr(flashkv, fn.__name__ + "_inplace")
        _, ops = used(calls, lambda: inplace(qi, ki, pos, rotary_dim=32, interleave=True))
        assert ops == ["_rope_"] and torch.equal(qi, qr) and torch.equal(ki, kr)
    # NumPy positions with torch q and an explicit stream: the eager path, no op
    got, ops = used(calls, lambda: flashkv.apply_rope_pos_ids(q, k, pos.numpy()))
    assert ops == [] and got[0].shape == q.shape
    _, ops = used(calls, lambda: flashkv.merge_states(va, sa, stream=0))
    assert ops == []


@needs_ops
def test_torch_compile_fullgraph_layer(routed):
    """RoPE + append + decode + merge in one compiled graph (fullgraph: any nanobind call would
    break it), equal to eager, caches included."""
    rng = np.random.default_rng(8)
    # The plan counts one new token per request: append it at position kv_len - 1.
    lens = [5, 40, 17]
    c = PagedCache(rng, lens, PS, HK, D, np.float16, "NHD")
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(host_ws(), "NHD")
    w.plan(c.indptr, c.indices, c.last_page_len, HQ, HK, D, PS, q_data_type="float16")
    q, k_new, v_new = rnd(rng, (3, HQ, D)), rnd(rng, (3, HK, D)), rnd(rng, (3, HK, D))
    pos = t(np.array(lens, np.int32) - 1)
    bi = t(np.arange(3, dtype=np.int32))
    ind, ip, last = t(c.indices), t(c.indptr), t(c.last_page_len)
    va, sa = states(rng, n=3, num=1)

    def layer(q, k_new, v_new, kv):
        q, k_new = flashkv.apply_llama31_rope_pos_ids(q, k_new, pos)
        flashkv.append_paged_kv_cache(k_new, v_new, bi, pos, kv, ind, ip, last)
        out, lse = w.run(q, kv, return_lse=True)
        return flashkv.merge_state(out, lse, va[:, 0], sa[:, 0])

    kv_eager, kv_comp = t(c.kv.copy()), t(c.kv.copy())
    ref = layer(q, k_new, v_new, kv_eager)
    got = torch.compile(layer, fullgraph=True)(q, k_new, v_new, kv_comp)
    assert torch.equal(kv_comp, kv_eager)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@needs_ops
def test_compiled_run_follows_a_new_plan_without_recompiling(routed):
    """plan() stays outside the graph: a compiled function runs whatever plan its wrapper holds;
    a new page table of the same batch size needs no recompile."""
    rng = np.random.default_rng(9)
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(host_ws(), "NHD")
    c = PagedCache(rng, [300, 7, 64], PS, HK, D, np.float16, "NHD", spare_pages=20)
    q = rnd(rng, (3, HQ, D))
    kv = t(c.kv)
    f = torch.compile(lambda q, kv: w.run(q, kv, return_lse=True), fullgraph=True)
    for lens in ([300, 7, 64], [1, 290, 33], [16, 16, 0]):
        pages = [(n + PS - 1) // PS for n in lens]
        indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        indices = rng.permutation(c.kv.shape[0])[: sum(pages)].astype(np.int32)
        last = np.array([n - (p - 1) * PS if p else 0 for n, p in zip(lens, pages)], np.int32)
        w.plan(indptr, indices, last, HQ, HK, D, PS, q_data_type="float16")
        with torch._dynamo.config.patch(error_on_recompile=lens != [300, 7, 64]):
            got = f(q, kv)
        ref = w._run(q, t(c.k), t(c.v), None, None, True)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@needs_ops
def test_fp8_routing_carries_the_scales(calls):
    """run() and append_paged_kv_cache over fp8 caches route through the ops with their scales
    (float and tensor forms), equal to the eager path."""
    (w, k, v, q), _, (rw, rq, rk, rv), ks, vs = fp8_setup(seed=20)
    ref = w._run(q, k, v, None, None, True, flashkv._common.KVScale(1.0, 0.5, ks, None))
    got, ops = used(calls, lambda: w.run(q, (k, v), k_scale=ks, v_scale=0.5, return_lse=True))
    assert ops == ["batch_decode_run"]
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    plain = w.run(q, (k, v), return_lse=True)
    assert not torch.equal(got[0], plain[0])  # the scales were applied
    out = torch.empty_like(rq)
    got, ops = used(calls, lambda: rw.run(rq, rk, rv, k_scale=2.0, v_scale=vs, out=out))
    assert ops == ["batch_prefill_ragged_run_out"] and got is out
    assert torch.equal(out, rw._run(rq, rk, rv, None, None, False,
                                    flashkv._common.KVScale(2.0, 1.0, None, vs)))
    key, value, bi, pos, (kc, vc), ind, ip, last = append_setup(seed=21)
    a, b = (fp8(kc), fp8(vc)), (fp8(kc), fp8(vc))
    _, ops = used(calls, lambda: flashkv.append_paged_kv_cache(key, value, bi, pos, a, ind, ip,
                                                               last, k_scale=ks, v_scale=3.0))
    assert ops == ["_append"]
    from flashkv import page

    page._append_paged_kv_cache(key, value, bi, pos, b, ind, ip, last, "NHD",
                                scale=flashkv._common.KVScale(1.0, 3.0, ks, None))
    for x, y in zip(a, b):
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))


@needs_ops
def test_torch_compile_fp8_layer_with_tensor_scales(routed):
    """Append (quantizing) + decode over an fp8 cache with per-head tensor scales in one
    fullgraph-compiled function: equal to eager, caches included; new scale values (same
    shapes) need no recompile."""
    rng = np.random.default_rng(22)
    lens = [5, 40, 17]
    c = PagedCache(rng, lens, PS, HK, D, np.float16, "NHD")
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(host_ws(), "NHD")
    w.plan(c.indptr, c.indices, c.last_page_len, HQ, HK, D, PS, q_data_type="float16",
           kv_data_type="float8_e4m3fn")
    q, k_new, v_new = rnd(rng, (3, HQ, D)), rnd(rng, (3, HK, D)), rnd(rng, (3, HK, D))
    pos = t(np.array(lens, np.int32) - 1)
    bi = t(np.arange(3, dtype=np.int32))
    ind, ip, last = t(c.indices), t(c.indptr), t(c.last_page_len)

    def layer(q, k_new, v_new, kv, ks, vs):
        flashkv.append_paged_kv_cache(k_new, v_new, bi, pos, kv, ind, ip, last, k_scale=ks,
                                      v_scale=vs)
        return w.run(q, kv, k_scale=ks, v_scale=vs, return_lse=True)

    f = torch.compile(layer, fullgraph=True)
    for scale in (1.0, 0.25):
        ks, vs = torch.tensor([0.5, 2.0]) * scale, torch.tensor([1.5]) / scale
        kv_eager, kv_comp = fp8(t(c.kv)), fp8(t(c.kv))
        ref = layer(q, k_new, v_new, kv_eager, ks, vs)
        with torch._dynamo.config.patch(error_on_recompile=scale != 1.0):
            got = f(q, k_new, v_new, kv_comp, ks, vs)
        assert torch.equal(kv_comp.view(torch.uint8), kv_eager.view(torch.uint8))
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
