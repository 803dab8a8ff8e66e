#!/usr/bin/env bash
# The wheel on a GPU machine with the CUDA toolkit out of reach (issue 45's "wheel" test):
#   scripts/gpu-test-wheel.sh WHEEL_DIR [PYTEST_ARGS...]
# WHEEL_DIR (scripts/carry-wheels.sh prepares it, and says how to carry it) holds the flashkv
# wheel for this machine's python3 (scripts/build-wheel.sh with
# PYTHON=python3.12 on the desk machine) and nvidia-cuda-nvrtc's wheel, whole or in pieces
# (NAME.whl.part-*, joined here and checked against NAME.whl.sha256: the device tool carries at
# most 64 MiB a call, the wheel is 86 MiB). Without network: pip installs from WHEEL_DIR only.
# Steps, logs to $OUT (the device tool's output folder) or ./gpu-test-logs:
# 1. a fresh venv with --system-site-packages (torch, numpy and pytest of the machine), the
#    flashkv wheel and its dependencies installed into it from WHEEL_DIR;
# 2. the toolkit hidden: PATH without CUDA directories, LD_LIBRARY_PATH, CUDA_HOME and CUDA_PATH
#    unset and, where a private mount namespace can be had (root and unshare), an empty tmpfs
#    over every /usr/local/cuda* directory, so neither ld.so.cache nor /usr/local/cuda reaches
#    it (flashkv._C has no RPATH; NVRTC must come from site-packages);
# 3. python/tests from outside the repository against the installed package, GPU tests included
#    (FLASHKV_REQUIRE_GPU=1), after checking that flashkv and NVRTC are the venv's.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WHEELS=$(cd "${1:?usage: scripts/gpu-test-wheel.sh WHEEL_DIR [PYTEST_ARGS...]}" && pwd)
shift
LOGS=$(mkdir -p "${OUT:-gpu-test-logs}" && cd "${OUT:-gpu-test-logs}" && pwd)
PY=${PYTHON:-python3}
WORK=$ROOT/build-wheel/gpu
mkdir -p "$WORK/wheels"
cp "$WHEELS"/*.whl "$WORK/wheels/" 2>/dev/null
for first in "$WHEELS"/*.whl.part-aa; do  # pieces of a wheel: join and check
  [ -e "$first" ] || continue
  whl=$(basename "${first%.part-aa}")
  cat "${first%-aa}"-* >"$WORK/wheels/$whl"
  (cd "$WORK/wheels" && sha256sum -c "$WHEELS/$whl.sha256") || { echo "gpu-test-wheel: $whl pieces do not match"; exit 1; }
done
ls -la "$WORK/wheels" | tee "$LOGS/wheel-install.log"
rm -rf "$WORK/venv"
# An image without ensurepip (Debian's python3 without python3-venv) gets a venv without pip,
# filled by the system's pip (--python, pip >= 22.3).
PIP=("$WORK/venv/bin/python" -m pip)
if ! "$PY" -m venv --system-site-packages "$WORK/venv" >>"$LOGS/wheel-install.log" 2>&1; then
  rm -rf "$WORK/venv"
  "$PY" -m venv --without-pip --system-site-packages "$WORK/venv" || exit 1
  PIP=("$PY" -m pip --python "$WORK/venv/bin/python")
fi
"${PIP[@]}" install --no-index --find-links "$WORK/wheels" \
  "$WORK/wheels"/flashkv-*.whl >>"$LOGS/wheel-install.log" 2>&1 \
  || { tail -n 30 "$LOGS/wheel-install.log"; echo "gpu-test-wheel: pip install FAILED"; exit 1; }
# nvidia-cuda-nvrtc may also come from the machine's site-packages (PyTorch's CUDA wheels depend on
# it): the venv sees them, so pip installs it from WHEEL_DIR only where it is missing.
# PATH without the toolkit's directories.
CLEAN_PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vi cuda | paste -sd: -)
HIDE=()  # each toolkit directory once (/usr/local/cuda is usually a link to /usr/local/cuda-13.0)
for d in /usr/local/cuda*; do [ -d "$d" ] && HIDE+=("$(readlink -f "$d")"); done
mapfile -t HIDE < <(printf '%s\n' "${HIDE[@]}" | grep . | sort -u)
RUNNER=(env -u LD_LIBRARY_PATH -u CUDA_HOME -u CUDA_PATH PATH="$CLEAN_PATH" FLASHKV_REQUIRE_GPU=1)
if [ ${#HIDE[@]} -gt 0 ] && unshare -m true 2>/dev/null; then
  HIDDEN="tmpfs over ${HIDE[*]}"
  RUNNER=(unshare -m sh -c 'for d in $HIDE_DIRS; do mount -t tmpfs none "$d" || exit 1; done; exec "$@"'
          sh "${RUNNER[@]}")
  export HIDE_DIRS="${HIDE[*]}"
else
  HIDDEN="environment scrubbed only (no private mount namespace: ${HIDE[*]:-no /usr/local/cuda*} still on disk)"
fi
echo "toolkit hidden: $HIDDEN" | tee "$LOGS/wheel-env.log"
# From the repository root: python/flashkv is not on sys.path there (python -m pytest adds the
# root, which has no flashkv), so `import flashkv` finds the venv's.
"${RUNNER[@]}" "$WORK/venv/bin/python" - "$WORK/venv" <<'PY' 2>&1 | tee -a "$LOGS/wheel-env.log"
import os, sys
import torch, flashkv
venv = os.path.realpath(sys.argv[1])
print("torch", torch.__version__, "cuda", torch.cuda.is_available())
print("flashkv", os.path.realpath(flashkv.__file__), "\nNVRTC", flashkv.nvrtc_library())
assert os.path.realpath(flashkv.__file__).startswith(venv), "flashkv is not the venv's"
nvrtc = os.path.realpath(flashkv.nvrtc_library())
# pip's folder is site-packages, or dist-packages under Debian's system python
assert any(d in nvrtc for d in ("/site-packages/", "/dist-packages/")), "NVRTC is not a wheel's"
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu-test-wheel: environment check FAILED"; exit 1; }
"${RUNNER[@]}" "$WORK/venv/bin/python" -m pytest -v -p no:cacheprovider -rs \
  --rootdir="$ROOT/python/tests" "${@:-$ROOT/python/tests}" 2>&1 | tee "$LOGS/wheel-tests.log"
status=${PIPESTATUS[0]}
echo "gpu-test-wheel: $([ "$status" -eq 0 ] && echo PASSED || echo FAILED) ($HIDDEN)"
exit "$status"
