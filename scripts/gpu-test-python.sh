#!/usr/bin/env bash
# The Python package's tests on a machine with a CUDA GPU and PyTorch (its python3), logs to $OUT
# (the device tool's output folder) or ./gpu-test-logs:
#   scripts/gpu-test-python.sh [BUILD_DIR]     (default: build)
# Uses BUILD_DIR/python/flashkv/_C*.so when it is there (built for this machine's Python, e.g.
# elsewhere with `PYTHON=python3.12 BUILD=build-py312 scripts/test.sh` and carried); otherwise
# configures BUILD_DIR with -DFLASHKV_PYTHON=ON for python3 (which needs nanobind) and builds it.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
LOGS=${OUT:-gpu-test-logs}
PY=${PYTHON:-python3}
mkdir -p "$LOGS"
if ! PYTHONPATH="python:$BUILD/python" "$PY" -c 'import flashkv' 2>/dev/null; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHKV_PYTHON=ON \
    -DPython_EXECUTABLE="$(command -v "$PY")" && cmake --build "$BUILD" --target flashkv_python \
    || exit 1
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' \
  2>&1 | tee "$LOGS/python-env.log"
FLASHKV_REQUIRE_GPU=1 PYTHONPATH="python:$BUILD/python" "$PY" -m pytest -v -p no:cacheprovider -rs python/tests \
  2>&1 | tee "$LOGS/python-tests.log"
status=${PIPESTATUS[0]}
echo "gpu-test-python: $([ "$status" -eq 0 ] && echo PASSED || echo FAILED)"
exit "$status"
