"""How the extension module is linked: it must work in one process with PyTorch whatever C++
runtime the build's compiler linked (python/CMakeLists.txt says why)."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from flashkv import _C

# Symbols only a copy of the C++ runtime itself defines (not the inline template instantiations
# every C++ object may export, weakly, such as std::basic_string members): the ABI support library
# (__cxa_*, the personality routine, __cxxabiv1's vtables) and the compiled parts of iostreams
# and locales (std::ostream / istream members, std::locale, ios_base, codecvt) that crashed.
_RUNTIME = re.compile(r"^(__cxa_|__gxx_personality|_ZTVN10__cxxabiv1|_ZNSo|_ZNSi|_ZNSt6locale|"
                      r"_ZNSt8ios_base|_ZNK?St7codecvt)")


def test_module_exports_no_cxx_runtime():
    """A statically linked libstdc++ whose symbols the module exports is interposed by the
    libstdc++.so torch loads globally: half the runtime's calls go to the other copy (SIGSEGV in
    std::locale on the H200 image's /opt/gcc g++). The module must export its init and nothing of
    the runtime."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", "--defined-only", _C.__file__], check=True,
                         capture_output=True, text=True).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert any(n.startswith("PyInit_") for n in names), names[:20]
    leaked = [n for n in names if _RUNTIME.match(n)]
    assert not leaked, f"{len(leaked)} C++ runtime symbols exported, e.g. {leaked[:5]}"


def test_torch_first_then_a_call_that_formats_a_shape():
    """The sequence that crashed on the H200 image: torch imported first (it loads the system
    libstdc++ globally), then a flashkv call that builds a TensorView (whose checks use ostreams).
    Run in a child process so a crash fails this test instead of killing the session."""
    pytest.importorskip("torch")
    code = (
        "import torch, numpy as np, flashkv\n"
        "q = np.random.rand(4, 64).astype(np.float16)\n"
        "k = np.random.rand(7, 2, 64).astype(np.float16)\n"
        "out = flashkv.single_decode_with_kv_cache(q, k, k)\n"
        "assert out.shape == (4, 64) and np.isfinite(out.astype(np.float32)).all()\n"
        "try:\n"
        "    flashkv.single_decode_with_kv_cache(q, k[:, :, :32], k)\n"
        "except ValueError as e:\n"
        "    assert '[7, 2, 32]' in str(e) and 'head_dim' in str(e), e  # the shape, formatted\n"
        "else:\n"
        "    raise SystemExit('a bad shape was accepted')\n"
        "print('ok')\n")
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (
        f"exit {r.returncode}\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-2000:]}")
