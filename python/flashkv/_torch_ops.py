"""flashkv's GPU ops as torch custom ops (``torch.library.custom_op``, namespace ``flashkv``), so
that torch.compile captures a wrapper's run() (and merge_state, append_paged_kv_cache and the
pos_ids RoPE) as one opaque op instead of breaking the graph at the nanobind call.

Loaded lazily, never at build time: ``import flashkv`` loads it when torch is already imported,
otherwise the first flashkv call (or wrapper) that sees a torch tensor does; ``import
flashkv._torch_ops`` registers the ops explicitly. flashkv itself never imports torch. The public
functions and the wrappers' run() call these ops when their inputs are torch CUDA tensors (and
no explicit ``stream=`` is given); everything else runs the eager path as before. The ops' bodies
are those eager paths, from flashkv._eager and the wrappers' _run: this module imports no public
flashkv module (python/tests/test_import_graph.py checks).

Ops (``torch.ops.flashkv.*``):
  batch_decode_run, batch_prefill_paged_run, batch_prefill_ragged_run
      (q, k, v, handle, o_dtype, return_lse, *SCALES) -> (out, lse)
  batch_decode_run_out, batch_prefill_paged_run_out, batch_prefill_ragged_run_out
      (q, k, v, out!, lse!?, handle, *SCALES) -> ()
  merge_state(v_a, s_a, v_b, s_b) -> (v, s); merge_states(v, s) -> (v, s);
  merge_state_in_place(v!, s!, v_other, s_other) -> ()
  append_paged_kv_cache(append_key, append_value, batch_indices, positions, k_cache!, v_cache!?,
      kv_indices, kv_indptr, kv_last_page_len, kv_layout, *SCALES) -> ()   (v_cache None: k_cache
      is the interleaved [num_pages, 2, ...] cache)
  rope_pos_ids(q, k, pos_ids, kind, rotary_dim, interleave, rope_scale, rope_theta,
      low_freq_factor, high_freq_factor, old_context_len) -> (q_rope, k_rope);
  rope_pos_ids_(q!, k!, pos_ids, ...) -> ()   (kind "llama" or "llama31")
*SCALES, last in every op that reads or writes a KV cache, are the cache's dequantization scales
(FlashInfer's k_scale / v_scale, _common.KVScale): ``k_scale: float = 1, v_scale: float = 1,
k_scale_tensor: Tensor? = None, v_scale_tensor: Tensor? = None`` (a float scale is a float, a
tensor scale float32 [1] or [num_kv_heads] on the cache's device; the kernels read tensors when
they run, so a CUDA graph replays with their current values). LSE is base 2, as everywhere in the
Python API. With return_lse False the run ops return an empty ``[0]`` float32 lse (custom ops
have no optional outputs).

Plans stay outside the graph. plan() is plain Python that reads host page tables and writes the
wrapper's plan; a run op names its wrapper by an int ``handle`` and runs the plan that wrapper
holds when the op executes. Dynamo guards on the handle (a compiled function is specialised to
its wrapper objects) and on the plan's output dtype (``o_dtype``, passed so the fake can allocate
the output). The page indices and the workspace are plan state the op reads and no op in a graph
writes. The fake implementations allocate what the kernels write: out shaped like q in o_dtype,
lse ``q.shape[:2]`` float32; the out= variants and in-place ops return nothing. No autograd
formulas: these are inference kernels.
"""

from typing import Optional

import torch

from . import _common as C
from . import _eager as E

if not hasattr(getattr(torch, "library", None), "custom_op"):
    raise ImportError("flashkv._torch_ops needs torch >= 2.4 (torch.library.custom_op)")

Tensor = torch.Tensor
F32 = torch.float32
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def wants(x) -> bool:
    """The tensors the public API hands to these ops: torch CUDA tensors (tests widen this)."""
    return isinstance(x, torch.Tensor) and x.is_cuda


def tracing() -> bool:
    """Whether torch.compile is tracing the call: the public API routes through these ops only
    then, so the compiled graph holds one op per call. Eagerly an op only puts torch's dispatcher
    in front of the same body: ~100 us per decode run() on the H200 against ~20 us without
    (bench/python_run_overhead.py, bench/results/python-run-overhead-2026-12-02.log)."""
    return torch.compiler.is_compiling()


def _no_lse(q):
    return q.new_empty((0,), dtype=F32)


# --- the wrappers' run(): decode, paged prefill, ragged prefill ---


def _scale_args(scale):
    """The *SCALES arguments of the ops for a _common.KVScale."""
    return scale.k, scale.v, scale.k_tensor, scale.v_tensor


def _define_run(name):
    """flashkv::<name> (functional) and flashkv::<name>_out (writes out / lse) for a wrapper whose
    eager body is wrapper._run(q, k, v, out, lse, return_lse, scale)."""

    @torch.library.custom_op(f"flashkv::{name}", mutates_args=())
    def run(q: Tensor, k: Tensor, v: Tensor, handle: int, o_dtype: torch.dtype, return_lse: bool,
            k_scale: float = 1.0, v_scale: float = 1.0, k_scale_tensor: Optional[Tensor] = None,
            v_scale_tensor: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        out = q.new_empty(q.shape, dtype=o_dtype)
        lse = q.new_empty(q.shape[:2], dtype=F32) if return_lse else None
        scale = C.KVScale(k_scale, v_scale, k_scale_tensor, v_scale_tensor)
        C.object_of(handle)._run(q, k, v, out, lse, return_lse, scale)
        return out, (lse if return_lse else _no_lse(q))

    @run.register_fake
    def _(q, k, v, handle, o_dtype, return_lse, k_scale=1.0, v_scale=1.0, k_scale_tensor=None,
          v_scale_tensor=None):
        lse = q.new_empty(q.shape[:2], dtype=F32) if return_lse else _no_lse(q)
        return q.new_empty(q.shape, dtype=o_dtype), lse

    @torch.library.custom_op(f"flashkv::{name}_out", mutates_args=("out", "lse"))
    def run_out(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Optional[Tensor],
                handle: int, k_scale: float = 1.0, v_scale: float = 1.0,
                k_scale_tensor: Optional[Tensor] = None,
                v_scale_tensor: Optional[Tensor] = None) -> None:
        scale = C.KVScale(k_scale, v_scale, k_scale_tensor, v_scale_tensor)
        C.object_of(handle)._run(q, k, v, out, lse, lse is not None, scale)

    @run_out.register_fake
    def _(q, k, v, out, lse, handle, k_scale=1.0, v_scale=1.0, k_scale_tensor=None,
          v_scale_tensor=None):
        return None

    return run, run_out


RUN_OPS = {name: _define_run(name) for name in
           ("batch_decode_run", "batch_prefill_paged_run", "batch_prefill_ragged_run")}


def wrapper_run(name, wrapper, q, k, v, out, lse, return_lse, scale=C.NO_SCALE):
    """A wrapper's run() through flashkv::<name>: the functional op when the caller passes no
    output arrays, else the _out op (allocating the one not given). FlashInfer's return value.
    `scale`: the cache's _common.KVScale."""
    run, run_out = RUN_OPS[name]
    o_dtype = DTYPES.get(wrapper._plan["o_dtype"])
    if o_dtype is None:  # an output dtype these ops do not name: the eager path
        return wrapper._run(q, k, v, out, lse, return_lse, scale)
    if out is None and lse is None:
        out, lse = run(q, k, v, wrapper._handle, o_dtype, return_lse, *_scale_args(scale))
        return (out, lse) if return_lse else out
    if out is None:
        out = q.new_empty(q.shape, dtype=o_dtype)
    if lse is None and return_lse:
        lse = q.new_empty(q.shape[:2], dtype=F32)
    run_out(q, k, v, out, lse, wrapper._handle, *_scale_args(scale))
    return (out, lse) if return_lse else out


# --- ⊕ ---


@torch.library.custom_op("flashkv::merge_state", mutates_args=())
def merge_state(v_a: Tensor, s_a: Tensor, v_b: Tensor, s_b: Tensor) -> tuple[Tensor, Tensor]:
    return E._merge_state(v_a, s_a, v_b, s_b)


@merge_state.register_fake
def _(v_a, s_a, v_b, s_b):
    return v_a.new_empty(v_a.shape), s_a.new_empty(s_a.shape, dtype=F32)


@torch.library.custom_op("flashkv::merge_state_in_place", mutates_args=("v", "s"))
def merge_state_in_place(v: Tensor, s: Tensor, v_other: Tensor, s_other: Tensor) -> None:
    E._merge_state_in_place(v, s, v_other, s_other)


@merge_state_in_place.register_fake
def _(v, s, v_other, s_other):
    return None


@torch.library.custom_op("flashkv::merge_states", mutates_args=())
def merge_states(v: Tensor, s: Tensor) -> tuple[Tensor, Tensor]:
    return E._merge_states(v, s)


@merge_states.register_fake
def _(v, s):
    if v.dim() != 4:
        raise ValueError(f"v: expected shape [seq_len, num_states, num_heads, head_dim], got "
                         f"{tuple(v.shape)}")
    return (v.new_empty((v.shape[0], v.shape[2], v.shape[3])),
            v.new_empty((v.shape[0], v.shape[2]), dtype=F32))


# --- KV append ---


@torch.library.custom_op("flashkv::append_paged_kv_cache", mutates_args=("k_cache", "v_cache"))
def _append(append_key: Tensor, append_value: Tensor, batch_indices: Tensor, positions: Tensor,
            k_cache: Tensor, v_cache: Optional[Tensor], kv_indices: Tensor, kv_indptr: Tensor,
            kv_last_page_len: Tensor, kv_layout: str, k_scale: float = 1.0,
            v_scale: float = 1.0, k_scale_tensor: Optional[Tensor] = None,
            v_scale_tensor: Optional[Tensor] = None) -> None:
    cache = k_cache if v_cache is None else (k_cache, v_cache)
    E._append_paged_kv_cache(append_key, append_value, batch_indices, positions, cache,
                             kv_indices, kv_indptr, kv_last_page_len, kv_layout,
                             scale=C.KVScale(k_scale, v_scale, k_scale_tensor, v_scale_tensor))


@_append.register_fake
def _(append_key, append_value, batch_indices, positions, k_cache, v_cache, kv_indices, kv_indptr,
      kv_last_page_len, kv_layout, k_scale=1.0, v_scale=1.0, k_scale_tensor=None,
      v_scale_tensor=None):
    return None


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                          kv_indices, kv_indptr, kv_last_page_len, kv_layout, scale=C.NO_SCALE):
    """flashkv.append_paged_kv_cache through the op (`scale`: the cache's _common.KVScale);
    NotImplemented when an argument is not a torch tensor (the caller then runs the eager
    path)."""
    if isinstance(paged_kv_cache, (tuple, list)):
        k_cache, v_cache = C.unpack_paged_kv_cache(paged_kv_cache)
    else:
        k_cache, v_cache = paged_kv_cache, None
    tensors = (append_value, batch_indices, positions, k_cache, kv_indices, kv_indptr,
               kv_last_page_len)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return NotImplemented
    if v_cache is not None and not isinstance(v_cache, torch.Tensor):
        return NotImplemented
    _append(append_key, append_value, batch_indices, positions, k_cache, v_cache, kv_indices,
            kv_indptr, kv_last_page_len, kv_layout, *_scale_args(scale))
    return None


# --- RoPE with per-token positions ---


@torch.library.custom_op("flashkv::rope_pos_ids", mutates_args=())
def _rope(q: Tensor, k: Tensor, pos_ids: Tensor, kind: str, rotary_dim: int, interleave: bool,
          rope_scale: float, rope_theta: float, low_freq_factor: float, high_freq_factor: float,
          old_context_len: float) -> tuple[Tensor, Tensor]:
    q_rope, k_rope = q.new_empty(q.shape), k.new_empty(k.shape)
    E._rope_pos_ids(q, k, q_rope, k_rope, pos_ids, kind, rotary_dim, interleave, rope_scale,
                    rope_theta, low_freq_factor, high_freq_factor, old_context_len)
    return q_rope, k_rope


@_rope.register_fake
def _(q, k, pos_ids, kind, rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor,
      high_freq_factor, old_context_len):
    return q.new_empty(q.shape), k.new_empty(k.shape)


@torch.library.custom_op("flashkv::rope_pos_ids_", mutates_args=("q", "k"))
def _rope_(q: Tensor, k: Tensor, pos_ids: Tensor, kind: str, rotary_dim: int, interleave: bool,
           rope_scale: float, rope_theta: float, low_freq_factor: float, high_freq_factor: float,
           old_context_len: float) -> None:
    E._rope_pos_ids(q, k, q, k, pos_ids, kind, rotary_dim, interleave, rope_scale, rope_theta,
                    low_freq_factor, high_freq_factor, old_context_len)


@_rope_.register_fake
def _(q, k, pos_ids, kind, rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor,
      high_freq_factor, old_context_len):
    return None


def rope_pos_ids(inplace, q, k, pos_ids, *args):
    """The pos_ids RoPE forms through the ops (args: kind, rotary_dim, interleave, rope_scale,
    rope_theta, low_freq_factor, high_freq_factor, old_context_len); NotImplemented when k or
    pos_ids is not a torch tensor."""
    if not (isinstance(k, torch.Tensor) and isinstance(pos_ids, torch.Tensor)):
        return NotImplemented
    if inplace:
        _rope_(q, k, pos_ids, *args)
        return None
    return _rope(q, k, pos_ids, *args)
