"""Quantized KV cache formats beyond per-tensor / per-head fp8 (issue 42; flashkv/kv_quant.h).

A plan's ``kv_data_type`` may name one of them:

* ``"e4m3-per-token"`` / ``"e5m2-per-token"``: fp8 values ``[num_pages, page_size, H_kv, D]``
  (NHD; HND ``[num_pages, H_kv, page_size, D]``) with one float32 or bfloat16 scale per
  (token, KV head): group scales ``[num_pages, page_size, H_kv, 1]`` (HND:
  ``[num_pages, H_kv, page_size, 1]``);
* ``"int4-g32"`` / ``"int4-g64"`` / ``"int4-g128"``: uint8 ``[..., D // 2]`` (element 2i in the low
  nibble of byte i), asymmetric: ``x = scale * code + zero`` per group of 32 / 64 / 128 elements
  along head_dim; group scales and zero points ``[..., D // group]`` (float32, bfloat16 or
  float16, one dtype);
* ``"nvfp4"``: uint8 ``[..., D // 2]`` of e2m1 pairs, one e4m3 scale per 16 elements
  (``[..., D // 16]``, float8_e4m3fn), and NVFP4's per-tensor float32 scale as ``k_scale`` /
  ``v_scale``.

The scale pools have the cache's shape with head_dim replaced by the group count and share its
page ids (docs/design.md "Quantized KV formats" says why). run() of the decode and paged prefill
wrappers takes them as ``k_group_scale`` / ``v_group_scale`` (and ``k_zero`` / ``v_zero`` for
INT4) beside FlashInfer's ``k_scale`` / ``v_scale``, which multiply with them. No GPU kernel reads
these formats yet: a GPU plan raises NotImplementedError (naming the format and issue 42); host
wrappers run the CPU reference, which dequantizes exactly. :func:`quantize_kv` writes what the
quantizing append kernel will write; :func:`dequantize_kv` is its exact inverse.
"""

from typing import NamedTuple

from . import _C
from . import _array_core as A
from ._kv_formats import FORMATS, format_name, is_packed

__all__ = ["FORMATS", "QuantizedKV", "dequantize_kv", "quantize_kv"]

class QuantizedKV(NamedTuple):
    """What :func:`quantize_kv` returns: the cache values, the group scales, the zero points
    (INT4; else None) and the per-tensor scale used (pass it as k_scale / v_scale)."""

    values: object
    scales: object
    zeros: object
    tensor_scale: float


def _empty(like, shape, dtype):
    """A host array of flashkv dtype `dtype` in like's framework (fp8 as torch float8 / ml_dtypes
    float8, bf16 only for torch)."""
    fw = A.framework(like)
    if dtype in A.FP8_DTYPES:
        if fw == "torch":
            import torch

            return torch.empty(shape, dtype={"e4m3": torch.float8_e4m3fn,
                                             "e5m2": torch.float8_e5m2}[dtype])
        try:
            import ml_dtypes
        except ImportError:
            raise ValueError(f"{dtype} arrays on NumPy need ml_dtypes (pip install ml_dtypes), "
                             f"or pass a torch tensor") from None
        import numpy as np

        return np.empty(shape, dtype={"e4m3": ml_dtypes.float8_e4m3fn,
                                      "e5m2": ml_dtypes.float8_e5m2}[dtype])
    if dtype == "bf16" and fw != "torch":
        raise ValueError("scale_dtype: bfloat16 scales need a torch tensor (NumPy has no "
                         "bfloat16); use f32 or f16")
    return A.empty(like, shape, dtype)


def quantize_kv(x, kv_data_type, *, scale_dtype=None, tensor_scale=None) -> QuantizedKV:
    """Quantizes host K or V ``x [..., head_dim]`` (float32 / float16 / bfloat16; NumPy or a CPU
    torch tensor; any leading dims, e.g. a whole page pool ``[num_pages, page_size, H_kv, D]``)
    into format `kv_data_type`, computing the scales (kv_quantize.h: per-(token, head) absmax for
    fp8, min / max for INT4 with round-to-nearest-even codes clamped to 0..15, per-16 e4m3 block
    scales for NVFP4). scale_dtype: "f32" (default), "bf16" (torch) or "f16" (INT4) for the fp8 and
    INT4 formats; NVFP4's is e4m3. tensor_scale: the per-tensor factor the cache's k_scale /
    v_scale will carry (default 1; NVFP4: absmax / (6 * 448) of x)."""
    fmt = format_name(kv_data_type)
    if fmt is None:
        raise ValueError(f"kv_data_type: expected one of {', '.join(FORMATS)}, got "
                         f"{kv_data_type!r}")
    if A.is_cuda(x):
        raise ValueError("x: quantize_kv runs on the host (a GPU quantizing append is not "
                         "written yet: issue 42); pass a host array")
    shape = tuple(int(n) for n in x.shape)
    if not shape:
        raise ValueError("x: expected [..., head_dim], got a 0-d array")
    dim = shape[-1]
    vdt, _, groups, packed, zero = A.call(_C.kv_format_info, fmt, dim)
    if fmt == "nvfp4":
        if scale_dtype not in (None, "e4m3"):
            raise ValueError(f"scale_dtype: nvfp4's block scales are e4m3, got {scale_dtype!r}")
        sdt = "e4m3"
        if tensor_scale is None:
            tensor_scale = A.call(_C.nvfp4_tensor_scale, x)
    else:
        sdt = "f32" if scale_dtype is None else A.dtype_name(scale_dtype)
    tensor_scale = 1.0 if tensor_scale is None else float(tensor_scale)
    values = _empty(x, shape[:-1] + (dim // 2 if packed else dim,), vdt)
    scales = _empty(x, shape[:-1] + (groups,), sdt)
    zeros = _empty(x, shape[:-1] + (groups,), sdt) if zero else None
    A.call(_C.quantize_kv, x, fmt, tensor_scale, values, scales, zeros)
    return QuantizedKV(values, scales, zeros, tensor_scale)


def dequantize_kv(values, scales, zeros, kv_data_type, tensor_scale=1.0, out_dtype="f32"):
    """The exact inverse of :func:`quantize_kv`: ``[..., head_dim]`` of `out_dtype` (float32 by
    default; computed in double, rounded once) from the values, scales and zero points."""
    fmt = format_name(kv_data_type)
    if fmt is None:
        raise ValueError(f"kv_data_type: expected one of {', '.join(FORMATS)}, got "
                         f"{kv_data_type!r}")
    shape = tuple(int(n) for n in values.shape)
    dim = shape[-1] * (2 if is_packed(fmt) else 1)
    out = A.empty(values, shape[:-1] + (dim,), A.dtype_name(out_dtype))
    A.call(_C.dequantize_kv, values, scales, zeros, fmt, float(tensor_scale), out)
    return out
