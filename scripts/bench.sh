#!/usr/bin/env bash
# Builds flashkv and runs `flashkv bench` on its default workloads (ceilings, merge, decode).
# Extra arguments go to `flashkv bench` (e.g. `scripts/bench.sh decode --json out.json`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
BUILD=${BUILD:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target flashkv_cli
"$BUILD/flashkv" bench "$@"
