#!/usr/bin/env bash
# install_deps_versions.sh REPO: scripts/install-deps.sh --check-versions refuses a CMake older than
# 3.25 and a g++ older than 12 with a message naming each (stub tools first on the PATH), and accepts
# 3.25 / 12.
set -uo pipefail
repo=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
stub() {  # stub DIR CMAKE_VERSION GXX_VERSION
  mkdir -p "$1"
  printf '#!/bin/sh\necho "cmake version %s"\n' "$2" >"$1/cmake"
  printf '#!/bin/sh\ncase "$1" in -dump*) echo %s;; *) echo "g++ (GCC) %s";; esac\n' "$3" "$3" >"$1/g++"
  chmod +x "$1/cmake" "$1/g++"
}
stub "$tmp/old" 3.22.1 11.4.0
stub "$tmp/new" 3.25.0 12.1.0
out=$(PATH="$tmp/old:$PATH" CXX= "$repo/scripts/install-deps.sh" --check-versions 2>&1)
rc=$?
echo "$out"
[ "$rc" -ne 0 ] || { echo "FAIL: old versions accepted"; exit 1; }
grep -q "needs CMake >= 3.25; .*cmake is 3.22.1" <<<"$out" || { echo "FAIL: CMake message"; exit 1; }
grep -q "needs g++ >= 12 (C++20); g++ is 11.4.0" <<<"$out" || { echo "FAIL: g++ message"; exit 1; }
PATH="$tmp/new:$PATH" CXX= "$repo/scripts/install-deps.sh" --check-versions ||
  { echo "FAIL: CMake 3.25.0 / g++ 12.1.0 refused"; exit 1; }
echo PASS
