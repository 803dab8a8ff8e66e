#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages the build needs, if any is missing (the CUDA toolkit itself
# is expected at /usr/local/cuda or on the PATH: headers and NVRTC; nvcc is not used).
set -euo pipefail
pkgs="cmake ninja-build g++ libcli11-dev nlohmann-json3-dev libxxhash-dev libgtest-dev"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "flashkv needs:$missing  (run: sudo apt-get install$missing)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq $missing >/dev/null
