"""The Python side of the GPU path, on any machine: the wrappers driven with stand-in CUDA arrays
and a stand-in for the C++ plan/run objects, checking what they are asked to do (workspace sizing
and re-creation, the size error, CUDA-graph buffers and pinning, unit conversions, the LSE base).
The real kernels are covered by the test_gpu_*.py modules on a GPU machine."""

from types import SimpleNamespace

import numpy as np
import pytest

import flashkv
from flashkv import _C, prefill

LOG2E = 1.4426950408889634


class FakeCuda(np.ndarray):
    """A NumPy array that says (through DLPack) it lives on cuda:0."""

    def __dlpack_device__(self):
        return (2, 0)


def cuda(a, dtype=None):
    return np.array(a, dtype=dtype).view(FakeCuda)


class FakeOp:
    """Stands in for _C.BatchDecode / BatchPrefillPaged / BatchPrefillRagged."""

    made = []

    def __init__(self, workspace, device, **cfg):
        self.workspace, self.cfg, self.plans, self.runs = workspace, cfg, [], []
        self.scales = []  # the keyword arguments (the KV scales) of each run / run_step
        FakeOp.made.append(self)

    @staticmethod
    def workspace_bytes(device, max_batch, num_qo_heads, head_dim, max_qo_tokens=0,
                        max_kv_tokens=0, min_fixed_split_size=0):
        assert (max_kv_tokens > 0) == (min_fixed_split_size > 0)
        return (1000 * max_batch + 10 * max_qo_tokens + num_qo_heads * head_dim +
                (max_kv_tokens // max(min_fixed_split_size, 1)))

    # The wrappers size by the least a plan needs (the real ops: the plan arrays; partial states
    # take what is left). The fake's formula stands for both.
    @classmethod
    def min_workspace_bytes(cls, **cfg):
        return cls.workspace_bytes(**cfg)

    # The real op's chunk count (host code, no GPU): the wrapper sizes fixed-split plans with it.
    fixed_split_chunks = staticmethod(_C.BatchDecode.fixed_split_chunks)

    def plan(self, *args, **kwargs):
        self.plans.append(args)
        self.plan_kwargs = kwargs

    def run(self, *args, **scales):
        self.runs.append(args)
        self.scales.append(scales)
        out, lse = args[-3], args[-2]
        out[...] = 0.5
        if lse is not None:
            lse[...] = 1.0  # natural log, as the C++ objects write it

    def run_step(self, *args, **scales):
        self.runs.append(args)
        self.scales.append(scales)
        args[9][...] = 0.25  # out

    def plan_info(self):
        return SimpleNamespace(tile_rows=32, to_dict=lambda: {"tile_rows": 32})


class FakeCascade(FakeOp):
    """Stands in for _C.MultiLevelCascade."""

    @staticmethod
    def workspace_bytes(device, max_batch, max_qo_tokens, max_pages, num_qo_heads, head_dim,
                        max_levels):
        return 1000 * max_batch + 10 * max_qo_tokens + max_pages + num_qo_heads * head_dim

    def plan_info(self):
        return SimpleNamespace(to_dict=lambda: {"cascade": True})


@pytest.fixture
def fake(monkeypatch):
    FakeOp.made = []
    syncs = []
    monkeypatch.setattr(_C, "BatchDecode", FakeOp)
    monkeypatch.setattr(_C, "MultiLevelCascade", FakeCascade)
    monkeypatch.setattr(_C, "device_synchronize", syncs.append)
    monkeypatch.setattr(prefill.BatchPrefillWithPagedKVCacheWrapper, "_op_class", FakeOp)
    monkeypatch.setattr(prefill.BatchPrefillWithRaggedKVCacheWrapper, "_op_class", FakeOp)
    return syncs


def decode_plan(w, batch, hq=8, **kw):
    indptr = np.arange(batch + 1, dtype=np.int32)
    w.plan(cuda(indptr), cuda(np.arange(batch), np.int32), cuda(np.ones(batch), np.int32), hq, 2,
           64, 16, **kw)


def test_workspace_sized_at_plan_and_grown(fake):
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(cuda(np.zeros(20_000, np.uint8)))
    assert FakeOp.made == []  # nothing before plan()
    decode_plan(w, 3)
    assert FakeOp.made[-1].cfg == dict(max_batch=4, num_qo_heads=8, head_dim=64)  # headroom
    decode_plan(w, 4)
    assert len(FakeOp.made) == 1 and fake == []  # fits: reused
    decode_plan(w, 5)
    assert FakeOp.made[-1].cfg["max_batch"] == 8 and fake == [0]  # grown after a device sync
    decode_plan(w, 17)  # 32 does not fit 20 000 bytes, 17 does: exact size
    assert FakeOp.made[-1].cfg["max_batch"] == 17
    with pytest.raises(ValueError, match=r"20000 bytes is too small .* needs at least 30512 bytes"):
        decode_plan(w, 30)


def test_own_slot_grows_to_cover_every_configuration(fake):
    from flashkv import _workspace

    q = np.zeros((4, 8, 64), np.float16)  # device 0 (A.empty makes no FakeCuda workspaces)
    _workspace._OWN_SLOTS.clear()
    a = _workspace.own_slot(FakeOp, q, dict(max_batch=1, num_qo_heads=8, head_dim=64), "a")
    assert a.op.cfg == dict(max_batch=1, num_qo_heads=8, head_dim=64) and fake == []
    assert _workspace.own_slot(FakeOp, q, dict(max_batch=1, num_qo_heads=4, head_dim=64), "b") is a
    assert len(FakeOp.made) == 1  # covered: neither the workspace nor the op is re-made
    c = _workspace.own_slot(FakeOp, q, dict(max_batch=1, num_qo_heads=4, head_dim=128), "c")
    assert c is not a and fake == [0]  # a larger workspace, after a device sync
    assert c.nbytes >= FakeOp.workspace_bytes(0, 1, 8, 128)  # the workspace covers a and c
    assert c.op.cfg == dict(max_batch=1, num_qo_heads=4, head_dim=128)
    made = len(FakeOp.made)
    assert _workspace.own_slot(FakeOp, q, dict(max_batch=1, num_qo_heads=8, head_dim=64), "d") is c
    assert len(FakeOp.made) == made + 1  # a new op in the same workspace
    assert c.op.cfg == dict(max_batch=1, num_qo_heads=8, head_dim=128)
    assert _workspace._OWN_SLOTS == {(FakeOp, 0): c}
    _workspace._OWN_SLOTS.clear()


def test_decode_plan_and_run_arguments(fake):
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(cuda(np.zeros(100_000, np.uint8)), "HND")
    decode_plan(w, 2, fixed_split_size=3, q_data_type="bfloat16")
    op = FakeOp.made[-1]
    indptr, last, ps, shape, o = op.plans[-1]
    assert (shape.q_dtype, shape.kv_dtype, shape.o_dtype, shape.num_qo_heads, ps) == (
        "bf16", "bf16", "bf16", 8, 16)
    assert (o.sm_scale, o.enable_cuda_graph, o.fixed_split_size, o.disable_split_kv) == (
        0.0, False, 48, False)  # 3 pages of 16 tokens
    assert op.plan_kwargs["variant"] is None
    assert op.plan_kwargs["names"].kv_indptr == "indptr"  # the C++ checks name plan()'s arguments
    assert indptr.tolist() == [0, 1, 2] and last.tolist() == [1, 1]
    # fixed_split_size sizes the workspace for the plan's chunks per KV head (one 1-token
    # request per chunk here): BatchDecodeConfig.max_kv_tokens with min_fixed_split_size 1.
    assert op.cfg["max_kv_tokens"] >= 2 and op.cfg["min_fixed_split_size"] == 1
    q = cuda(np.zeros((2, 8, 64), np.float16))
    kv = cuda(np.zeros((4, 2, 2, 16, 64), np.float16))
    out, lse = cuda(np.zeros((2, 8, 64), np.float16)), cuda(np.zeros((2, 8), np.float32))
    ret = w.run(q, kv, out=out, lse=lse, return_lse=True)
    assert ret[0] is out and ret[1] is lse
    np.testing.assert_allclose(lse, LOG2E, rtol=1e-6)  # natural -> base 2, in place
    args = op.runs[-1]
    assert args[3] == "HND" and args[1].shape == (4, 2, 16, 64)  # interleaved split into k, v
    with pytest.raises(TypeError, match="pass out="):  # no allocator for unknown frameworks
        w.run(q, kv)
    with pytest.raises(ValueError, match="expected an array on cuda:0"):
        w.run(np.zeros((2, 8, 64), np.float16), kv, out=out)


def test_decode_cuda_graph_buffers(fake):
    bufs = [cuda(np.zeros(5), np.int32), cuda(np.zeros(32), np.int32), cuda(np.zeros(4), np.int32)]
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(
        cuda(np.zeros(100_000, np.uint8)), use_cuda_graph=True, paged_kv_indptr_buffer=bufs[0],
        paged_kv_indices_buffer=bufs[1], paged_kv_last_page_len_buffer=bufs[2])
    w.plan(np.array([0, 2, 5]), cuda([7, 8, 9, 10, 11], np.int32), np.array([3, 16]), 8, 2, 64,
           16)
    op = FakeOp.made[-1]
    assert op.cfg == dict(max_batch=4, num_qo_heads=8, head_dim=64)  # the buffers' batch
    assert bufs[0][:3].tolist() == [0, 2, 5] and bufs[2][:2].tolist() == [3, 16]
    assert bufs[1][:5].tolist() == [7, 8, 9, 10, 11]
    assert op.plans[-1][4].enable_cuda_graph is True
    q, out = cuda(np.zeros((4, 8, 64), np.float16)), cuda(np.zeros((4, 8, 64), np.float16))
    w.run(q, (cuda(np.zeros((9, 16, 2, 64))), cuda(np.zeros((9, 16, 2, 64)))), out=out)
    args = op.runs[-1]
    assert args[4] is bufs[0] and args[5] is bufs[1] and args[6] is bufs[2]  # fixed buffers
    with pytest.raises(ValueError, match="exceeds the 4 requests"):
        decode_plan(w, 5)
    with pytest.raises(ValueError, match="num_qo_heads 16 > 8: in CUDA graph mode"):
        decode_plan(w, 2, hq=16)
    decode_plan(w, 1)  # fewer requests than the buffers hold: the same object
    assert len(FakeOp.made) == 1


def test_decode_fixed_split_sizing_survives_mixed_plans(fake):
    # Plans with and without fixed_split_size in any order: the op's config gains the chunk
    # sizing (max_kv_tokens, min_fixed_split_size 1) once and keeps it while the batch grows.
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(cuda(np.zeros(1_000_000, np.uint8)))
    decode_plan(w, 2)
    assert "max_kv_tokens" not in FakeOp.made[-1].cfg
    decode_plan(w, 2, fixed_split_size=1)  # 2 one-token requests: 2 chunks per head
    assert FakeOp.made[-1].cfg["max_kv_tokens"] >= 2
    assert FakeOp.made[-1].cfg["min_fixed_split_size"] == 1
    decode_plan(w, 9)  # no split, a larger batch: re-made, the chunk sizing kept
    assert FakeOp.made[-1].cfg["max_kv_tokens"] >= 2 and FakeOp.made[-1].cfg["max_batch"] >= 9
    decode_plan(w, 9, fixed_split_size=1)  # 9 chunks
    assert FakeOp.made[-1].cfg["max_kv_tokens"] >= 9


def test_decode_fixed_split_sizing_in_cuda_graph_mode(fake):
    # Graph mode sizes once for the most the indices buffer describes (32 full pages of 16 tokens,
    # chunks of 16: 32 chunks per head), so plans whose requests grow keep the same object.
    bufs = [cuda(np.zeros(5), np.int32), cuda(np.zeros(32), np.int32), cuda(np.zeros(4), np.int32)]
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(
        cuda(np.zeros(100_000, np.uint8)), use_cuda_graph=True, paged_kv_indptr_buffer=bufs[0],
        paged_kv_indices_buffer=bufs[1], paged_kv_last_page_len_buffer=bufs[2])
    for pages in (1, 2, 8):  # one request of `pages` full pages
        w.plan(np.array([0, pages]), cuda(np.arange(pages), np.int32), np.array([16]), 8, 2, 64, 16,
               fixed_split_size=1)
    assert len(FakeOp.made) == 1
    assert FakeOp.made[-1].cfg["max_kv_tokens"] == 32
    assert FakeOp.made[-1].cfg["min_fixed_split_size"] == 1


def test_prefill_cuda_graph_pins_tokens_and_tile(fake):
    bufs = dict(qo_indptr_buf=cuda(np.zeros(3), np.int32),
                paged_kv_indptr_buf=cuda(np.zeros(3), np.int32),
                paged_kv_indices_buf=cuda(np.zeros(16), np.int32),
                paged_kv_last_page_len_buf=cuda(np.zeros(2), np.int32))
    w = flashkv.BatchPrefillWithPagedKVCacheWrapper(cuda(np.zeros(100_000, np.uint8)),
                                                    use_cuda_graph=True, **bufs)
    kv = (cuda([0, 1, 2], np.int32), np.array([0, 1, 3]), np.array([5, 16]))

    def plan(qo):
        w.plan(np.array(qo), kv[1], kv[0], kv[2], 8, 2, 64, 16, causal=True)

    plan([0, 10, 30])
    op = FakeOp.made[-1]
    assert op.cfg == dict(max_batch=2, max_qo_tokens=30, num_qo_heads=8, head_dim=64)
    assert op.plans[-1][5].tile_rows == 0  # the first plan's tile is the heuristic's...
    plan([0, 1, 20])
    assert op.plans[-1][5].tile_rows == 32  # ...and kept for every later plan (plan_info's)
    assert bufs["qo_indptr_buf"].tolist() == [0, 1, 20]
    with pytest.raises(ValueError, match="max_qo_tokens 31 > 30"):
        plan([0, 1, 31])


def test_ragged_prefill_plan_arguments(fake):
    w = flashkv.BatchPrefillWithRaggedKVCacheWrapper(cuda(np.zeros(100_000, np.uint8)), "HND")
    w.plan(cuda([0, 3, 7], np.int32), cuda([0, 5, 9], np.int32), 4, 4, 128, causal=True,
           sm_scale=0.125, fixed_split_size=64)
    op = FakeOp.made[-1]
    assert op.cfg == dict(max_batch=2, max_qo_tokens=8, num_qo_heads=4, head_dim=128)
    qo, kvp, shape, o = op.plans[-1]
    assert (shape.num_qo_heads, shape.num_kv_heads, shape.head_dim) == (4, 4, 128)
    assert (o.causal, o.sm_scale, o.fixed_split_size, o.tile_rows, o.backend) == (
        True, 0.125, 64, 0, "auto")
    assert op.plan_kwargs["variant"] is None
    assert op.plan_kwargs["names"].kv_indptr == "kv_indptr"
    q, out = cuda(np.zeros((7, 4, 128), np.float16)), cuda(np.zeros((7, 4, 128), np.float16))
    k = cuda(np.zeros((4, 9, 128), np.float16))  # HND [H, L, D]
    w.run(q, k, k, out=out)
    assert op.runs[-1][1].shape == (9, 4, 128)  # passed on as an NHD view


def test_run_step_arguments(fake):
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(cuda(np.zeros(100_000, np.uint8)))
    decode_plan(w, 2)
    op = FakeOp.made[-1]
    q, out = cuda(np.zeros((2, 8, 64), np.float16)), cuda(np.zeros((2, 8, 64), np.float16))
    kn = cuda(np.zeros((2, 2, 64), np.float16))
    kv = cuda(np.zeros((4, 2, 16, 2, 64), np.float16))
    pos = cuda([5, 6], np.int32)
    assert w.run_step(q, kn, kn, kv, rope="llama31", pos_ids=pos, out=out) is out
    assert (out == 0.25).all()
    args = op.runs[-1]
    assert args[5] == "NHD" and args[3].shape == (4, 16, 2, 64)
    assert args[11:] == ("llama31", 0, False, 8.0, 5e5, 1.0, 4.0, 8192.0, None, True, pos, 0)
    w.run_step(q, kn, kn, kv, rope="llama", rotary_dim=32, interleave=True, out=out)
    assert op.runs[-1][11:17] == ("llama", 32, True, 1.0, 1e4, 1.0)
    assert op.runs[-1][-2] is None  # pos_ids: kv_len - 1, from the plan
    cs = cuda(np.zeros((8, 64), np.float32))
    w.run_step(q, kn, kn, kv, rope="cos_sin_cache", cos_sin_cache=cs, is_neox=False, out=out)
    assert op.runs[-1][11] == "cos_sin_cache" and op.runs[-1][19] is cs
    assert op.runs[-1][20] is False
    lse = cuda(np.zeros((2, 8), np.float32))
    w.run_step(q, kn, kn, kv, out=out, lse=lse, return_lse=True)
    np.testing.assert_allclose(lse, 0.0)  # FakeOp.run_step writes no lse: base 2 of 0 is 0


def test_fp8_scales_reach_the_ops(fake):
    """k_scale / v_scale of an fp8 cache reach the C++ ops' run / run_step as their keyword
    arguments (a float as k_scale / v_scale, a tensor as k_scale_tensor / v_scale_tensor); the
    plan carries the fp8 kv dtype; a cache without scales passes the identity."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    e4m3 = ml_dtypes.float8_e4m3fn
    w = flashkv.BatchDecodeWithPagedKVCacheWrapper(cuda(np.zeros(100_000, np.uint8)))
    decode_plan(w, 2, kv_data_type="float8_e4m3fn")
    op = FakeOp.made[-1]
    shape = op.plans[-1][3]
    assert (shape.q_dtype, shape.kv_dtype, shape.o_dtype) == ("f16", "e4m3", "f16")
    q, out = cuda(np.zeros((2, 8, 64), np.float16)), cuda(np.zeros((2, 8, 64), np.float16))
    kv = cuda(np.zeros((4, 2, 16, 2, 64), e4m3))
    ks = cuda(np.ones(2, np.float32))
    w.run(q, kv, k_scale=ks, v_scale=0.5, out=out)
    assert op.scales[-1] == dict(k_scale=1.0, v_scale=0.5, k_scale_tensor=ks, v_scale_tensor=None)
    w.run(q, kv, out=out)
    assert op.scales[-1] == dict(k_scale=1.0, v_scale=1.0, k_scale_tensor=None,
                                 v_scale_tensor=None)
    kn = cuda(np.zeros((2, 2, 64), np.float16))  # q's dtype: quantized into the fp8 cache
    w.run_step(q, kn, kn, kv, out=out, k_scale=2.0, v_scale=ks)
    assert op.scales[-1] == dict(k_scale=2.0, v_scale=1.0, k_scale_tensor=None, v_scale_tensor=ks)
    with pytest.raises(ValueError, match=r"k_scale: expected an array on cuda:0"):
        w.run(q, kv, k_scale=np.ones(2, np.float32), out=out)
    r = flashkv.BatchPrefillWithRaggedKVCacheWrapper(cuda(np.zeros(100_000, np.uint8)))
    r.plan(cuda([0, 3, 7], np.int32), cuda([0, 5, 9], np.int32), 4, 2, 128,
           kv_data_type="float8_e5m2")
    op = FakeOp.made[-1]
    q, out = cuda(np.zeros((7, 4, 128), np.float16)), cuda(np.zeros((7, 4, 128), np.float16))
    k = cuda(np.zeros((9, 2, 128), ml_dtypes.float8_e5m2))
    r.run(q, k, k, k_scale=0.25, v_scale=ks, out=out)
    assert op.scales[-1] == dict(k_scale=0.25, v_scale=1.0, k_scale_tensor=None,
                                 v_scale_tensor=ks)


def cascade_plan(w, batch, pages_per_request=2, qo=None, **kw):
    indptr = np.arange(batch + 1, dtype=np.int32) * pages_per_request
    qo_indptr = None if qo is None else np.arange(batch + 1, dtype=np.int32) * qo
    w.plan(qo_indptr, indptr, cuda(np.arange(batch * pages_per_request), np.int32),
           np.full(batch, 16, np.int32), 8, 2, 64, 16, **kw)


def test_cascade_wrapper_sizes_by_mode(fake):
    w = flashkv.MultiLevelCascadeWrapper(cuda(np.zeros(100_000, np.uint8)), "HND", max_levels=2)
    cascade_plan(w, 3)  # decode: max_qo_tokens 0, exactly
    op = FakeCascade.made[-1]
    assert op.cfg == dict(max_batch=4, max_qo_tokens=0, max_pages=8, num_qo_heads=8, head_dim=64,
                          max_levels=2)
    qo, kvp, idx, last, ps, shape, o = op.plans[-1]
    assert qo is None and kvp.tolist() == [0, 2, 4, 6] and idx.tolist() == list(range(6))
    assert (ps, shape.dtype, shape.kv_dtype) == (16, "f16", "f16")
    assert (o.causal, o.use, o.min_group_size, o.enable_cuda_graph) == (False, "auto", 2, False)
    cascade_plan(w, 4)
    assert len(FakeCascade.made) == 1  # fits
    cascade_plan(w, 3, qo=5, causal=True, use_cascade="always", q_data_type="bfloat16")
    op = FakeCascade.made[-1]  # prefill rows: a new object, rows rounded up
    assert len(FakeCascade.made) == 2 and op.cfg["max_qo_tokens"] == 16
    qo, shape, o = op.plans[-1][0], op.plans[-1][5], op.plans[-1][6]
    assert qo.tolist() == [0, 5, 10, 15] and (shape.dtype, shape.kv_dtype) == ("bf16", "bf16")
    assert (o.causal, o.sm_scale, o.use) == (True, 0.0, "always")
    cascade_plan(w, 2, qo=1)
    assert len(FakeCascade.made) == 2  # prefill fits prefill
    cascade_plan(w, 2)
    assert len(FakeCascade.made) == 3 and FakeCascade.made[-1].cfg["max_qo_tokens"] == 0
    q, out = cuda(np.zeros((2, 8, 64), np.float16)), cuda(np.zeros((2, 8, 64), np.float16))
    lse = cuda(np.zeros((2, 8), np.float32))
    kv = cuda(np.zeros((4, 2, 2, 16, 64), np.float16))
    w.run(q, kv, out=out, lse=lse, return_lse=True)
    args = FakeCascade.made[-1].runs[-1]
    assert args[3] == "HND" and args[1].shape == (4, 2, 16, 64) and args[4] is out
    np.testing.assert_allclose(lse, LOG2E, rtol=1e-6)
    assert w.plan_info() == {"cascade": True}


def test_cascade_wrapper_cuda_graph_is_sized_once(fake):
    w = flashkv.MultiLevelCascadeWrapper(cuda(np.zeros(100_000, np.uint8)), use_cuda_graph=True)
    cascade_plan(w, 3)
    assert FakeCascade.made[-1].cfg["max_batch"] == 3
    assert FakeCascade.made[-1].plans[-1][6].enable_cuda_graph
    with pytest.raises(ValueError, match="max_batch 4 > 3, max_pages 8 > 6: in CUDA graph mode"):
        cascade_plan(w, 4)
    with pytest.raises(ValueError, match="keeps the mode of its first plan"):
        cascade_plan(w, 3, qo=2)


def test_explicit_cascade_splits_the_workspace(fake):
    ws = cuda(np.zeros(100_000, np.uint8))
    w = flashkv.MultiLevelCascadeAttentionWrapper(3, ws)
    qo = [np.array([0, 2]), np.array([0, 1, 2]), np.array([0, 1, 2])]
    kvp = [np.array([0, 1]), np.array([0, 1, 1]), np.array([0, 1, 2])]
    idx = [cuda([0], np.int32), cuda([1], np.int32), cuda([2, 3], np.int32)]
    last = [np.array([16]), np.array([16, 0]), np.array([3, 5])]
    w.plan(qo, kvp, idx, last, 8, 2, 64, 16, causal=True)
    ops = FakeOp.made[-3:]
    starts = [op.workspace.__array_interface__["data"][0] for op in ops]
    base = ws.__array_interface__["data"][0]
    assert [s - base for s in starts] == [0, 33280, 66560]  # disjoint, 256-byte multiples
    assert all(op.workspace.nbytes == 33280 for op in ops)
    assert [op.plans[-1][5].causal for op in ops] == [False, False, True]  # causal: the last
