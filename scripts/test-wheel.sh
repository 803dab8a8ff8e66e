#!/usr/bin/env bash
# The wheel as a user gets it, on a machine without a GPU (CI runs it after scripts/test.sh):
# builds it (scripts/build-wheel.sh), installs it into a fresh venv with its dependencies from
# PyPI (nvidia-cuda-nvrtc among them) and runs the Python CPU tests against the installed package
# (from outside the repository, so python/flashkv's sources are not what is imported). Then checks
# that NVRTC is the wheel's, and, where a private mount namespace can be had (root and unshare),
# compiles a kernel with the CUDA toolkit hidden (a tmpfs over it): NVRTC and its builtins from
# site-packages alone. The GPU machine's counterpart is scripts/gpu-test-wheel.sh.
#   scripts/test-wheel.sh            (PYTHON picks the interpreter; default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
WHEEL=$(scripts/build-wheel.sh build-wheel/dist | tail -n 1)
echo "test-wheel: built $WHEEL"
VENV=$ROOT/build-wheel/venv-test
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$WHEEL" pytest ml_dtypes
RUN=$(mktemp -d -t flashkv-wheel-test.XXXXXX)
trap 'rm -rf "$RUN"' EXIT
export FLASHKV_CACHE_DIR=$RUN/cache
cd "$RUN"
"$VENV/bin/python" - "$VENV" <<'PY'
import os, sys
import flashkv
venv = os.path.realpath(sys.argv[1])
where, nvrtc = os.path.realpath(flashkv.__file__), flashkv.nvrtc_library()
print("flashkv from", where, "\nNVRTC from", nvrtc)
assert where.startswith(venv), f"flashkv imported from {where}, not the venv {venv}"
assert os.path.realpath(nvrtc).startswith(venv), f"NVRTC is {nvrtc}, not the wheel's in {venv}"
PY
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --rootdir="$ROOT/python/tests" \
  "$ROOT/python/tests"
# One compile with the toolkit out of sight (mount namespace: nothing changes outside it).
TOOLKIT=$(readlink -f /usr/local/cuda 2>/dev/null || true)
COMPILE=("$VENV/bin/python" -m flashkv.precompile --ops merge --dtypes f16 --head-dims 64 -j 1)
if [ -n "$TOOLKIT" ] && [ -d "$TOOLKIT" ] && unshare -m true 2>/dev/null; then
  unshare -m sh -c 'mount -t tmpfs none "$1" && shift && env -u LD_LIBRARY_PATH -u CUDA_HOME \
    -u CUDA_PATH "$@"' sh "$TOOLKIT" "${COMPILE[@]}"
  echo "test-wheel: compiled with $TOOLKIT hidden: NVRTC from the wheel alone"
else
  "${COMPILE[@]}"
  echo "test-wheel: compiled (toolkit not hidden: no /usr/local/cuda or no unshare here)"
fi
