#!/usr/bin/env bash
# Prepares what scripts/gpu-test-wheel.sh needs on a GPU machine without network, in two carry
# folders (the device tool carries at most 64 MiB a call, the working tree included):
#   .carry/nvrtc-1/  the first 48 MiB of nvidia-cuda-nvrtc's wheel (first call: copy it aside)
#   .carry/wheels/   the flashkv wheel for $PYTHON's version (default python3.12: the GPU
#                    machine's), the rest of the nvrtc wheel and its sha256 (second call: the test)
# NVRTC_VERSION (default 13.0.88, the toolkit's NVRTC the GPU tests have used) picks the wheel.
# On the desk machine (pyenv's 3.12):
#   PYTHON=/root/.pyenv/versions/3.12.1/bin/python3 scripts/carry-wheels.sh
# then two device calls on one warm machine (about 57 and 48 MiB with the tree):
#   carry [".carry/nvrtc-1"]:  mkdir -p build-wheel/gpu-carry && cp .carry/nvrtc-1/* build-wheel/gpu-carry/
#   carry [".carry/wheels"]:   cp build-wheel/gpu-carry/* .carry/wheels/ &&
#                              scripts/gpu-test-wheel.sh .carry/wheels
# and, on the same machine (the venv stays in build-wheel/gpu), the cold start (carry nothing):
#   build-wheel/gpu/venv/bin/python scripts/cold_start.py --json "$OUT/cold-start.json"
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.12}
NVRTC_VERSION=${NVRTC_VERSION:-13.0.88}
rm -rf .carry/nvrtc-1 .carry/wheels
mkdir -p .carry/nvrtc-1 .carry/wheels
PYTHON=$PY scripts/build-wheel.sh .carry/wheels >/dev/null
DL=$(mktemp -d -t flashkv-nvrtc.XXXXXX)
trap 'rm -rf "$DL"' EXIT
# py3-none-manylinux_2_12: the same file for every CPython on x86_64.
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$DL" "nvidia-cuda-nvrtc==$NVRTC_VERSION"
WHL=$(cd "$DL" && ls nvidia_cuda_nvrtc-*.whl)
(cd "$DL" && sha256sum "$WHL") >".carry/wheels/$WHL.sha256"
split -b 48M -a 2 "$DL/$WHL" ".carry/wheels/$WHL.part-"
mv ".carry/wheels/$WHL.part-aa" .carry/nvrtc-1/
du -sh .carry/nvrtc-1 .carry/wheels
