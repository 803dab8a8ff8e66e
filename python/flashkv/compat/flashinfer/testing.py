"""``flashinfer.testing``: not provided (benchmark helpers of FlashInfer)."""

from ._missing import module_getattr

__getattr__ = module_getattr("flashinfer.testing")
