"""Attention variants for the decode and prefill wrappers (flashkv/variant_spec.h, variants.h).

FlashInfer's variant arguments (``pos_encoding_mode``, ``window_left``, ``logits_soft_cap``,
``rope_scale``, ``rope_theta``; prefill also ``custom_mask`` / ``packed_custom_mask``) and
flashkv's extras (``sinks``, ``alibi_slopes``, ``sigmoid``,
``sigmoid_bias``, the Llama 3.1 RoPE factors) map to one built-in ``flashkv::Variant``; a
:class:`Variant` with ``variant_args`` is a user's own variant: device C++ source that flashkv
JIT-compiles into its kernels (the hooks are documented in kernels/variants/variant.cuh).
The built-ins also run on the CPU reference (host arrays); user variants run on the GPU only.
"""

import math
import re

import numpy as np

from . import _C
from . import _arrays as A

_POS_ENCODING = {"NONE": "none", "ROPE_LLAMA": "llama", "ROPE_LLAMA31": "llama31",
                 "ALIBI": "none"}
_TENSOR_DTYPES = {"f32": "f32", "float32": "f32", "f16": "f16", "float16": "f16",
                  "bf16": "bf16", "bfloat16": "bf16", "i32": "i32", "int32": "i32"}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class Variant:
    """A user attention variant: ``source`` (device C++) defines ``struct <name>`` with
    ``using Args = Params;`` and any of the hooks of kernels/variants/variant.cuh
    (``logits_transform``, ``logits_mask``, ``query_transform``, ``key_transform``,
    ``value_transform``, ``sink``, ``output_transform``, ``kUseSoftmax``). ``params`` declares the
    fields of the generated ``struct Params``, as ``(name, kind)`` pairs with kind ``"f32"``,
    ``"i32"`` or ``"tensor:<dtype>"`` (``f32``, ``f16``, ``bf16``, ``i32``: a ``const T*``).
    ``use_softmax`` must equal the struct's ``kUseSoftmax`` (default true).

    Pass it to a decode plan() as ``variant=`` with ``variant_args={name: value}`` (floats, ints,
    arrays on the wrapper's device). A compile error (at plan()) raises RuntimeError with NVRTC's
    log, whose line numbers are those of ``source`` (``"<name>.variant(3): error: ..."``).

    Example, a T5-style relative position bias::

        t5 = flashkv.Variant("T5Bias", '''
            struct T5Bias {
              using Args = Params;
              __device__ static float logits_transform(const Args& a,
                  const flashkv::VariantPosition& p, float s) {
                int b = min(max(p.q_pos() - p.kv_idx, 0), a.num_buckets - 1);
                return s + a.bias[b];
              }
            };''', params=[("num_buckets", "i32"), ("bias", "tensor:f32")])
        wrapper.plan(..., variant=t5, variant_args={"num_buckets": 32, "bias": bias})
    """

    def __init__(self, name, source, params=(), use_softmax=True):
        if not isinstance(name, str) or not _IDENTIFIER.match(name):
            raise ValueError(f"Variant.name: expected a C++ identifier, got {name!r}")
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"Variant.source: expected the C++ definition of struct {name}")
        parsed, seen = [], set()
        for p in params:
            if not (isinstance(p, (tuple, list)) and len(p) == 2):
                raise ValueError(f"Variant.params: expected (name, kind) pairs, got {p!r}")
            pname, kind = p
            if not isinstance(pname, str) or not _IDENTIFIER.match(pname):
                raise ValueError(f"Variant.params: {pname!r} is not a C++ identifier")
            if pname in seen:
                raise ValueError(f"Variant.params: {pname!r} is declared twice")
            seen.add(pname)
            dt = _TENSOR_DTYPES.get(kind[7:]) if isinstance(kind, str) and kind.startswith(
                "tensor:") else None
            if kind in ("f32", "i32"):
                parsed.append((pname, kind, ""))
            elif dt is not None:
                parsed.append((pname, "tensor", dt))
            else:
                raise ValueError(f"Variant.params[{pname!r}]: kind {kind!r} (expected 'f32', "
                                 f"'i32' or 'tensor:<f32|f16|bf16|i32>')")
        self.name, self.source, self.params = name, source, tuple(parsed)
        self.use_softmax = bool(use_softmax)

    def __repr__(self):
        ps = ", ".join(f"{n}: {k if k != 'tensor' else 'tensor:' + d}" for n, k, d in self.params)
        return f"flashkv.Variant({self.name}, params=[{ps}], use_softmax={self.use_softmax})"


def alibi_slopes_for(num_heads: int) -> np.ndarray:
    """FlashInfer's ALiBi slopes for pos_encoding_mode="ALIBI" (the ALiBi paper's geometric
    sequence, interleaved for head counts that are not powers of two), float32 [num_heads]."""
    n = 2 ** math.floor(math.log2(num_heads))
    m = (2.0 ** (-8.0 / n)) ** np.arange(1, 1 + n)
    if n < num_heads:
        m = np.concatenate([m, (2.0 ** (-4.0 / n)) ** np.arange(1, 1 + 2 * (num_heads - n), 2)])
    return m.astype(np.float32)


_ALIBI_ON_DEVICE = {}  # (num_heads, framework, device) -> the slopes there, made once


def _alibi_slopes_on(num_heads, on_gpu, like):
    if not on_gpu:
        return alibi_slopes_for(num_heads)
    key = (num_heads, A.framework(like), A.device_index(like))
    if key not in _ALIBI_ON_DEVICE:
        _ALIBI_ON_DEVICE[key] = A.to_device_like(alibi_slopes_for(num_heads), like)
    return _ALIBI_ON_DEVICE[key]


def _host(x):
    fw = A.framework(x)
    if fw == "torch":
        x = x.detach().cpu().numpy()
    elif fw == "cupy":
        x = x.get()
    return np.asarray(x)


def _contiguous(x):
    fw = A.framework(x)
    if fw == "torch":
        return x.contiguous()
    if fw == "cupy":
        import cupy

        return cupy.ascontiguousarray(x)
    return np.ascontiguousarray(x) if fw == "numpy" else x


def _placed(x, name, dtype, on_gpu, like, opts):
    """x, contiguous, where the op runs: on like's device (host arrays are copied there, except in
    CUDA graph mode) or on the host (a CUDA array is an error: the wrapper runs the CPU
    reference). Appends what it returns to opts["keep"]."""
    out = _placed_array(x, name, dtype, on_gpu, like, opts["device_only"])
    opts["keep"].append(out)
    return out


def _placed_array(x, name, dtype, on_gpu, like, device_only):
    got = str(x.dtype).replace("torch.", "")
    got = _TENSOR_DTYPES.get(got, got)
    if got != dtype:
        raise ValueError(f"{name}: expected dtype {dtype}, got {got}")
    if on_gpu:
        if A.is_cuda(x):
            if A.device_index(x) != A.device_index(like):
                raise ValueError(f"{name}: expected an array on cuda:{A.device_index(like)}, got "
                                 f"one on cuda:{A.device_index(x)}")
            return _contiguous(x)
        if device_only:
            raise ValueError(f"{name}: expected an array on cuda:{A.device_index(like)} (in CUDA "
                             f"graph mode a captured run() keeps the pointers of its plan, so "
                             f"flashkv does not copy host arrays there), got a host array")
        return A.to_device_like(np.ascontiguousarray(_host(x)), like)
    if A.is_cuda(x):
        raise ValueError(f"{name}: expected a host array (this call runs the CPU reference on "
                         f"host arrays), got a CUDA array")
    return np.ascontiguousarray(_host(x))


def _head_vector(x, name, num_qo_heads, on_gpu, like, opts):
    if tuple(x.shape) != (num_qo_heads,):
        raise ValueError(f"{name}: expected shape [{num_qo_heads}] (one value per query head), "
                         f"got {tuple(x.shape)}")
    return _placed(x, name, "f32", on_gpu, like, opts)


def plan_variant(*, on_gpu, like, num_qo_heads, sm_scale, causal=False, pos_encoding_mode="NONE",
                 window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None,
                 low_freq_factor=1.0, high_freq_factor=4.0, old_context_len=8192.0, sinks=None,
                 alibi_slopes=None, sigmoid=False, sigmoid_bias=0.0, mask=None, variant=None,
                 variant_args=None, device_only=False, keep=None):
    """The flashkv._C.Variant a decode or prefill plan() runs, or None for plain attention (the
    op's own causal flag and sm_scale). Validates every argument (ValueError naming it); user
    variants on the host raise NotImplementedError. `causal`: the op's causal flag, recorded in a
    built-in (the CPU reference reads it there; the kernels take the op's); `mask`: a
    :class:`PackedMask` from :func:`packed_mask` or None. `like`: an array on the device the op
    runs on (for copies of host arrays); `device_only`: refuse host arrays on the GPU path;
    `keep`: a list that receives the arrays the variant points into."""
    opts = dict(device_only=device_only, keep=[] if keep is None else keep)
    if pos_encoding_mode not in _POS_ENCODING:
        raise ValueError(f"pos_encoding_mode: expected one of {', '.join(map(repr, _POS_ENCODING))}"
                         f", got {pos_encoding_mode!r}")
    window_left = -1 if window_left is None else int(window_left)
    if window_left < -1:
        raise ValueError(f"window_left: expected -1 (no window) or >= 0, got {window_left}")
    cap = 0.0 if logits_soft_cap is None else float(logits_soft_cap)
    if not (math.isfinite(cap) and cap >= 0.0):
        raise ValueError(f"logits_soft_cap: expected None, 0 (off) or a positive value, got "
                         f"{logits_soft_cap!r}")
    rope = _POS_ENCODING[pos_encoding_mode]
    llama31 = rope == "llama31"
    scale = float((8.0 if llama31 else 1.0) if rope_scale is None else rope_scale)
    theta = float((5e5 if llama31 else 1e4) if rope_theta is None else rope_theta)
    for name, val in (("rope_scale", scale), ("rope_theta", theta)):
        if not (math.isfinite(val) and val > 0.0):
            raise ValueError(f"{name}: expected a positive value, got {val!r}")
    if variant_args is not None and variant is None:
        raise ValueError("variant_args: given without variant=")
    if variant is not None:
        builtin = {"pos_encoding_mode": pos_encoding_mode != "NONE", "window_left":
                   window_left >= 0, "logits_soft_cap": cap > 0, "sinks": sinks is not None,
                   "alibi_slopes": alibi_slopes is not None, "sigmoid": bool(sigmoid),
                   "custom_mask": mask is not None}
        mixed = [n for n, on in builtin.items() if on]
        if mixed:
            raise ValueError(f"variant: a user variant cannot be combined with the built-in "
                             f"{', '.join(mixed)} (write that into the variant's source)")
        return _user_variant(variant, variant_args, on_gpu, like, opts)
    if sigmoid and sinks is not None:
        raise ValueError("sinks: sinks join a softmax denominator; sigmoid attention has none")
    if pos_encoding_mode == "ALIBI":
        if alibi_slopes is not None:
            raise ValueError("alibi_slopes: given with pos_encoding_mode='ALIBI' (which uses "
                             "FlashInfer's slopes); pass one or the other")
        alibi_slopes = _alibi_slopes_on(int(num_qo_heads), on_gpu, like)
    if (rope == "none" and window_left < 0 and cap == 0 and sinks is None
            and alibi_slopes is None and not sigmoid and mask is None):
        return None
    alibi = (None if alibi_slopes is None else
             _head_vector(alibi_slopes, "alibi_slopes", num_qo_heads, on_gpu, like, opts))
    sink = (None if sinks is None else
            _head_vector(sinks, "sinks", num_qo_heads, on_gpu, like, opts))
    if mask is not None:
        opts["keep"].extend((mask.bits, mask.indptr))
    return A.call(_C.builtin_variant, sm_scale=float(sm_scale), causal=bool(causal),
                  window_left=window_left, window_right=-1, logits_soft_cap=cap,
                  alibi_slopes=alibi, sinks=sink, sigmoid=bool(sigmoid),
                  sigmoid_bias=float(sigmoid_bias), rope_mode=rope, rope_scale=scale,
                  rope_theta=theta, low_freq_factor=float(low_freq_factor),
                  high_freq_factor=float(high_freq_factor),
                  old_context_len=float(old_context_len),
                  custom_mask=None if mask is None else mask.bits,
                  mask_indptr=None if mask is None else mask.indptr)


def check_lse_wanted(cvar, wanted):
    """ValueError when an lse is asked of a variant without softmax (sigmoid attention)."""
    if wanted and cvar is not None and not cvar.use_softmax:
        raise ValueError("return_lse / lse: the variant has no softmax (sigmoid attention), so "
                         "there is no lse")


class PackedMask:
    """A custom mask ready for the op: ``bits`` (uint8, FlashInfer's packed_custom_mask) and
    ``indptr`` (int32 [batch + 1] byte offsets), both where the op runs."""

    def __init__(self, bits, indptr):
        self.bits, self.indptr = bits, indptr


def _dtype_str(x):
    return str(x.dtype).replace("torch.", "")


def packed_mask(*, custom_mask=None, packed_custom_mask=None, mask_indptr=None, qo_lens, kv_lens,
                on_gpu, like, device_only=False, bufs=None):
    """A :class:`PackedMask` from FlashInfer's prefill mask arguments, or None without a mask.

    ``custom_mask``: bool, request b's ``[qo_len_b, kv_len_b]`` mask flattened row-major, the
    requests back to back (any shape with that many elements; True = attend); packed per request
    with bitorder "little" (FlashInfer's segment_packbits; flashkv's pack_custom_mask), each
    request starting on a byte boundary. ``packed_custom_mask``: those bytes (uint8, 1-D) as the
    caller packed them; ``mask_indptr`` (flashkv extension, int32 [batch + 1]): the byte offset of
    each request in it, by default the layout custom_mask packs to (request b at
    sum_{c<b} ceil(qo_len_c * kv_len_c / 8)). ``bufs``: (custom_mask_buf, mask_indptr_buf) of a
    CUDA-graph wrapper: the bytes and offsets are copied there (a captured run() keeps pointing at
    them), else None."""
    if custom_mask is None and packed_custom_mask is None:
        if mask_indptr is not None:
            raise ValueError("mask_indptr: given without packed_custom_mask")
        return None
    qo = np.asarray(qo_lens, np.int64).reshape(-1)
    kv = np.asarray(kv_lens, np.int64).reshape(-1)
    nbits = qo * kv
    nbytes = (nbits + 7) // 8
    indptr = np.concatenate([[0], np.cumsum(nbytes)]).astype(np.int64)
    if custom_mask is not None:
        if packed_custom_mask is not None:
            raise ValueError("custom_mask: given with packed_custom_mask; pass one or the other")
        if mask_indptr is not None:
            raise ValueError("mask_indptr: given with custom_mask (flashkv computes the offsets "
                             "when it packs custom_mask; pass packed_custom_mask to give yours)")
        if not hasattr(custom_mask, "shape") or _dtype_str(custom_mask) != "bool":
            got = _dtype_str(custom_mask) if hasattr(custom_mask, "dtype") else type(
                custom_mask).__name__
            raise ValueError(f"custom_mask: expected a bool array (True = attend), got {got} "
                             f"(packed uint8 bytes go to packed_custom_mask)")
        m = _host(custom_mask).reshape(-1)
        if m.size != int(nbits.sum()):
            raise ValueError(
                f"custom_mask: expected {int(nbits.sum())} elements (the sum over requests of "
                f"qo_len * kv_len, each request's [qo_len, kv_len] mask flattened), got {m.size}")
        starts = np.concatenate([[0], np.cumsum(nbits)])
        bits = np.concatenate([np.zeros(0, np.uint8)] + [
            np.packbits(m[starts[b]: starts[b + 1]], bitorder="little") for b in range(qo.size)])
    else:
        if not hasattr(packed_custom_mask, "shape") or _dtype_str(packed_custom_mask) != "uint8":
            got = _dtype_str(packed_custom_mask) if hasattr(packed_custom_mask, "dtype") else type(
                packed_custom_mask).__name__
            raise ValueError(f"packed_custom_mask: expected a uint8 array (bool masks go to "
                             f"custom_mask), got {got}")
        if len(packed_custom_mask.shape) != 1:
            raise ValueError(f"packed_custom_mask: expected a 1-D array, got shape "
                             f"{tuple(packed_custom_mask.shape)}")
        if mask_indptr is not None:
            indptr = A.host_i32(mask_indptr, "mask_indptr").astype(np.int64)
            if indptr.shape != (qo.size + 1,):
                raise ValueError(f"mask_indptr: expected shape [{qo.size + 1}] (batch + 1), got "
                                 f"{indptr.shape}")
            if (indptr < 0).any():
                raise ValueError("mask_indptr: expected non-negative byte offsets")
        need = int((indptr[:-1] + nbytes).max()) if qo.size else 0
        if int(packed_custom_mask.shape[0]) < need:
            raise ValueError(
                f"packed_custom_mask: expected at least {need} bytes (ceil(qo_len * kv_len / 8) "
                f"per request from its mask_indptr offset), got {int(packed_custom_mask.shape[0])}")
        bits = packed_custom_mask
    if indptr[-1] > 2**31 - 1:
        raise ValueError(f"custom_mask: {int(indptr[-1])} bytes exceed int32 offsets")
    indptr = indptr.astype(np.int32)
    if bufs is not None:  # CUDA graph mode: refill the constructor's buffers
        bits_buf, indptr_buf = bufs
        if bits_buf is None or indptr_buf is None:
            raise ValueError("custom_mask_buf and mask_indptr_buf are required in CUDA graph mode "
                             "with a custom mask (a captured run() keeps the mask's pointers)")
        n = max(int(bits.shape[0]), 1)
        _copy_bytes(bits_buf, bits, int(bits.shape[0]), "custom_mask_buf")
        A.copy_into(indptr_buf, indptr, indptr.shape[0], "mask_indptr_buf")
        return PackedMask(_contiguous(bits_buf[:n]), _contiguous(indptr_buf[: indptr.shape[0]]))
    if on_gpu:
        if A.is_cuda(bits):
            if A.device_index(bits) != A.device_index(like):
                raise ValueError(f"packed_custom_mask: expected an array on "
                                 f"cuda:{A.device_index(like)}, got one on "
                                 f"cuda:{A.device_index(bits)}")
            bits = _contiguous(bits)
        else:
            if device_only:
                raise ValueError("packed_custom_mask: expected a CUDA array in CUDA graph mode")
            bits = A.to_device_like(np.ascontiguousarray(_host(bits)), like)
        return PackedMask(bits, A.to_device_like(indptr, like))
    if A.is_cuda(bits):
        raise ValueError("packed_custom_mask: expected a host array (this call runs the CPU "
                         "reference on host arrays), got a CUDA array")
    return PackedMask(np.ascontiguousarray(_host(bits)), indptr)


def _copy_bytes(dst, src, n, name):
    """dst[:n] = src[:n] (uint8), src from any framework or the host."""
    if _dtype_str(dst) != "uint8":
        raise ValueError(f"{name}: expected a uint8 buffer, got {_dtype_str(dst)}")
    if n > dst.shape[0]:
        raise ValueError(f"{name}: the mask's {n} bytes do not fit the {dst.shape[0]} of the "
                         f"buffer given to the constructor (CUDA graph mode)")
    fw = A.framework(dst)
    if fw == "torch":
        import torch

        s = src if A.framework(src) == "torch" else torch.from_numpy(
            np.ascontiguousarray(_host(src)))
        dst[:n].copy_(s[:n], non_blocking=A.framework(src) == "torch")
    elif fw == "cupy":
        import cupy

        dst[:n] = cupy.asarray(src[:n] if A.framework(src) == "cupy" else _host(src)[:n])
    else:
        dst[:n] = _host(src)[:n]


def _user_variant(variant, variant_args, on_gpu, like, opts):
    if not isinstance(variant, Variant):
        raise TypeError(f"variant: expected a flashkv.Variant, got {type(variant).__name__}")
    args = {} if variant_args is None else variant_args
    if not isinstance(args, dict):
        raise TypeError(f"variant_args: expected a dict, got {type(args).__name__}")
    declared = {n: (k, d) for n, k, d in variant.params}
    for key in args:
        if key not in declared:
            raise ValueError(f"variant_args[{key!r}]: not a param of variant {variant.name} "
                             f"(declared: {', '.join(declared) or 'none'})")
    converted = {}
    for name, (kind, dtype) in declared.items():
        what = f"variant_args[{name!r}]"
        if name not in args:
            raise ValueError(f"{what}: missing (declared by variant {variant.name} as "
                             f"{kind if kind != 'tensor' else 'tensor:' + dtype})")
        value = args[name]
        if kind == "f32":
            if isinstance(value, bool) or not isinstance(value, (int, float, np.floating,
                                                                   np.integer)):
                raise ValueError(f"{what}: expected a float, got {type(value).__name__}")
            converted[name] = float(value)
        elif kind == "i32":
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{what}: expected an int, got {type(value).__name__}")
            converted[name] = int(value)
        elif not hasattr(value, "shape"):
            raise ValueError(f"{what}: expected an array, got {type(value).__name__}")
    if not on_gpu:
        raise NotImplementedError(
            f"variant={variant.name}: user variants (device C++ source) run on the GPU only; the "
            f"CPU reference covers the built-ins (pos_encoding_mode, window_left, "
            f"logits_soft_cap, sinks, alibi_slopes, sigmoid). Use CUDA arrays and a CUDA "
            f"workspace, or a built-in")
    for name, (kind, dtype) in declared.items():
        if kind == "tensor":
            converted[name] = A.dl(_placed(args[name], f"variant_args[{name!r}]", dtype, on_gpu,
                                           like, opts))
    return _C.user_variant(variant.name, variant.source, list(variant.params),
                           variant.use_softmax, converted)
