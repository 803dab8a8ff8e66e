"""Framework-neutral array helpers: which framework an array belongs to, where it lives, how to
allocate outputs beside it, and which CUDA stream its framework is using.

flashkv never imports torch or cupy itself: an array of theirs can only exist once they are
imported, so the helpers import them lazily, for arrays of theirs only.

This module imports no other flashkv module but the extension flashkv._C (which imports none:
dl() hands fp8 arrays to _C.fp8_view). The modules the torch custom ops are built on (_common,
_eager) import the helpers from here; everything else uses them through :mod:`flashkv._arrays`,
which re-exports them beside the route to the torch custom ops (so _arrays can load _torch_ops
without an import cycle; python/tests/test_import_graph.py checks).
"""

from typing import NamedTuple

import numpy as np

from . import _C

LOG2E = 1.4426950408889634  # log2(e): natural-log LSE -> base 2 (FlashInfer's)
LN2 = 0.6931471805599453  # ln(2): base-2 LSE -> natural log (flashkv's C++ API)

_DLPACK_CUDA = 2

# Canonical flashkv dtype names (flashkv::parse_dtype) for the spellings callers use.
_DTYPE_ALIASES = {
    "float16": "f16", "half": "f16", "f16": "f16", "fp16": "f16",
    "bfloat16": "bf16", "bf16": "bf16",
    "float32": "f32", "float": "f32", "f32": "f32", "fp32": "f32",
    "float8_e4m3fn": "e4m3", "e4m3": "e4m3", "fp8_e4m3": "e4m3",
    "float8_e5m2": "e5m2", "e5m2": "e5m2", "fp8_e5m2": "e5m2",
    # Raw bytes: the packed 4-bit pairs of an INT4 / NVFP4 cache (flashkv.kv_quant).
    "uint8": "u8", "u8": "u8",
}
_NUMPY_DTYPES = {"f16": np.float16, "f32": np.float32, "i32": np.int32, "u8": np.uint8}
FP8_DTYPES = ("e4m3", "e5m2")
# The fp8 arrays dl() passes as a uint8 view and their dtype: torch's float8 tensors (by str() of
# their dtype) and NumPy arrays of ml_dtypes' float8 types (by dtype name).
_FP8_ARRAY_DTYPES = {"torch.float8_e4m3fn": "e4m3", "torch.float8_e5m2": "e5m2",
                     "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


def framework(x) -> str:
    """"torch", "numpy", "cupy" or "other", from the array's type."""
    root = type(x).__module__.partition(".")[0]
    return root if root in ("torch", "numpy", "cupy") else "other"


def is_cuda(x) -> bool:
    fw = framework(x)
    if fw == "numpy":
        return False
    if fw == "torch":
        return x.is_cuda
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        raise TypeError(
            f"expected an array with DLPack support (NumPy, PyTorch, CuPy, ...), "
            f"got {type(x).__name__}")
    return int(dev()[0]) == _DLPACK_CUDA


def device_index(x) -> int:
    """The CUDA device of a CUDA array (0 for host arrays)."""
    if not is_cuda(x):
        return 0
    if framework(x) == "torch":
        return x.device.index
    return int(x.__dlpack_device__()[1])


def dtype_name(dtype) -> str:
    """flashkv's name ("f16", "bf16", "f32", ...) for a str, torch.dtype or NumPy dtype."""
    if isinstance(dtype, str):
        key = dtype
    elif type(dtype).__module__.startswith("torch"):
        key = str(dtype).replace("torch.", "")
    else:
        key = np.dtype(dtype).name
    try:
        return _DTYPE_ALIASES[key.lower()]
    except KeyError:
        raise ValueError(
            f"unsupported data type {dtype!r}: expected float16, bfloat16, float32, "
            f"float8_e4m3fn or float8_e5m2 (fp8: KV caches only)") from None


def array_dtype(x) -> str:
    return dtype_name(x.dtype)


_RAW_STREAM = []  # [torch._C._cuda_getCurrentRawStream or None], at the first torch CUDA array
_TORCH_DTYPES = {}  # flashkv name -> torch dtype, filled at the first torch allocation


def framework_dtype(like, name: str):
    """The dtype object of `like`'s framework for flashkv dtype `name` ("i32" too)."""
    fw = framework(like)
    if fw == "torch":
        if not _TORCH_DTYPES:
            import torch

            _TORCH_DTYPES.update(f16=torch.float16, bf16=torch.bfloat16, f32=torch.float32,
                                 i32=torch.int32, u8=torch.uint8)
        return _TORCH_DTYPES[name]
    if name != "i32" and name == array_dtype(like):
        return like.dtype
    if name in _NUMPY_DTYPES:
        return _NUMPY_DTYPES[name]
    raise TypeError(f"{fw} has no {name} dtype: pass out= explicitly")


def empty(like, shape, dtype=None):
    """An uninitialized array in `like`'s framework and on its device. dtype: a flashkv dtype name
    ("f32", ...) or None for like's dtype."""
    shape = tuple(int(s) for s in shape)
    dt = like.dtype if dtype is None else framework_dtype(like, dtype)
    fw = framework(like)
    if fw == "torch":
        # torch.empty(shape, dtype=dt, device=like.device), without building a device object
        return like.new_empty(shape, dtype=dt)
    if fw == "numpy":
        return np.empty(shape, dtype=dt)
    if fw == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=dt)
    raise TypeError(
        f"flashkv allocates outputs for NumPy, PyTorch and CuPy arrays; for "
        f"{type(like).__name__} pass out= (and lse=)")


def contiguous(x):
    """x as a contiguous array of its own framework, dtype and device (a copy only when x is not
    contiguous). The host paths' one conversion of a data array: never through NumPy, which has
    no bfloat16 or float8 for a torch tensor (flashkv._C takes torch's through dl())."""
    fw = framework(x)
    if fw == "torch":
        return x.contiguous()
    if fw == "cupy":
        import cupy

        return cupy.ascontiguousarray(x)
    if fw == "numpy":
        return np.ascontiguousarray(x)
    raise TypeError(f"expected a NumPy, PyTorch or CuPy array, got {type(x).__name__}")


def assign(dst, src):
    """dst[...] = src for two arrays of one framework (a strided dst, e.g. a transposed view of
    the caller's output, is written in place)."""
    fw = framework(dst)
    if fw != framework(src):
        raise TypeError(f"cannot copy a {framework(src)} array into a {fw} one")
    if fw == "torch":
        dst.copy_(src)
    elif fw == "numpy":
        np.copyto(dst, src)
    else:
        dst[...] = src


def swap01(x):
    """A view with the first two dimensions exchanged (HND [H, L, D] <-> NHD [L, H, D])."""
    return x.swapaxes(0, 1)


def cuda_stream(x, stream=None) -> int:
    """The CUDA stream for work on `x`: an explicit `stream` (an int handle, a torch.cuda.Stream
    or a CuPy stream), else the current stream of x's framework (torch, CuPy), else 0 (the legacy
    default stream). Host arrays need no stream."""
    if stream is not None:
        if isinstance(stream, int):
            return stream
        for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
            handle = getattr(stream, attr, None)
            if handle is not None:
                return int(handle)
        raise TypeError(
            f"stream: expected an int handle, a torch.cuda.Stream or a CuPy stream, "
            f"got {type(stream).__name__}")
    if not is_cuda(x):
        return 0
    fw = framework(x)
    if fw == "torch":
        if not _RAW_STREAM:
            import torch

            # torch.cuda.current_stream(device).cuda_stream builds a Stream object per call;
            # the raw handle of the same stream is one call (inductor's get_raw_stream).
            _RAW_STREAM.append(getattr(torch._C, "_cuda_getCurrentRawStream", None))
        raw = _RAW_STREAM[0]
        if raw is not None:
            return raw(x.get_device())
        import torch

        return torch.cuda.current_stream(x.device).cuda_stream
    if fw == "cupy":
        import cupy

        with cupy.cuda.Device(x.device.id):
            return cupy.cuda.get_current_stream().ptr
    return 0


def host_i32(x, name: str) -> np.ndarray:
    """A contiguous host int32 copy (or view) of an index array from any framework."""
    fw = framework(x)
    if fw == "torch":
        x = x.detach().to("cpu").numpy()
    elif fw == "cupy":
        x = x.get()
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D index array, got shape {a.shape}")
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer array, got dtype {a.dtype}")
    if a.dtype != np.int32 and a.size and (a.min() < -(2**31) or a.max() >= 2**31):
        raise ValueError(f"{name}: values do not fit int32")
    return np.ascontiguousarray(a, dtype=np.int32)


def index_i32(x, name: str):
    """An index array as flashkv._C takes it, where it lives: contiguous int32 on the device for
    a CUDA array (device_i32), a host int32 NumPy array otherwise (host_i32)."""
    fast = _TORCH_FAST[0] if _TORCH_FAST else None
    if (fast is not None and type(x) is fast.tensor and x.is_cuda and x.dtype is fast.int32
            and x.is_contiguous()):
        return x  # what device_i32 returns for it, without the two no-op conversions
    return device_i32(x) if is_cuda(x) else host_i32(x, name)


def device_i32(x):
    """A CUDA index array as the kernels read it: contiguous int32 (a copy only if needed)."""
    fw = framework(x)
    if fw == "torch":
        import torch

        return x.to(torch.int32).contiguous()
    if fw == "cupy":
        import cupy

        return cupy.ascontiguousarray(x, dtype=cupy.int32)
    return x


def to_device_like(a: np.ndarray, like):
    """Host array `a` on `like`'s device, in its framework (no copy for host `like`)."""
    if not is_cuda(like):
        return a
    fw = framework(like)
    if fw == "torch":
        import torch

        return torch.from_numpy(a).to(like.device)
    if fw == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.asarray(a)
    raise TypeError(f"cannot copy an index array to the device of a {type(like).__name__}")


def copy_into(dst, src, n: int, name: str):
    """dst[:n] = src (a fixed CUDA-graph buffer refilled by plan()); src from any framework."""
    if n > dst.shape[0]:
        raise ValueError(f"{name}: {n} entries do not fit the {dst.shape[0]} of the buffer "
                         f"given to the constructor (CUDA graph mode)")
    if framework(dst) == framework(src) and framework(dst) != "other":
        if framework(dst) == "torch":
            dst[:n].copy_(src, non_blocking=True)
        else:
            dst[:n] = src
        return
    host = host_i32(src, name)
    if framework(dst) == "torch":
        import torch

        dst[:n].copy_(torch.from_numpy(host), non_blocking=False)
    elif framework(dst) == "cupy":
        import cupy

        dst[:n] = cupy.asarray(host)
    else:
        dst[:n] = host


def dl(x):
    """x as flashkv._C receives it: a torch tensor as a DLPack capsule taken with stream=-1 (no
    synchronization: torch's __dlpack__() without a stream makes its default stream wait on the
    current one, an extra dependency that is illegal while a CUDA graph is being captured);
    anything else unchanged (nanobind imports it through DLPack or the buffer protocol).

    fp8 arrays (torch float8_e4m3fn / float8_e5m2 tensors, NumPy arrays of ml_dtypes' float8
    types) go as a uint8 view retyped by flashkv._C.fp8_view (DLPack codes 10 / 12): PyTorch
    releases before DLPack 1.1 refuse to export float8, and NumPy cannot; no copy either way.

    Per layer an engine passes ~25 arguments through here, so the common cases are cheap: Python
    scalars by type, a plain torch.Tensor straight to torch's legacy exporter (what its
    __dlpack__(stream=-1) calls after its checks, which are made here too: a tensor that would
    fail them takes __dlpack__ and raises its error); a NumPy dtype's name only for user-defined
    dtypes (ml_dtypes')."""
    t = type(x)
    if t in _PLAIN_TYPES:
        return x
    fast = _TORCH_FAST[0] if _TORCH_FAST else None
    if fast is not None and t is fast.tensor:
        if (x.layout is fast.strided and not x.is_conj()
                and (not x.is_cuda or x.get_device() == fast.current_device())):
            fp8 = fast.fp8.get(x.dtype)
            if fp8 is not None:
                return _C.fp8_view(fast.to_dlpack(x.view(fast.uint8)), fp8)
            return fast.to_dlpack(x)
        return _dl_torch(x)
    if t is np.ndarray:
        if x.dtype.num >= 256:  # a user-defined dtype (NPY_USERDEF): ml_dtypes' are
            fp8 = _FP8_ARRAY_DTYPES.get(x.dtype.name)
            if fp8 is not None:
                return _C.fp8_view(x.view(np.uint8), fp8)
        return x
    fw = framework(x)
    if fw == "torch" and hasattr(x, "__dlpack__"):
        _init_torch_fast()
        return _dl_torch(x)
    if fw == "numpy" and isinstance(x, np.ndarray):
        fp8 = _FP8_ARRAY_DTYPES.get(x.dtype.name)
        if fp8 is not None:
            return _C.fp8_view(x.view(np.uint8), fp8)
    return x


_PLAIN_TYPES = frozenset((int, float, bool, str, type(None)))


class _TorchFast(NamedTuple):
    tensor: type
    strided: object
    to_dlpack: object
    fp8: dict
    uint8: object
    current_device: object
    int32: object


_TORCH_FAST = []  # [_TorchFast] once a torch tensor has been seen (flashkv never imports torch)


def _init_torch_fast():
    if _TORCH_FAST:
        return
    import torch

    fp8 = {getattr(torch, name): code for name, code in
           (("float8_e4m3fn", "e4m3"), ("float8_e5m2", "e5m2")) if hasattr(torch, name)}
    current = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
    _TORCH_FAST.append(_TorchFast(torch.Tensor, torch.strided, torch._C._to_dlpack, fp8,
                                  torch.uint8, current, torch.int32))


def _dl_torch(x):
    """dl() of any torch tensor through its __dlpack__ (subclasses, and tensors whose export
    torch refuses: its BufferError)."""
    fp8 = _FP8_ARRAY_DTYPES.get(str(x.dtype))
    if fp8 is not None:
        import torch

        return _C.fp8_view(x.detach().view(torch.uint8).__dlpack__(stream=-1), fp8)
    return x.detach().__dlpack__(stream=-1)


def call(fn, *args, **kwargs):
    """fn(*args, **kwargs) with every torch tensor among the arguments passed through dl()."""
    return fn(*[dl(a) for a in args], **{k: dl(v) for k, v in kwargs.items()})


def scale_lse_to_base2(lse):
    """In place: natural-log LSE (flashkv's C++) -> base 2 (FlashInfer's)."""
    lse *= LOG2E
    return lse
