#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages the build needs, if any is missing (the CUDA toolkit itself
# is expected at /usr/local/cuda or on the PATH: headers and NVRTC; nvcc is not used), then checks
# the versions the build needs: CMake >= 3.25 and g++ >= 12 ($CXX when set, else g++). The Python
# package (scripts/test.sh builds it unless FLASHKV_PYTHON_TESTS=0) also needs a Python 3 with
# venv and its headers: $PYTHON, default python3.
#   scripts/install-deps.sh                   install what is missing, then check versions
#   scripts/install-deps.sh --check-versions  only check versions
set -euo pipefail

# version_ge A B: A >= B (dotted versions).
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

check_versions() {
  local ok=1 v cxx
  if ! command -v cmake >/dev/null 2>&1; then
    echo "flashkv needs CMake >= 3.25: no cmake on the PATH" >&2
    ok=0
  else
    v=$(cmake --version | sed -n '1s/[^0-9]*\([0-9][0-9.]*\).*/\1/p')
    if ! version_ge "${v:-0}" 3.25; then
      echo "flashkv needs CMake >= 3.25; $(command -v cmake) is ${v:-of unknown version}" \
           "(a newer one: pip install 'cmake>=3.25', or your distribution's backports)" >&2
      ok=0
    fi
  fi
  cxx=${CXX:-g++}
  if ! command -v "$cxx" >/dev/null 2>&1; then
    echo "flashkv needs g++ >= 12: $cxx is not on the PATH" >&2
    ok=0
  elif "$cxx" --version 2>/dev/null | head -n1 | grep -qi clang; then
    :  # not g++: its C++20 support is the user's call
  else
    v=$("$cxx" -dumpfullversion -dumpversion 2>/dev/null || true)
    if ! version_ge "${v:-0}" 12; then
      echo "flashkv needs g++ >= 12 (C++20); $cxx is ${v:-of unknown version}" \
           "(apt-get install g++-12, then CXX=g++-12)" >&2
      ok=0
    fi
  fi
  [ "$ok" = 1 ]
}

if [ "${1:-}" = --check-versions ]; then
  check_versions
  exit
fi

pkgs="cmake ninja-build g++ libcli11-dev nlohmann-json3-dev libxxhash-dev libgtest-dev"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ "${FLASHKV_PYTHON_TESTS:-1}" != 0 ] && ! "${PYTHON:-python3}" -c '
import ensurepip, os, sysconfig, sys, venv
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    >/dev/null 2>&1; then
  missing="$missing python3 python3-venv python3-dev"
fi
if [ -n "$missing" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "flashkv needs:$missing  (run: sudo apt-get install$missing)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq $missing >/dev/null
fi
check_versions
