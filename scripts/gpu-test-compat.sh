#!/usr/bin/env bash
# Issue 43's GPU checks in one command, on a GPU machine with torch and pytest-xdist:
#   scripts/gpu-test-compat.sh FLASHINFER_DIR [TAG]      (flashkv importable: PYTHONPATH)
# Runs, at once: the new GPU tests (single_* under CUDA graphs and torch.compile
# reduce-overhead, multi-token decode, the workspace API) with the single-op tests they touch,
# and FlashInfer's attention tests from FLASHINFER_DIR against flashkv.compat.flashinfer
# (scripts/flashinfer-tests.sh, CAP parametrizations per function, default 10). Logs and the
# results JSON go to $OUT (or ./gpu-test-logs).
set -uo pipefail
cd "$(dirname "$0")/.."
FI=${1:?usage: gpu-test-compat.sh FLASHINFER_DIR [TAG]}
TAG=${2:-unknown}
LOGS=${OUT:-gpu-test-logs}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 USER=${USER:-ci}
( FLASHKV_REQUIRE_GPU=1 timeout "${GPU_TIMEOUT:-215}" python3 -m pytest -q -p no:cacheprovider \
    -n "${GPU_JOBS:-5}" -rfE --rootdir=python/tests python/tests/test_gpu_single_graphs.py \
    python/tests/test_gpu_multi_token_decode.py python/tests/test_gpu_flashinfer_api.py \
    python/tests/test_gpu_decode.py python/tests/test_gpu_prefill.py \
    python/tests/test_gpu_fp8.py::test_single_decode_and_prefill_fp8 \
    python/tests/test_gpu_fp8.py::test_variant_over_fp8_cache > "$LOGS/gpu-tests.log" 2>&1
  echo "gpu-tests rc=$?" >> "$LOGS/gpu-tests.log" ) &
A=$!
FLASHKV_COMMIT=$(git rev-parse --short HEAD 2>/dev/null) FI_JOBS=${FI_JOBS:-11} FI_TIMEOUT=90 \
  FLASHKV_FI_MAX_PER_FUNCTION=${CAP:-10} timeout "${FI_WALL:-220}" scripts/flashinfer-tests.sh \
  "$FI" "$LOGS/flashinfer-tests.json" "$TAG" > "$LOGS/fi-tests.log" 2>&1
echo "fi-tests rc=$?" >> "$LOGS/fi-tests.log"
wait $A
tail -n 25 "$LOGS/gpu-tests.log"
tail -n 8 "$LOGS/fi-tests.log"
