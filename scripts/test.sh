#!/usr/bin/env bash
# Builds flashkv and runs the test suite: CPU tests everywhere; GPU tests run where a CUDA GPU is
# present and skip cleanly otherwise. Then checks that an installed flashkv works from a consumer
# project through find_package(flashkv).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
BUILD=${BUILD:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j "$JOBS"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS"
# Install into a scratch prefix and build the consumer example against it.
PREFIX=$(mktemp -d)
cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null
cmake -S examples/consumer -B "$BUILD/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null
cmake --build "$BUILD/consumer" >/dev/null
"$BUILD/consumer/consumer"
echo "install check: find_package(flashkv) consumer built and ran"
