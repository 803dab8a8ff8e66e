"""The eager bodies of the ops that :mod:`flashkv._torch_ops` registers as torch custom ops: ⊕ (the
merges of attention states), the paged KV append and the pos_ids RoPE. The public functions
(:mod:`flashkv.cascade`, :mod:`flashkv.page`, :mod:`flashkv.rope`) call them off the op route,
the ops call them as their bodies.

They live here, not in the public modules, so that _torch_ops imports no public module: the
imports run one way, public modules -> _arrays -> (lazily) _torch_ops -> _eager, _common ->
_array_core, _C (python/tests/test_import_graph.py checks that they have no cycle). This module
imports _C, _array_core and _common only.

LSE is base 2 here, as everywhere in the Python API; flashkv's C++ API takes natural logs.
"""

from . import _C
from . import _array_core as A
from . import _common as C

# --- ⊕ (flashkv.cascade) ---


def _natural(s):
    return s * A.LN2  # a new array in s's framework


def _merge_state(v_a, s_a, v_b, s_b, stream=None):
    v_out = A.empty(v_a, v_a.shape)
    s_out = A.empty(s_a, s_a.shape, dtype="f32")
    A.call(_C.merge_state, v_a, _natural(s_a), v_b, _natural(s_b), v_out, s_out,
           A.cuda_stream(v_a, stream))
    return v_out, A.scale_lse_to_base2(s_out)


def _merge_state_in_place(v, s, v_other, s_other, stream=None):
    s_nat = _natural(s)
    A.call(_C.merge_state_in_place, v, s_nat, v_other, _natural(s_other),
           A.cuda_stream(v, stream))
    s[...] = s_nat * A.LOG2E


def _merge_states(v, s, stream=None):
    if len(v.shape) != 4:
        raise ValueError(f"v: expected shape [seq_len, num_states, num_heads, head_dim], got "
                         f"{tuple(v.shape)}")
    v_out = A.empty(v, (v.shape[0], v.shape[2], v.shape[3]))
    s_out = A.empty(s, (v.shape[0], v.shape[2]), dtype="f32")
    A.call(_C.merge_states, v, _natural(s), v_out, s_out, A.cuda_stream(v, stream))
    return v_out, A.scale_lse_to_base2(s_out)


# --- KV append (flashkv.page) ---


def _append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                           kv_indices, kv_indptr, kv_last_page_len, kv_layout, stream=None,
                           scale=C.NO_SCALE):
    """`scale`: the cache's _common.KVScale (an fp8 cache quantizes with it)."""
    k, v = C.unpack_paged_kv_cache(paged_kv_cache)
    A.call(_C.append_paged_kv_cache, append_key, append_value,
           A.index_i32(batch_indices, "batch_indices"), A.index_i32(positions, "positions"), k,
           v, kv_layout, A.index_i32(kv_indptr, "kv_indptr"),
           A.index_i32(kv_indices, "kv_indices"),
           A.index_i32(kv_last_page_len, "kv_last_page_len"), A.cuda_stream(k, stream),
           **scale.kwargs())


# --- RoPE with per-token positions (flashkv.rope) ---


def _rope_pos_ids(q, k, q_rope, k_rope, pos_ids, kind, rotary_dim, interleave, rope_scale,
                  rope_theta, low_freq_factor, high_freq_factor, old_context_len, stream=None):
    pos = A.index_i32(pos_ids, "pos_ids")
    if kind == "llama31":
        A.call(_C.apply_llama31_rope_pos_ids, q, k, q_rope, k_rope, pos, rotary_dim, interleave,
               rope_scale, rope_theta, low_freq_factor, high_freq_factor, old_context_len,
               A.cuda_stream(q, stream))
    else:
        A.call(_C.apply_rope_pos_ids, q, k, q_rope, k_rope, pos, rotary_dim, interleave,
               rope_scale, rope_theta, A.cuda_stream(q, stream))
