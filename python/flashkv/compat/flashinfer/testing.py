"""``flashinfer.testing``: not provided (benchmark helpers of FlashInfer)."""

__path__ = []  # a package to importers: flashinfer.<this>.<sub> resolves to a stand-in

from ._missing import module_getattr

__getattr__ = module_getattr("flashinfer.testing")
