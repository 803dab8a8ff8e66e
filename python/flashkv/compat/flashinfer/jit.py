"""``flashinfer.jit``: flashkv compiles its kernels with NVRTC at first use, so building
FlashInfer's JIT specs ahead of time is a no-op here; generating FlashInfer modules is not
supported (stand-ins raise NotImplementedError)."""

from ._missing import module_getattr

__getattr__ = module_getattr("flashinfer.jit", "flashkv compiles its own kernels (NVRTC)")
__path__ = []  # a package: `flashinfer.jit.<sub>` imports resolve to stand-ins


class MissingJITCacheError(RuntimeError):
    """FlashInfer's error for a kernel missing from its AOT cache (never raised by flashkv)."""


def build_jit_specs(specs=None, verbose=False, skip_prebuilt=True):
    """A no-op: flashkv needs no prebuilt FlashInfer modules."""
    del specs, verbose, skip_prebuilt
