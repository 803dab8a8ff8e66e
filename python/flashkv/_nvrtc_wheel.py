"""Where the nvidia-cuda-nvrtc wheel put NVRTC, told to flashkv._C before its first compile.

flashkv loads NVRTC with dlopen (src/runtime/nvrtc_library.h). A wheel user has no CUDA toolkit:
their NVRTC is the PyPI wheel's (``site-packages/nvidia/cu13/lib/libnvrtc.so.13``), a directory
neither the dynamic loader nor an RPATH fixed at build time knows. The installed distribution's
file list says where it is, whatever the site-packages directory (a venv, ``--user``,
``--target``), with no environment variable. Without the wheel, _C falls back to the loader's
search and the toolkit's usual places, and its error names everything it tried."""

import importlib.metadata
import os

from . import _C

# The distribution that ships NVRTC for the CUDA major flashkv._C is built for ("-cu12" was the
# suffix of CUDA 12's; CUDA 13's wheels carry none).
DISTRIBUTION = "nvidia-cuda-nvrtc"


def nvrtc_wheel_dir():
    """The directory of the nvidia-cuda-nvrtc wheel's NVRTC (the file _C.nvrtc_soname() names),
    or None when that wheel (of the right CUDA major) is not installed."""
    soname = _C.nvrtc_soname()
    try:
        files = importlib.metadata.files(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == soname:
            path = os.path.realpath(f.locate())
            if os.path.isfile(path):
                return os.path.dirname(path)
    return None


def register():
    """Adds the wheel's NVRTC directory to _C's search (first in it)."""
    d = nvrtc_wheel_dir()
    if d is not None:
        _C.add_nvrtc_search_dir(d)
