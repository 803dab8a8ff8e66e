"""Argument handling the FlashInfer-shaped wrappers share: the arguments flashkv does not
implement yet, paged-cache unpacking, the KV caches' dequantization scales, plan/run consistency
checks on the CPU path, outputs."""

import itertools
import math
import numbers
import weakref
from typing import NamedTuple

import numpy as np

from . import _C
from . import _array_core as A  # not _arrays, which loads _torch_ops (it imports this)
from . import _kv_formats as KQ

_BACKENDS = ("auto", "fa2")  # decode's kernels are FA2-style; "auto" picks CUDA or tensor cores
# Prefill: "fa2" the mma.sync kernel, "fa3" the Hopper wgmma kernel (sm_90a, 128-row query
# tiles, no variant; plan() raises where it cannot run), "auto" wgmma where it applies.
PREFILL_BACKENDS = ("auto", "fa2", "fa3")


def not_implemented(name: str, value, expected: str):
    raise NotImplementedError(
        f"{name}={value!r}: not supported here by flashkv yet (expected {expected}); attention "
        f"variants (RoPE, sliding window, soft-capping, sinks, custom masks, user variants) are "
        f"supported by the decode and prefill functions, not by the cascade wrappers")


def check_variant(pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, **absent):
    """NotImplementedError for anything but plain attention. `absent`: arguments that must be
    None (custom masks, scales, ...)."""
    if pos_encoding_mode != "NONE":
        not_implemented("pos_encoding_mode", pos_encoding_mode,
                        "'NONE': apply RoPE to q and k before attention, e.g. with "
                        "flashkv.apply_rope_pos_ids, or fused with the append in "
                        "BatchDecodeWithPagedKVCacheWrapper.run_step")
    if window_left is not None and window_left >= 0:
        not_implemented("window_left", window_left, "-1 (no sliding window)")
    if logits_soft_cap is not None and logits_soft_cap > 0:
        not_implemented("logits_soft_cap", logits_soft_cap, "None or 0")
    for name, value in absent.items():
        if value is not None:
            not_implemented(name, type(value).__name__, "None")


def check_multi_item_scoring(prefix_len_ptr=None, token_pos_in_items_ptr=None,
                             max_item_len_ptr=None):
    """FlashInfer's multi-item scoring (prefill plan()'s prefix_len_ptr, token_pos_in_items_ptr,
    max_item_len_ptr): not implemented, NotImplementedError naming the argument given."""
    for name, value in (("prefix_len_ptr", prefix_len_ptr),
                        ("token_pos_in_items_ptr", token_pos_in_items_ptr),
                        ("max_item_len_ptr", max_item_len_ptr)):
        if value is not None:
            raise NotImplementedError(
                f"{name}: FlashInfer's multi-item scoring (prefix_len_ptr, "
                f"token_pos_in_items_ptr, max_item_len_ptr) is not implemented by flashkv; "
                f"pass None (issue 43)")


def check_backend(backend: str, jit_args=None, jit_kwargs=None, allowed=_BACKENDS):
    if backend not in allowed:
        not_implemented("backend", backend, " or ".join(repr(b) for b in allowed))
    if jit_args is not None or jit_kwargs:
        not_implemented("jit_args", jit_args if jit_args is not None else jit_kwargs, "None")


def check_layout(kv_layout: str) -> str:
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")
    return kv_layout


def require_plan(plan, window_left=None):
    """run()'s checks against the plan in force: there is one, and a window_left given to run()
    is the plan's (flashkv compiles the window into the plan)."""
    if plan is None:
        raise ValueError("run: called before a successful plan()")
    if window_left is not None and window_left != plan["window_left"]:
        raise ValueError(f"window_left: {window_left} differs from the plan's "
                         f"{plan['window_left']}; flashkv compiles the window into the "
                         f"plan, so pass it to plan()")


def check_run_extras(args, q_scale=None, window_left=None, q_scale_name="q_scale"):
    """run()'s arguments flashkv does not implement: extra positional (variant) arguments, a
    query scale (fp8 queries), a window given to run()."""
    if args:
        not_implemented("*args", args, "no extra positional arguments (variant parameters)")
    if q_scale is not None and (not isinstance(q_scale, numbers.Real) or q_scale != 1.0):
        not_implemented(q_scale_name, q_scale if isinstance(q_scale, numbers.Real)
                        else type(q_scale).__name__,
                        "None or 1.0 (flashkv's queries are float16 / bfloat16; k_scale and "
                        "v_scale dequantize an fp8 KV cache)")
    if window_left is not None and window_left >= 0:
        not_implemented("window_left", window_left, "None or -1")


# --- the dequantization scales of an fp8 KV cache (FlashInfer's k_scale / v_scale) -------------


class KVScale(NamedTuple):
    """The C++ KVScale (flashkv/attention.h): the real key is the stored one times k (a float) times
    k_tensor (when given: float32 [1] or [num_kv_heads] on the cache's device, read by the kernel
    when it runs, so a CUDA graph replays with its current value); the same for values. A
    quantized format (flashkv.kv_quant: "int4-g64", ...) adds its group-scale pools (and INT4's
    zero points), which multiply with that factor."""

    k: float = 1.0
    v: float = 1.0
    k_tensor: object = None
    v_tensor: object = None
    format: str = ""
    k_group: object = None
    v_group: object = None
    k_zero: object = None
    v_zero: object = None

    def kwargs(self) -> dict:
        """The keyword arguments of flashkv._C's ops that read or write a KV cache (the group
        scales only with a format: only the CPU reference's ops take them)."""
        kw = dict(k_scale=self.k, v_scale=self.v, k_scale_tensor=self.k_tensor,
                  v_scale_tensor=self.v_tensor)
        if self.format:
            kw.update(kv_format=self.format, k_group_scale=self.k_group,
                      v_group_scale=self.v_group, k_zero=self.k_zero, v_zero=self.v_zero)
        return kw

    @property
    def is_identity(self) -> bool:
        return (self.k == 1.0 and self.v == 1.0 and self.k_tensor is None
                and self.v_tensor is None and not self.format)


NO_SCALE = KVScale()


def kv_heads(k, kv_layout, paged=True):
    """num_kv_heads of a k cache (paged [pages, page, H, D] NHD / [pages, H, page, D] HND, or
    contiguous [L, H, D] NHD / [H, L, D] HND); None for a shape that is neither (the C++ op
    names the shape)."""
    shape = tuple(k.shape)
    if len(shape) != (4 if paged else 3):
        return None
    nhd = kv_layout == "NHD"
    if paged:
        return int(shape[2] if nhd else shape[1])
    return int(shape[1] if nhd else shape[0])


def kv_scales(k_scale, v_scale, cache, num_kv_heads, names=("k_scale", "v_scale"),
              group=None) -> KVScale:
    """FlashInfer's k_scale / v_scale for KV cache `cache` (the k array: its dtype and device) of
    `num_kv_heads` heads (None: not known here) as a KVScale. Each scale: None (1), a float > 0,
    or a float32 array of 1 or num_kv_heads elements (flashkv extension: per KV head; a 0-d array
    counts as [1]) on the cache's device. A 16-bit (or float32) cache takes only None or 1.0:
    the kernels dequantize fp8 caches only, and a scale of another cache belongs in sm_scale.
    ValueError naming the argument otherwise.

    `group`: a quantized format's part (flashkv.kv_quant.GroupScales: the plan's format and the
    run()'s group-scale arrays), or None for a plan without one. With it the float / tensor
    scales are the format's per-tensor factor (NVFP4's f32 scale), whatever the cache dtype."""
    if group is None and (k_scale is None and v_scale is None):
        return NO_SCALE
    # Float (or None) scales: the checked KVScale is a function of the scales' types and values
    # and the cache's dtype, so it is kept (an engine passes the same scales on every layer).
    # Arrays are checked every call (their device and shape belong to the array).
    memo = None
    if group is None and type(k_scale) in _SCALAR_SCALES and type(v_scale) in _SCALAR_SCALES:
        memo = (type(k_scale), k_scale, type(v_scale), v_scale, getattr(cache, "dtype", None),
                names)
        try:
            hit = _SCALE_MEMO.get(memo)
        except TypeError:  # an unhashable dtype object: no memo
            hit, memo = None, None
        if hit is not None:
            return hit
    try:
        dtype = A.array_dtype(cache)
    except ValueError:  # a cache dtype flashkv does not take: the op says so
        dtype = str(getattr(cache, "dtype", "?"))
    fp8 = dtype in A.FP8_DTYPES or (group is not None and bool(group.format))
    kf, kt = _scale(names[0], k_scale, "k", fp8, dtype, cache, num_kv_heads)
    vf, vt = _scale(names[1], v_scale, "v", fp8, dtype, cache, num_kv_heads)
    if group is None or not group.format:
        scale = KVScale(kf, vf, kt, vt)
        if memo is not None and len(_SCALE_MEMO) < 256:
            _SCALE_MEMO[memo] = scale
        return scale
    return KVScale(kf, vf, kt, vt, group.format, group.k_group, group.v_group, group.k_zero,
                   group.v_zero)


_SCALAR_SCALES = (float, int, type(None))  # exact types (not bool, not NumPy scalars)
_SCALE_MEMO = {}  # (types, values, cache dtype, names) -> KVScale of a passed check


def _where(x) -> str:
    return f"cuda:{A.device_index(x)}" if A.is_cuda(x) else "the host"


def _scale(name, s, which, fp8, dtype, cache, num_kv_heads):
    """(float, array or None) of one scale argument (kv_scales)."""
    if s is None:
        return 1.0, None
    if isinstance(s, numbers.Real) and not isinstance(s, bool):
        f = float(s)
        if not (math.isfinite(f) and f > 0.0):
            raise ValueError(f"{name}: expected a finite scale > 0, got {s!r}")
        if f != 1.0 and not fp8:
            _not_fp8(name, repr(s), which, dtype)
        return f, None
    if not (hasattr(s, "shape") and hasattr(s, "dtype")):
        raise ValueError(f"{name}: expected None, a float or a float32 array of 1 or "
                         f"num_kv_heads elements, got {type(s).__name__}")
    if not fp8:
        _not_fp8(name, "<array>", which, dtype)
    try:
        s_dtype = A.array_dtype(s)
    except ValueError:
        s_dtype = str(s.dtype)
    if s_dtype != "f32":
        raise ValueError(f"{name}: expected a float32 array, got dtype {s.dtype}")
    shape = tuple(int(n) for n in s.shape)
    if not shape:
        s, shape = s.reshape(1), (1,)
    heads = "num_kv_heads" if num_kv_heads is None else f"{num_kv_heads} (num_kv_heads)"
    if len(shape) != 1 or (shape[0] != 1 and num_kv_heads is not None
                           and shape[0] != num_kv_heads):
        raise ValueError(f"{name}: expected shape [1] or [{heads}], got {list(shape)}")
    if A.is_cuda(s) != A.is_cuda(cache) or A.device_index(s) != A.device_index(cache):
        raise ValueError(f"{name}: expected an array on {_where(cache)} (the KV cache's device; "
                         f"the kernels read it when they run), got one on {_where(s)}")
    if shape[0] > 1:
        step = s.stride(0) if A.framework(s) == "torch" else s.strides[0] // s.itemsize
        if step != 1:
            raise ValueError(f"{name}: expected a contiguous array, got stride {step}")
    return 1.0, s


def _not_fp8(name, value, which, dtype):
    fold = ("fold it into sm_scale (plan()'s, for a wrapper): sm_scale * k_scale" if which == "k"
            else "multiply the output by it (attention is linear in the values)")
    raise ValueError(
        f"{name}={value}: flashkv dequantizes fp8 KV caches (float8_e4m3fn, float8_e5m2) only, "
        f"and this cache is {dtype}: pass None or 1.0 and {fold}")


# --- the structs of the C++ plan() calls (flashkv._C) --------------------------------------------


def make(cls, **fields):
    """A flashkv._C struct (AttentionShape, DecodePlanOptions, PageTableNames, ...) with `fields`
    set (AttributeError names a field the struct does not have)."""
    s = cls()
    for name, value in fields.items():
        setattr(s, name, value)
    return s


def page_table_names(qo_indptr="qo_indptr", kv_indptr="paged_kv_indptr",
                     kv_indices="paged_kv_indices", kv_last_page_len="paged_kv_last_page_len"):
    """How the C++ plan checks name the page-table arrays: the wrapper's argument names
    (FlashInfer's; the defaults are the paged prefill and cascade wrappers')."""
    return make(_C.PageTableNames, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
                kv_indices=kv_indices, kv_last_page_len=kv_last_page_len)


def attention_shape(plan) -> object:
    """The _C.AttentionShape of a decode or prefill plan (its heads, head_dim and dtypes)."""
    kv = plan["kv_dtype"]
    return make(_C.AttentionShape, num_qo_heads=plan["num_qo_heads"],
                num_kv_heads=plan["num_kv_heads"], head_dim=plan["head_dim"],
                q_dtype=plan["q_dtype"], kv_dtype=KQ.value_dtype(kv), o_dtype=plan["o_dtype"],
                kv_format=kv if KQ.is_format(kv) else "")


def plan_info(slot) -> dict:
    """A wrapper's plan_info(): the statistics of its C++ op's last plan as a dict (the bound
    PlanInfo's to_dict()), {} before a GPU plan."""
    return slot.op.plan_info().to_dict() if slot is not None and slot.op else {}


def sm_scale_arg(sm_scale) -> float:
    """The C++ sm_scale (0: 1/sqrt(head_dim))."""
    if sm_scale is None:
        return 0.0
    s = float(sm_scale)
    if not s > 0.0:
        raise ValueError(f"sm_scale: expected a positive value or None, got {sm_scale!r}")
    return s


def plan_dtypes(q_data_type, kv_data_type, o_data_type, data_type=None):
    """(q, kv, o) flashkv dtype names with FlashInfer's defaulting rules."""
    if data_type is not None:  # FlashInfer's deprecated spelling for q and kv at once
        q_data_type = data_type if q_data_type is None else q_data_type
        kv_data_type = data_type if kv_data_type is None else kv_data_type
    q = A.dtype_name("float16" if q_data_type is None else q_data_type)
    kv_format = KQ.format_name(kv_data_type)  # a quantized format ("int4-g64", ...) or None
    kv = q if kv_data_type is None else kv_format or A.dtype_name(kv_data_type)
    o = q if o_data_type is None else A.dtype_name(o_data_type)
    if q in A.FP8_DTYPES:
        raise NotImplementedError(
            f"q_data_type={q_data_type!r}: FP8 queries are not implemented by flashkv yet (fp8 KV "
            f"caches are, with float16 / bfloat16 queries; issue 43)")
    if o != q and o not in A.FP8_DTYPES:  # fp8 outputs: the C++ check's ValueError
        raise NotImplementedError(
            f"o_data_type={o_data_type!r}: flashkv's kernels write the output in q's dtype "
            f"({q}); another output dtype ({o}) needs a change of their epilogue, not done yet "
            f"(issue 43). Pass None (q's dtype) and convert the output afterwards")
    return q, kv, o


def host_kv_lens(indptr, last_page_len, page_size):
    """KV lengths (int64 [batch]) of a host page table: (pages - 1) * page_size + last_page_len,
    0 for a request without pages."""
    pages = indptr[1:].astype(np.int64) - indptr[:-1]
    return np.where(pages > 0, (pages - 1) * int(page_size) + last_page_len, 0)


def token_pages(k, v, kv_layout):
    """Contiguous k, v of one request as a paged cache of one-token pages, token t in page t:
    NHD [L, H, D] -> [L, 1, H, D], HND [H, L, D] -> [L, H, 1, D] (views). Returns (k, v, L)."""
    if kv_layout == "NHD":
        return k[:, None], v[:, None], int(k.shape[0])
    return A.swap01(k)[:, :, None], A.swap01(v)[:, :, None], int(k.shape[1])


def unpack_paged_kv_cache(paged_kv_cache):
    """(k, v) from a (k, v) tuple or one interleaved [num_pages, 2, ...] array."""
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(
                f"paged_kv_cache: expected a (k_cache, v_cache) pair, got {len(paged_kv_cache)} "
                f"arrays")
        return paged_kv_cache[0], paged_kv_cache[1]
    shape = tuple(paged_kv_cache.shape)
    if len(shape) != 5 or shape[1] != 2:
        raise ValueError(
            f"paged_kv_cache: expected a (k_cache, v_cache) tuple or one array "
            f"[num_pages, 2, page_size, num_kv_heads, head_dim] (NHD) or "
            f"[num_pages, 2, num_kv_heads, page_size, head_dim] (HND), got shape {shape}")
    return paged_kv_cache[:, 0], paged_kv_cache[:, 1]


def check_same_side(workspace_on_gpu: bool, device: int, x, name: str):
    """The wrapper's workspace decides where it runs: inputs must be on that side."""
    if A.is_cuda(x) != workspace_on_gpu or (workspace_on_gpu and A.device_index(x) != device):
        where = f"cuda:{device}" if workspace_on_gpu else "the host"
        raise ValueError(
            f"{name}: expected an array on {where} (where float_workspace_buffer is), got one "
            f"{'on cuda:%d' % A.device_index(x) if A.is_cuda(x) else 'on the host'}")


def check_planned(q, k, plan, name_kv="paged_kv_cache"):
    """CPU path: what the GPU run() checks against its plan (dtypes, heads, head_dim)."""
    if plan is None:
        raise ValueError("run: called before plan()")
    q_dt, kv_dt = A.array_dtype(q), A.array_dtype(k)
    if q_dt != plan["q_dtype"]:
        raise ValueError(f"q: expected dtype {plan['q_dtype']} (the plan's q_data_type), "
                         f"got {q_dt}")
    want_kv = KQ.value_dtype(plan["kv_dtype"])  # a quantized format's element dtype
    if kv_dt != want_kv:
        of = f" of {plan['kv_dtype']}" if want_kv != plan["kv_dtype"] else ""
        raise ValueError(f"{name_kv}: expected dtype {want_kv}{of} (the plan's "
                         f"kv_data_type), got {kv_dt}")
    if len(q.shape) != 3 or q.shape[1] != plan["num_qo_heads"] or q.shape[2] != plan["head_dim"]:
        raise ValueError(
            f"q: expected shape [*, {plan['num_qo_heads']}, {plan['head_dim']}] (the plan's "
            f"num_qo_heads, head_dim), got {tuple(q.shape)}")


def check_planned_paged(k, plan, kv_layout):
    """CPU path: the paged cache matches the plan's page_size, num_kv_heads and head_dim."""
    shape = tuple(k.shape)
    if len(shape) != 4:
        raise ValueError(f"paged_kv_cache: expected 4-D k/v caches, got shape {shape}")
    nhd = kv_layout == "NHD"
    packed = 2 if KQ.is_packed(plan["kv_dtype"]) else 1  # INT4 / NVFP4: two values a byte
    got = {"page_size": shape[1] if nhd else shape[2],
           "num_kv_heads": shape[2] if nhd else shape[1], "head_dim": shape[3] * packed}
    for name, value in got.items():
        if value != plan[name]:
            raise ValueError(f"paged_kv.{name}: expected {plan[name]} (the plan's), got {value} "
                             f"(k shape {shape}, {kv_layout})")


def outputs(q, rows_shape, head_dim, o_dtype, out, lse, return_lse):
    """(out, lse) arrays for a run: the caller's, or new ones beside q. lse only when asked."""
    if out is None:
        out = A.empty(q, tuple(rows_shape) + (head_dim,), dtype=o_dtype)
    if lse is None and return_lse:
        lse = A.empty(q, tuple(rows_shape), dtype="f32")
    return out, lse


def run_outputs(wrapper, q, k, out, lse, return_lse, indices_name=None):
    """What every planned wrapper's run() checks before it launches, and its outputs: q on the
    wrapper's side (GPU or host), the plan's host page ids against k's page count (when
    `indices_name` names them), then out/lse allocated or checked (``outputs``)."""
    plan = wrapper._plan
    check_same_side(wrapper._on_gpu, wrapper._device, q, "q")
    if indices_name is not None:
        check_page_ids_fit(plan, k, indices_name)
    return outputs(q, q.shape[:2], plan["head_dim"], plan["o_dtype"], out, lse, return_lse)


def launch_paged(wrapper, q, k, v, out, lse, scale=NO_SCALE):
    """The GPU run of a paged plan: the C++ op's run() with the plan's device page table and the
    cache's scales (KVScale), on q's stream."""
    plan = wrapper._plan
    A.call(wrapper._slot.op.run, q, k, v, wrapper._kv_layout, plan["run_indptr"], plan["indices"],
           plan["run_last_page_len"], out, lse, A.cuda_stream(q), **scale.kwargs())


class PagedRun:
    """The eager run of the paged wrappers (batch decode, paged prefill): also the body of their
    torch custom ops. The plan's checks and outputs, then the C++ op on the GPU or, on the host,
    the plan's checks and the wrapper's CPU reference (``_reference_run``)."""

    _indices_name = "indices"  # how a bad host page id is named (the wrapper's plan() argument)

    def _run(self, q, k, v, out, lse, return_lse, scale=NO_SCALE):
        """run() on the planned batch, eager (also the body of the torch custom op); `scale`: the
        cache's KVScale (kv_scales)."""
        plan = self._plan
        require_plan(plan)
        out, lse = run_outputs(self, q, k, out, lse, return_lse, self._indices_name)
        if self._on_gpu:
            launch_paged(self, q, k, v, out, lse, scale)
        else:
            check_planned_host(q, k, plan, self._kv_layout)
            self._reference_run(q, k, v, out, lse, scale)
        return finish(out, lse, return_lse)

    def _reference_run(self, q, k, v, out, lse, scale):
        raise NotImplementedError


def check_planned_host(q, k, plan, kv_layout):
    """The host path's checks of q and a paged cache against the plan (the GPU path's are C++)."""
    check_planned(q, k, plan)
    check_planned_paged(k, plan, kv_layout)


def finish(out, lse, return_lse):
    """FlashInfer's return value; lse converted in place to base 2."""
    if lse is not None:
        A.scale_lse_to_base2(lse)
    return (out, lse) if return_lse else out


# Wrappers by handle: the torch custom ops (flashkv._torch_ops) take an int naming the wrapper whose
# plan they run, since a plan is not a tensor. Weak: a handle dies with its wrapper.
_OBJECTS = weakref.WeakValueDictionary()
_NEXT_HANDLE = itertools.count(1)


def new_handle(obj) -> int:
    """A process-unique int that object_of() maps back to obj while obj lives."""
    handle = next(_NEXT_HANDLE)
    _OBJECTS[handle] = obj
    return handle


def object_of(handle: int):
    try:
        return _OBJECTS[int(handle)]
    except KeyError:
        raise ValueError(f"flashkv: no live wrapper has handle {handle} (a torch custom op was "
                         f"called with the handle of a wrapper that no longer exists)") from None


# --- plan()'s checks on the host path ---------------------------------------------------------
# Each path checks a plan once, in C++ (include/flashkv/plan_checks.h): the GPU path inside the C++
# op's plan() (given the host page ids and the wrapper's argument names, _C.PageTableNames), the
# host path (CPU reference) through _C.check_host_*_plan, the same functions, so a plan the GPU
# refuses is refused on the host too, with the same message (and CI, without a GPU, covers them).
# Page ids: plan() checks a host page table's ids are >= 0 and keeps its largest id; run()
# compares it with the cache's page count before anything runs: the C++ op's run() on the GPU, on
# the host check_page_ids_fit below (plan["page_id_max"] = (id, entry), None without host ids).
# Device-resident page tables are checked only on request, in the kernel (check_page_ids /
# FLASHKV_CHECK_DEVICE_ERRORS=1).


def check_page_ids_fit(plan, k, name: str):
    """run(), host side and without a sync: the plan's largest page id is below the page count of
    the cache run() was given (k: the k cache, [num_pages, ...]). Raises ValueError naming the
    entry (the C++ message) before anything is written."""
    m = plan.get("page_id_max")
    if m is not None and m[0] >= int(k.shape[0]):
        _C.check_page_ids_fit(int(m[0]), int(m[1]), int(k.shape[0]), name)


# HOST WORKSPACE RULE -- the one place to change it. The host path runs the CPU reference, which
# allocates what it needs itself, so today a host float_workspace_buffer only has to be non-empty
# (HOST_WORKSPACE_MIN_BYTES). To make the host path demand what the GPU path would (so a buffer
# too small for the GPU is refused in CI too), return that from host_workspace_need_bytes, e.g.
# the C++ op's minimum workspace bytes for `need` at a nominal SM count; check_host_workspace
# then names it.
HOST_WORKSPACE_MIN_BYTES = 1


def host_workspace_need_bytes(op_class, need: dict) -> int:
    """Bytes a host float_workspace_buffer must hold for a plan: `op_class` the C++ op the GPU
    path would use (_C.BatchDecode, _C.BatchPrefillPaged, _C.BatchPrefillRagged,
    _C.MultiLevelCascade), `need` the configuration it would ask OpSlot.acquire for (max_batch,
    num_qo_heads, head_dim, ...). Today: HOST_WORKSPACE_MIN_BYTES (see above)."""
    del op_class, need
    return HOST_WORKSPACE_MIN_BYTES


def nbytes(buf) -> int:
    return int(buf.nbytes) if hasattr(buf, "nbytes") else buf.numel() * buf.element_size()


def check_host_workspace(buf, need_bytes: int, what: str):
    """plan() on the host path: ValueError naming float_workspace_buffer and the minimum bytes
    when the buffer holds fewer than need_bytes (host_workspace_need_bytes)."""
    have = nbytes(buf)
    if have < need_bytes:
        raise ValueError(
            f"float_workspace_buffer: {have} bytes is too small for this plan ({what}): flashkv "
            f"needs at least {need_bytes} bytes (host workspace; e.g. numpy.empty({need_bytes}, "
            f"numpy.uint8)); pass a larger buffer")


# --- FlashInfer's deprecated forward() / forward_return_lse() --------------------------------
# FlashInfer's forward(q, kv, causal=..., pos_encoding_mode=..., ...) sets the variant at run
# time; flashkv compiles the variant into the plan. So forward() runs the plan as it is, and an
# argument the caller passes must be the plan's (ValueError naming it otherwise: pass it to
# plan()). An argument not passed means the plan's, not FlashInfer's default.

UNSET = object()

_FORWARD_DEFAULTS = dict(causal=False, pos_encoding_mode="NONE", window_left=-1,
                         logits_soft_cap=0.0, sm_scale=0.0, rope_scale=None, rope_theta=None)


def forward_args(**args) -> dict:
    """What a plan records for forward()'s checks (plan["forward_args"])."""
    out = {}
    for name, value in args.items():
        if name == "sm_scale":  # None or the C++ default 0: 1/sqrt(head_dim)
            value = 0.0 if value is None or value == 0 else sm_scale_arg(value)
        elif name == "window_left":
            value = -1 if value is None else int(value)
        elif name == "logits_soft_cap":
            value = float(value or 0.0)
        out[name] = value
    return out


def check_forward_args(plan, given: dict):
    """forward()'s variant arguments against the plan's (each UNSET: not passed)."""
    require_plan(plan)
    planned = plan.get("forward_args", {})
    for name, value in given.items():
        if value is UNSET:
            continue
        value = forward_args(**{name: value})[name]
        have = planned.get(name, _FORWARD_DEFAULTS.get(name))
        if value != have:
            raise ValueError(f"{name}={value!r}: forward() runs the plan, planned with "
                             f"{name}={have!r}; flashkv compiles the variant into the plan, so "
                             f"pass it to plan() (begin_forward())")
