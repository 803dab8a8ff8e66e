#!/usr/bin/env bash
# flashkv inside transformers on a GPU machine: the model-family checks and the serving benchmark,
# logs and results to $OUT (the device tool's output folder) or ./gpu-serve-logs.
#   scripts/gpu-serve.sh [families] [serve SERVE_ARGS...]      (default: families, then serve)
#   FAMILIES="gemma2 gpt_oss" limits the family checks; FLASHKV_CACHE_DIR may hold precompiled
#   kernels (flashkv precompile --arch sm_90a ... on any machine).
# The flashkv Python module: build312/python/flashkv/_C*.so when it imports (built on another
# machine for this Python), else `pip install .` into build-pip/site (scripts/gpu-test-python.sh's
# way). FlashInfer (the paged|fi comparison): wheels in .whl/ (README "Serving benchmark"), JIT-
# compiled here with nvcc; without them paged|fi is recorded as not run.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${OUT:-gpu-serve-logs}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 FLASHKV_CACHE_DIR=${FLASHKV_CACHE_DIR:-/tmp/flashkv-cache}
export FLASHKV_COMMIT=${FLASHKV_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
PY=${PYTHON:-python3}
SITE=python
if PYTHONPATH=python:build312/python "$PY" -c "import flashkv._C" 2>/dev/null; then
  SITE=python:build312/python
else
  "$PY" -m pip install --no-build-isolation --no-deps --upgrade --target build-pip/site \
    --config-settings=build-dir=build-pip/cmake . >"$LOGS/python-build.log" 2>&1 \
    || { tail -n 30 "$LOGS/python-build.log"; echo "gpu-serve: pip install FAILED"; exit 1; }
  SITE=build-pip/site
fi
if ls .whl/flashinfer_python-*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/fi-site .whl/*.whl && SITE="$SITE:/tmp/fi-site"
  # FlashInfer's JIT: nvcc from the toolkit, Hopper only, caches under /tmp, no downloads.
  nv=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$nv")")")}
  export PATH="$CUDA_HOME/bin:$PATH" FLASHINFER_CUDA_ARCH_LIST="9.0a" MAX_JOBS=16
  export FLASHINFER_WORKSPACE_BASE=/tmp/fi_ws TVM_FFI_CACHE_DIR=/tmp/tvm_ffi_cache
  export FLASHINFER_NO_DOWNLOAD=1
  mkdir -p /tmp/fi_link
  [ -e "$CUDA_HOME/lib64/libcudart.so" ] || ln -sf "$(ls "$CUDA_HOME"/lib*/libcudart.so* | head -1)" /tmp/fi_link/libcudart.so
  [ -e "$CUDA_HOME/lib64/stubs/libcuda.so" ] || ln -sf "$(ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1 2>/dev/null | head -1)" /tmp/fi_link/libcuda.so
  export FLASHINFER_EXTRA_LDFLAGS="-L/tmp/fi_link"
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
status=0
parts=("$@")
[ $# -eq 0 ] && parts=(families serve)
if [ "${parts[0]}" = families ]; then
  # shellcheck disable=SC2086  # FAMILIES: a space-separated subset (default: all)
  "$PY" -m flashkv.integrations.model_families --json "$LOGS/families.json" \
    ${FAMILIES:+--families $FAMILIES} 2>&1 \
    | tee "$LOGS/families.log" || status=1
  parts=("${parts[@]:1}")
fi
if [ "${#parts[@]}" -gt 0 ] && [ "${parts[0]}" = serve ]; then
  "$PY" -m flashkv.bench.serve --json "$LOGS/serve.json" --md "$LOGS/serve.md" "${parts[@]:1}" \
    2>&1 | tee "$LOGS/serve.log" || status=1
fi
echo "gpu-serve: $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status
