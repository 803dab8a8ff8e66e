#!/usr/bin/env bash
# The Python package's tests on a machine with a CUDA GPU and PyTorch (its python3), logs to $OUT
# (the device tool's output folder) or ./gpu-test-logs:
#   scripts/gpu-test-python.sh [BUILD_DIR [PYTEST_ARGS...]]   (default: build-pip, all of python/tests)
# Builds and installs the package the way a user on that machine does, with its default
# environment (its CXX, e.g. the H200 image's /opt/gcc/bin/g++): `pip install .` (without build
# isolation: such machines often have no index to fetch scikit-build-core and nanobind from, so
# those must be installed) into BUILD_DIR/site, keeping CMake's build in BUILD_DIR/cmake so a second
# run rebuilds only what changed. Then runs python/tests against the installed package, GPU tests
# included (FLASHKV_REQUIRE_GPU=1: a missing GPU fails instead of skipping).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-pip}
shift $(( $# > 0 ? 1 : 0 ))
LOGS=${OUT:-gpu-test-logs}
PY=${PYTHON:-python3}
mkdir -p "$LOGS" "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
echo "CXX=${CXX:-<unset>} ($(${CXX:-c++} --version 2>/dev/null | head -n 1))" | tee "$LOGS/python-build.log"
"$PY" -m pip install --no-build-isolation --no-deps --upgrade --target "$BUILD/site" \
  --config-settings=build-dir="$BUILD/cmake" . >>"$LOGS/python-build.log" 2>&1 \
  || { tail -n 40 "$LOGS/python-build.log"; echo "gpu-test-python: pip install FAILED"; exit 1; }
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' \
  2>&1 | tee "$LOGS/python-env.log"
# The installed package only (not python/flashkv's sources): what a user imports.
FLASHKV_REQUIRE_GPU=1 PYTHONPATH="$BUILD/site" "$PY" -m pytest -v -p no:cacheprovider -rs \
  --rootdir=python/tests "${@:-python/tests}" 2>&1 | tee "$LOGS/python-tests.log"
status=${PIPESTATUS[0]}
echo "gpu-test-python: $([ "$status" -eq 0 ] && echo PASSED || echo FAILED)"
exit "$status"
