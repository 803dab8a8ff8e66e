#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages the build needs, if any is missing (the CUDA toolkit itself
# is expected at /usr/local/cuda or on the PATH: headers and NVRTC; nvcc is not used). The Python
# package (scripts/test.sh builds it unless FLASHKV_PYTHON_TESTS=0) also needs a Python 3 with
# venv and its headers: $PYTHON, default python3.
set -euo pipefail
pkgs="cmake ninja-build g++ libcli11-dev nlohmann-json3-dev libxxhash-dev libgtest-dev"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ "${FLASHKV_PYTHON_TESTS:-1}" != 0 ] && ! "${PYTHON:-python3}" -c '
import ensurepip, os, sysconfig, sys, venv
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    >/dev/null 2>&1; then
  missing="$missing python3 python3-venv python3-dev"
fi
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "flashkv needs:$missing  (run: sudo apt-get install$missing)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq $missing >/dev/null
