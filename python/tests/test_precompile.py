"""`python -m flashkv.precompile` (the wheel's way to fill the kernel cache; no GPU needed) and
where NVRTC comes from (flashkv/_nvrtc_wheel.py)."""

import importlib.metadata
import os
import subprocess
import sys

import pytest

import flashkv
from flashkv import _C, _nvrtc_wheel
from flashkv import precompile as pc


def run_precompile(args, cache_dir):
    env = dict(os.environ, FLASHKV_CACHE_DIR=str(cache_dir),
               PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-m", "flashkv.precompile", *args], env=env,
                          capture_output=True, text=True, timeout=600)


def test_defaults_are_the_cpp_options():
    a = pc.parse_args([])
    d = _C.precompile_defaults()
    assert (a.arch, a.ops, a.dtypes, a.head_dims) == (d["arch"], d["ops"], d["dtypes"],
                                                      d["head_dims"])
    assert set(a.ops) == set(_C.precompile_ops())


def test_list_names_the_model_kernels(tmp_path):
    shape = ["--ops", "decode", "prefill", "--head-dims", "128", "--group-sizes", "4",
             "--page-sizes", "16", "--dtypes", "f16", "bf16"]
    r = run_precompile(["--list", *shape], tmp_path)
    assert r.returncode == 0, r.stderr
    ids = r.stdout.split()
    assert ids == _C.precompile_kernel_ids("sm_90a", ["decode", "prefill"], ["f16", "bf16"], [],
                                           [128], [4], [16])
    assert any("bf16" in i for i in ids) and any("f16" in i for i in ids)


def test_compiles_then_finds_the_cache(tmp_path):
    args = ["--ops", "merge", "--dtypes", "f16", "--head-dims", "64", "-j", "1",
            "--json", str(tmp_path / "k.json")]
    first = run_precompile(args, tmp_path / "cache")
    assert first.returncode == 0, first.stderr
    assert "1 compiled, 0 cached" in first.stdout, first.stdout
    second = run_precompile(args, tmp_path / "cache")
    assert "0 compiled, 1 cached" in second.stdout, second.stdout


def test_bad_option_is_refused(tmp_path):
    r = run_precompile(["--ops", "nonsense"], tmp_path)
    assert r.returncode == 2 and "--ops" in r.stderr


def test_nvrtc_is_the_wheels_when_installed():
    """With the nvidia-cuda-nvrtc wheel installed (the flashkv wheel depends on it), its NVRTC is
    the one loaded, wherever a toolkit is; without it, whatever the fallbacks found."""
    try:
        importlib.metadata.distribution(_nvrtc_wheel.DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        assert _nvrtc_wheel.nvrtc_wheel_dir() is None
        pytest.skip("the nvidia-cuda-nvrtc wheel is not installed")
    wheel_dir = _nvrtc_wheel.nvrtc_wheel_dir()
    assert wheel_dir is not None
    assert os.path.dirname(os.path.realpath(flashkv.nvrtc_library())) == wheel_dir
    assert os.path.basename(flashkv.nvrtc_library()) == _C.nvrtc_soname()
