"""``flashinfer.quantization``'s bit packing (custom masks) on the caller's arrays."""

__path__ = []  # a package to importers: flashinfer.<this>.<sub> resolves to a stand-in

import numpy as np

from ... import _array_core as A
from ._missing import module_getattr

__getattr__ = module_getattr("flashinfer.quantization")


def _check_bitorder(bitorder):
    if bitorder not in ("big", "little"):
        raise ValueError(f"bitorder: expected 'big' or 'little', got {bitorder!r}")


def packbits(x, bitorder="big"):
    """numpy.packbits of a 1-D binary array, in x's framework and on its device."""
    _check_bitorder(bitorder)
    host = np.asarray(x.detach().cpu().numpy() if A.framework(x) == "torch" else x)
    packed = np.packbits(host.astype(bool).reshape(-1), bitorder=bitorder)
    return _like(packed, x)


def segment_packbits(x, indptr, bitorder="big"):
    """Each segment x[indptr[i]:indptr[i+1]] packed on its own: (packed, new_indptr)."""
    _check_bitorder(bitorder)
    host = np.asarray(x.detach().cpu().numpy() if A.framework(x) == "torch" else x).astype(bool)
    ip = A.host_i32(indptr, "indptr")
    parts = [np.packbits(host[ip[i]:ip[i + 1]], bitorder=bitorder) for i in range(len(ip) - 1)]
    new_indptr = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int32)
    packed = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    return _like(packed, x), _like(new_indptr, indptr)


def _like(a, like):
    if A.framework(like) == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(a)).to(like.device)
    return A.to_device_like(a, like)
