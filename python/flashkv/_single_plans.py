"""Cached plans of the single-request functions on the GPU, so that single_decode_with_kv_cache
and single_prefill_with_kv_cache can be captured in a CUDA graph (and torch.compile's
mode="reduce-overhead"): a plan() runs on the CPU and uploads its schedule, which a capture
cannot hold, so a captured call must only run().

A plan depends on the request's shape, dtypes and options alone (one request of kv_len keys,
qo_len queries, heads, head_dim, layout-free), never on the arrays' addresses: each distinct
(device, shape, dtypes, options) gets its own C++ op, planned once with fixed grids
(enable_cuda_graph) in a workspace of its own, and every later call with the same key only runs
it. An eager call (torch.compile's warm-up run, a first call before a manual capture) makes the
plan; a call under capture with a key never seen raises RuntimeError saying to warm up first.

Memory: each entry holds its op's workspace (workspace_bytes of one request: the split-KV
partial states; a few MB). Entries a capture used are kept for the process's life (a graph holds
pointers into them); of the others at most MAX_UNCAPTURED are kept, the oldest dropped first.
Two calls with one key on two streams at once would share a workspace: keep them on one stream
(as every flashkv op that owns its workspace).
"""

import collections
import threading

import numpy as np

from . import _C
from . import _arrays as A
from . import _common as C
from ._workspace import OpSlot

MAX_UNCAPTURED = 16

_lock = threading.Lock()
_entries = collections.OrderedDict()  # key -> _Entry, oldest first


class _Entry:
    """A planned op and the device arrays its run() reads (they must outlive every replay)."""

    def __init__(self, slot, arrays):
        self.slot = slot
        self.arrays = arrays
        self.captured = False


def capturing(x) -> bool:
    """Whether x's framework is capturing its current stream into a CUDA graph (torch, CuPy)."""
    fw = A.framework(x)
    if fw == "torch":
        import torch

        return bool(torch.cuda.is_current_stream_capturing())
    if fw == "cupy":
        import cupy

        return bool(cupy.cuda.runtime.streamIsCapturing(A.cuda_stream(x)))
    return False


def _entry(key, fn_name, like, make):
    """The entry of `key`, made by make() (eagerly only) when there is none."""
    on_capture = capturing(like)
    with _lock:
        e = _entries.get(key)
        if e is not None:
            _entries.move_to_end(key)
            e.captured |= on_capture
            return e
    if on_capture:
        raise RuntimeError(
            f"{fn_name}: called while a CUDA graph is being captured, with a shape, dtype or "
            f"option set not planned before ({key[1:]}); the plan runs on the CPU, outside "
            f"capture: call it once eagerly with the same shapes, dtypes and options first (a "
            f"warm-up run, as torch.compile's mode='reduce-overhead' does)")
    e = make()
    with _lock:
        _entries[key] = e
        uncaptured = [k for k, v in _entries.items() if not v.captured]
        evicted = [_entries.pop(k) for k in uncaptured[:max(0, len(uncaptured) - MAX_UNCAPTURED)]]
    for old in evicted:
        old.slot.release()  # waits for runs still reading its workspace
    return e


def _own_slot(cls, like, need, what):
    dev = A.device_index(like)
    nbytes = cls.workspace_bytes(**need, device=dev)
    slot = OpSlot(cls, A.empty(like, ((nbytes + 15) // 16 * 4,), "f32"), dev, frozen=True)
    slot.acquire(need, what)
    return slot


def single_decode(q, k, v, out, lse, kv_layout, sm_scale, stream, kvs):
    """single_decode_with_kv_cache on the GPU without a variant: q [H_qo, D], k/v contiguous KV
    (NHD [L, H_kv, D] or HND [H_kv, L, D]) viewed as pages of one token."""
    hq, d = int(q.shape[0]), int(q.shape[1])
    if len(k.shape) != 3 or tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"k, v: expected two 3-D arrays of one shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    A.call(_C.check_single_kv, k, kv_layout, hq)  # heads that do not divide: names the layout
    nhd = kv_layout == "NHD"
    kv_len, hk = (int(k.shape[0]), int(k.shape[1])) if nhd else (int(k.shape[1]), int(k.shape[0]))
    dts = (A.array_dtype(q), A.array_dtype(k), A.array_dtype(out))
    key = ("decode", A.device_index(q), hq, hk, d, kv_len, *dts, sm_scale)

    def make():
        what = f"num_qo_heads {hq}, head_dim {d}"
        slot = _own_slot(_C.BatchDecode, q, dict(max_batch=1, num_qo_heads=hq, head_dim=d), what)
        indptr = np.array([0, kv_len], np.int32)
        last = np.ones(1, np.int32)
        arrays = (A.to_device_like(indptr, q), A.to_device_like(last, q),
                  A.to_device_like(np.arange(max(kv_len, 1), dtype=np.int32), q))
        shape = C.make(_C.AttentionShape, num_qo_heads=hq, num_kv_heads=hk, head_dim=d,
                       q_dtype=dts[0], kv_dtype=dts[1], o_dtype=dts[2])
        options = C.make(_C.DecodePlanOptions, sm_scale=sm_scale, enable_cuda_graph=True)
        A.call(slot.op.plan, indptr, last, 1, shape, options, stream=stream)
        return _Entry(slot, arrays)

    e = _entry(key, "single_decode_with_kv_cache", q, make)
    kp, vp, _ = C.token_pages(k, v, kv_layout)
    indptr_d, last_d, indices_d = e.arrays
    A.call(e.slot.op.run, q[None], kp, vp, kv_layout, indptr_d, indices_d, last_d, out[None],
           None if lse is None else lse[None], stream, **kvs.kwargs())


def single_prefill(q, k, v, out, lse, kv_layout, causal, sm_scale, backend, stream, kvs):
    """single_prefill_with_kv_cache on the GPU without a variant: one ragged request."""
    qo_len, hq, d = (int(x) for x in q.shape)
    A.call(_C.check_single_kv, k, kv_layout, hq)  # heads that do not divide: names the layout
    nhd = kv_layout == "NHD"
    hk = int(k.shape[1] if nhd else k.shape[0])
    kv_len = int(k.shape[0] if nhd else k.shape[1])
    dts = (A.array_dtype(q), A.array_dtype(k), A.array_dtype(out))
    key = ("prefill", A.device_index(q), qo_len, kv_len, hq, hk, d, *dts, bool(causal), sm_scale,
           backend)

    def make():
        need = dict(max_batch=1, max_qo_tokens=max(qo_len, 1), num_qo_heads=hq, head_dim=d)
        slot = _own_slot(_C.BatchPrefillRagged, q, need,
                         f"{qo_len} query tokens, num_qo_heads {hq}, head_dim {d}")
        shape = C.make(_C.AttentionShape, num_qo_heads=hq, num_kv_heads=hk, head_dim=d,
                       q_dtype=dts[0], kv_dtype=dts[1], o_dtype=dts[2])
        options = C.make(_C.PrefillPlanOptions, causal=bool(causal), sm_scale=sm_scale,
                         backend=backend, enable_cuda_graph=True)
        A.call(slot.op.plan, np.array([0, qo_len], np.int32), np.array([0, kv_len], np.int32),
               shape, options, stream=stream)
        return _Entry(slot, ())

    e = _entry(key, "single_prefill_with_kv_cache", q, make)
    if not nhd:
        k, v = A.swap01(k), A.swap01(v)
    A.call(e.slot.op.run, q, k, v, out, lse, stream, **kvs.kwargs())


def clear():
    """Drop every entry no capture used (tests; the captured ones stay, graphs point into them)."""
    with _lock:
        evicted = [_entries.pop(k) for k in [k for k, v in _entries.items() if not v.captured]]
    for old in evicted:
        old.slot.release()


def cached_keys():
    """The keys of the plans held now (tests)."""
    with _lock:
        return list(_entries)
