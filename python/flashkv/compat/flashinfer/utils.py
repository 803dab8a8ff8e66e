"""``flashinfer.utils``: the enums and device queries FlashInfer programs and tests use."""

__path__ = []  # a package to importers: flashinfer.<this>.<sub> resolves to a stand-in

import enum
import math

from ._missing import module_getattr

__getattr__ = module_getattr("flashinfer.utils")

log2e = 1.44269504088896340736


class PosEncodingMode(enum.Enum):
    NONE = 0
    ROPE_LLAMA = 1
    ALIBI = 2


class MaskMode(enum.Enum):
    NON_CAUSAL = 0
    CAUSAL = 1
    CUSTOM = 2
    MULTIITEMSCORING = 3


class TensorLayout(enum.Enum):
    NHD = 0
    HND = 1


def get_compute_capability(device=None):
    import torch

    return torch.cuda.get_device_capability(device)


def _cc(device):
    try:
        return get_compute_capability(device)
    except Exception:  # noqa: BLE001  (no GPU: no architecture is supported)
        return (0, 0)


def is_sm90a_supported(device=None):
    """flashkv's Hopper kernels (wgmma, TMA) run on sm_90."""
    return _cc(device) == (9, 0)


def is_sm100a_supported(device=None):
    return False  # flashkv has no Blackwell kernels


def is_sm110a_supported(device=None):
    return False


def is_sm12x_supported(device=None):
    return False


def has_flashinfer_jit_cache():
    return False  # flashkv compiles with NVRTC at first use; there is no JIT cache package


def head_dim_512_supported(*args, **kwargs):
    """True: FlashInfer's tests then run their head_dim 512 cases, which flashkv reports as not
    implemented (NotImplementedError: counted as unsupported) instead of skipping them with a
    reason about SM80. flashkv's head dims: 64, 128, 256."""
    return True


def device_support_pdl(device=None):
    return _cc(device)[0] >= 9


def next_positive_power_of_2(x: int) -> int:
    return 1 if x < 1 else 1 << math.ceil(math.log2(x))


def ceil_div(x: int, y: int) -> int:
    return (x + y - 1) // y


def round_up(x: int, y: int) -> int:
    return ceil_div(x, y) * y
