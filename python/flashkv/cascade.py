"""⊕, the merge of attention states, with FlashInfer's ``flashinfer.cascade`` merge functions.

A state is (v, s): v the attention output over some keys ``[seq_len, num_heads, head_dim]``, s its
log-sum-exp ``float32 [seq_len, num_heads]``. Merging the states of two disjoint key sets gives
the state of their union, so attention split over KV chunks (or a shared prefix and per-request
suffixes) merges back into the full result. s is **base 2** here, as FlashInfer's (the LSE that
flashkv's wrappers return); flashkv's C++ API uses natural logs, and these functions convert
(which rounds s by about one float32 ulp). A state with s = -inf (no keys) is the identity.
Host arrays run on the CPU reference, CUDA arrays on the GPU on the caller's current stream.
"""

from . import _C
from . import _arrays as A


def _natural(s):
    return s * A.LN2  # a new array in s's framework


def merge_state(v_a, s_a, v_b, s_b, *, stream=None):
    """(v, s) = (v_a, s_a) ⊕ (v_b, s_b). v ``[seq_len, num_heads, head_dim]`` (float16, bfloat16
    or float32), s ``float32 [seq_len, num_heads]`` base 2. Returns new (V, S)."""
    v_out = A.empty(v_a, v_a.shape)
    s_out = A.empty(s_a, s_a.shape, dtype="f32")
    A.call(_C.merge_state, v_a, _natural(s_a), v_b, _natural(s_b), v_out, s_out,
           A.cuda_stream(v_a, stream))
    return v_out, A.scale_lse_to_base2(s_out)


def merge_state_in_place(v, s, v_other, s_other, mask=None, *, stream=None):
    """(v, s) = (v, s) ⊕ (v_other, s_other), written into v and s (base-2 s). ``mask`` (merge
    only some rows) raises NotImplementedError."""
    if mask is not None:
        raise NotImplementedError("mask: not supported by flashkv yet (expected None)")
    s_nat = _natural(s)
    A.call(_C.merge_state_in_place, v, s_nat, v_other, _natural(s_other),
           A.cuda_stream(v, stream))
    s[...] = s_nat * A.LOG2E


def merge_states(v, s, *, stream=None):
    """⊕ over the states of each row: v ``[seq_len, num_states, num_heads, head_dim]``, s
    ``float32 [seq_len, num_states, num_heads]`` base 2. Returns (V ``[seq_len, num_heads,
    head_dim]``, S ``[seq_len, num_heads]``)."""
    if len(v.shape) != 4:
        raise ValueError(f"v: expected shape [seq_len, num_states, num_heads, head_dim], got "
                         f"{tuple(v.shape)}")
    v_out = A.empty(v, (v.shape[0], v.shape[2], v.shape[3]))
    s_out = A.empty(s, (v.shape[0], v.shape[2]), dtype="f32")
    A.call(_C.merge_states, v, _natural(s), v_out, s_out, A.cuda_stream(v, stream))
    return v_out, A.scale_lse_to_base2(s_out)
